// The passes each jit level runs, in order, and the options that shape them.
#pragma once

#include <string>
#include <vector>

#include "xgrad/core/config.hpp"
#include "xgrad/passes/rewrite.hpp"

namespace xgrad::passes {

/// The rewrites O1 and O2 run to a fixed point, by the names JitConfig::disabled_passes uses.
XGRAD_API const std::vector<Pass>& rewrite_passes();

/// What a level does: rewrites to a fixed point, then (O2) fusion once, scheduling and a memory
/// plan for the executor. Fusion runs after the rewrites because they must not look into a
/// Fused node, whose kernel is its body.
struct Pipeline {
  std::vector<Pass> rewrites;
  bool fuse = false;
  bool schedule = false;
  bool plan_memory = false;
};

/// Every pass name: the rewrites, "fuse", "schedule" and "plan_memory".
XGRAD_API std::vector<std::string> pass_names();

/// The pipeline of a level (0, 1, 2) without the passes named in `disabled`.
XGRAD_API Pipeline pipeline(int level, const std::vector<std::string>& disabled);

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

#if !defined(XGRAD_COMPILED)
#include "xgrad/passes/pipeline-inl.hpp"
#endif
