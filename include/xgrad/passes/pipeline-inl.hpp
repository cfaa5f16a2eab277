// Definitions of passes/pipeline.hpp: included by it when header-only, compiled once into the
// library (src/passes.cpp) otherwise.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "xgrad/passes/cse.hpp"
#include "xgrad/passes/dce.hpp"
#include "xgrad/passes/fold.hpp"
#include "xgrad/passes/fuse.hpp"
#include "xgrad/passes/layout.hpp"
#include "xgrad/passes/pipeline.hpp"
#include "xgrad/passes/schedule.hpp"
#include "xgrad/passes/simplify.hpp"

namespace xgrad::passes {

XGRAD_API const std::vector<Pass>& rewrite_passes() {
  static const std::vector<Pass> passes{
      {"simplify", simplify}, {"layout", layout}, {"fold", fold}, {"cse", cse}, {"dce", dce}};
  return passes;
}

XGRAD_API std::vector<std::string> pass_names() {
  std::vector<std::string> names;
  for (const Pass& p : rewrite_passes()) names.emplace_back(p.name);
  names.emplace_back("fuse");
  names.emplace_back("schedule");
  names.emplace_back("plan_memory");
  return names;
}

XGRAD_API Pipeline pipeline(int level, const std::vector<std::string>& disabled) {
  const auto names = pass_names();
  for (const auto& name : disabled)
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      std::string known;
      for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
      throw ValueError(
          xgrad::detail::concat("JitConfig::disabled_passes: unknown pass '", name, "' (passes: ", known, ")"));
    }
  auto enabled = [&](std::string_view name) {
    return std::find(disabled.begin(), disabled.end(), name) == disabled.end();
  };
  Pipeline out;
  if (level == 0) return out;
  for (const Pass& p : rewrite_passes())
    if (enabled(p.name)) out.rewrites.push_back(p);
  out.fuse = level >= 2 && enabled("fuse");
  out.schedule = level >= 2 && enabled("schedule");
  out.plan_memory = level >= 2 && enabled("plan_memory");
  return out;
}

}  // namespace xgrad::passes
