// Algebraic simplification: rewrites that remove work without changing what the graph
// computes. Exact rewrites always apply (among them ReLU's gradient moved through max pooling's
// onto the smaller pooled tensor); those that can change a result's bits (x + 0 maps
// -0 to +0; exp(log x), a * b + c as an fma and a sum of k copies as one multiply round
// differently; max pooling's argmax, shared by forward and backward, may pick -0 over +0)
// only without PassContext::strict.
#pragma once

#include "xgrad/core/config.hpp"
#include "xgrad/passes/rewrite.hpp"

namespace xgrad::passes {

/// Algebraic simplification (above). Returns whether it changed the graph.
XGRAD_API bool simplify(ir::Graph& g, const PassContext& ctx);

}  // namespace xgrad::passes

#if !defined(XGRAD_COMPILED)
#include "xgrad/passes/simplify-inl.hpp"
#endif
