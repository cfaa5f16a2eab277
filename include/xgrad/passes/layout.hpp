// Layout folding: copies that only rearrange an op's operands become the op's own way of
// reading them. MultiheadAttention splits its projection into heads (slice, reshape,
// transpose) and merges the heads back (transpose, reshape): in the graph, attention and its
// gradient read and write the projection's columns directly (AttentionGeometry's heads layout),
// and the copies, left unread, are removed by DCE; simplify then cancels what the gradient's
// copies become.
#pragma once

#include "xgrad/core/config.hpp"
#include "xgrad/passes/rewrite.hpp"

namespace xgrad::passes {

/// Layout folding (above). Returns whether it changed the graph.
XGRAD_API bool layout(ir::Graph& g, const PassContext& ctx);

}  // namespace xgrad::passes

#if !defined(XGRAD_COMPILED)
#include "xgrad/passes/layout-inl.hpp"
#endif
