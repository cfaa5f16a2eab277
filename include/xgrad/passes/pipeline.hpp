// The passes each jit level runs, in order, and the options that shape them.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "xgrad/passes/cse.hpp"
#include "xgrad/passes/dce.hpp"
#include "xgrad/passes/fold.hpp"
#include "xgrad/passes/simplify.hpp"

namespace xgrad::passes {

/// Every pass, by the name JitConfig::disabled_passes uses.
inline const std::vector<Pass>& all_passes() {
  static const std::vector<Pass> passes{{"simplify", simplify}, {"fold", fold}, {"cse", cse}, {"dce", dce}};
  return passes;
}

/// The passes of a level: O0 none; O1 and O2 simplification, folding, CSE and DCE.
inline std::vector<Pass> pipeline(int level, const std::vector<std::string>& disabled) {
  for (const auto& name : disabled)
    if (std::none_of(all_passes().begin(), all_passes().end(), [&](const Pass& p) { return p.name == name; })) {
      std::string known;
      for (const Pass& p : all_passes()) known += (known.empty() ? "" : ", ") + std::string(p.name);
      throw ValueError(
          xgrad::detail::concat("JitConfig::disabled_passes: unknown pass '", name, "' (passes: ", known, ")"));
    }
  std::vector<Pass> out;
  if (level == 0) return out;
  for (const Pass& p : all_passes())
    if (std::find(disabled.begin(), disabled.end(), p.name) == disabled.end()) out.push_back(p);
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
