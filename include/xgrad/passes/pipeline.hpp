// The passes each jit level runs, in order, and the options that shape them.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "xgrad/passes/cse.hpp"
#include "xgrad/passes/dce.hpp"
#include "xgrad/passes/fold.hpp"
#include "xgrad/passes/fuse.hpp"
#include "xgrad/passes/simplify.hpp"

namespace xgrad::passes {

/// The rewrites O1 and O2 run to a fixed point, by the names JitConfig::disabled_passes uses.
inline const std::vector<Pass>& rewrite_passes() {
  static const std::vector<Pass> passes{{"simplify", simplify}, {"fold", fold}, {"cse", cse}, {"dce", dce}};
  return passes;
}

/// What a level does: rewrites to a fixed point, then (O2) fusion once, then (O2) a memory
/// plan for the executor. Fusion runs last because the rewrites must not look into a Fused
/// node, whose kernel is its body.
struct Pipeline {
  std::vector<Pass> rewrites;
  bool fuse = false;
  bool plan_memory = false;
};

/// Every pass name: the rewrites, "fuse" and "plan_memory".
inline std::vector<std::string> pass_names() {
  std::vector<std::string> names;
  for (const Pass& p : rewrite_passes()) names.emplace_back(p.name);
  names.emplace_back("fuse");
  names.emplace_back("plan_memory");
  return names;
}

/// The pipeline of a level (0, 1, 2) without the passes named in `disabled`.
inline Pipeline pipeline(int level, const std::vector<std::string>& disabled) {
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
  out.plan_memory = level >= 2 && enabled("plan_memory");
  return out;
}

/// Runs `passes` until none changes the graph (at most four rounds), calling `after(pass name)` after each pass that
/// changed something.
template <class After>
void optimize(ir::Graph& g, const std::vector<Pass>& passes, const PassContext& ctx, After&& after) {
  for (int round = 0; round < 4; ++round) {
    bool changed = false;
    for (const Pass& p : passes)
      if (p.run(g, ctx)) {
        renumber(g);
        after(p.name);
        changed = true;
      }
    if (!changed) break;
  }
}

}  // namespace xgrad::passes
