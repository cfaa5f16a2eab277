// Elementwise fusion: chains and trees of elementwise ops of one output shape become one Fused
// node, whose body (a subgraph, printed after the graph) runs block by block
// (backend/cpu/fused.hpp): each input read once, intermediates kept in L1, each value read
// outside the group written once. Broadcast inputs are gathered per block. A group may also
// take in the MatMul making one of its inputs, and then runs as its epilogue (on each block of
// the product as the GEMM finishes it). Reductions over the last axis and the ops on their
// values per row join the group over those rows (a row group: a layer norm, a softmax, in one
// pass over each row). A group reading values another made from one value through a few cheap
// ops recomputes them from it when that moves fewer bytes.
//
// Max pooling's argmax and the forward's take of the maxima (MaxPoolTake(x, MaxPoolArgmax(x)))
// become one MaxPoolWithArgmax node: one pass over x makes both. When only puts of ReLU's
// masked gradient read the argmax, the mask moves into it (drop_nonpositive) and the puts read
// the gradient itself.
//
// An attention and its gradient become a pair sharing each query's log-denominator, which
// the gradient would otherwise work out again (ScaledDotProductAttentionWithLse and
// ScaledDotProductAttentionGradWithLse).
//
// A convolution's gradients whose upstream gradient is such a put (conv -> [ReLU] -> max pool)
// become Conv2DInputGradPooled / Conv2DWeightGradPooled, reading the argmax and the pooled
// gradient: they sum over the pooled elements, not over every output position the put filled
// with zeros (a quarter of the work for 2 x 2 windows), and the put goes. Not under strict: the
// sums run in another order.
//
// Such a block's forward, max pooling 2 x 2 of ReLU(conv [+ bias]) whose argmax carries ReLU's
// mask or is not read, becomes one Conv2DReLUMaxPool node: each image's convolution is pooled
// while in cache, never stored whole, and ReLU runs on the maxima. Exact, so strict too.
//
// A group never becomes a cycle: it stays convex (no outside node on a path between two of its
// nodes). The fused nodes and the rest are then put in an order where every value is made
// before it is read, keeping the original order where it can.
#pragma once

#include "xgrad/core/config.hpp"
#include "xgrad/passes/rewrite.hpp"

namespace xgrad::passes {

/// Elementwise fusion (above). Returns whether it changed the graph.
XGRAD_API bool fuse(ir::Graph& g, const PassContext& ctx);

}  // namespace xgrad::passes

#if !defined(XGRAD_COMPILED)
#include "xgrad/passes/fuse-inl.hpp"
#endif
