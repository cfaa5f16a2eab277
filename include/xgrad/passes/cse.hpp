// Common subexpression elimination: of nodes that compute the same thing from the same
// inputs (equal primitives, parameters included, and output types), the first is kept.
#pragma once

#include "xgrad/core/config.hpp"
#include "xgrad/passes/rewrite.hpp"

namespace xgrad::passes {

/// Common subexpression elimination (above). Returns whether it changed the graph.
XGRAD_API bool cse(ir::Graph& g, const PassContext& ctx);

}  // namespace xgrad::passes

#if !defined(XGRAD_COMPILED)
#include "xgrad/passes/cse-inl.hpp"
#endif
