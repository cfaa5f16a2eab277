// Constant folding: a node whose inputs are all constants runs once, now, and becomes a
// constant. It runs the node's own kernel, so the folded value is the one eager mode computes.
#pragma once

#include "xgrad/core/config.hpp"
#include "xgrad/passes/rewrite.hpp"

namespace xgrad::passes {

/// Constant folding (above). Returns whether it changed the graph.
XGRAD_API bool fold(ir::Graph& g, const PassContext& ctx);

}  // namespace xgrad::passes

#if !defined(XGRAD_COMPILED)
#include "xgrad/passes/fold-inl.hpp"
#endif
