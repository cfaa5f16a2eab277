// Collectives as ops: they run eagerly, are traced into graphs as nodes (kept in program order:
// every rank must run the same collectives in the same order), and have gradient rules, so a
// loss computed from all ranks' tensors differentiates like any other. On Device::thrust the
// elements go through the host. Declarations only: the definitions are in
// distributed/collectives-inl.hpp.
#pragma once

#include "xgrad/core/dtype.hpp"
#include "xgrad/core/source_loc.hpp"
#include "xgrad/core/tensor.hpp"
#include "xgrad/distributed/process_group.hpp"

namespace xgrad::distributed {

/// Every rank's x combined elementwise by `reduce`: the same result, bit for bit, on every
/// rank. mean is for floating-point tensors; max and min propagate NaN. The gradient of sum
/// is the sum of the ranks' gradients; max and min share it among the ranks that hold the
/// extreme.
template <Numeric T>
Tensor<T> all_reduce(const Tensor<T>& x, ReduceOp reduce = ReduceOp::sum, SourceLoc loc = SourceLoc::current());

/// The ranks' x stacked along a new leading axis: [world_size(), ...x.shape()], rank r's at
/// index r. Every rank passes the same shape.
template <Element T> Tensor<T> all_gather(const Tensor<T>& x, SourceLoc loc = SourceLoc::current());

/// x of shape [world_size(), ...]: slice x[rank()] combined over the ranks by `reduce`, of
/// shape [...]. all_gather's gradient, and the other way round.
template <Numeric T>
Tensor<T> reduce_scatter(const Tensor<T>& x, ReduceOp reduce = ReduceOp::sum, SourceLoc loc = SourceLoc::current());

/// Rank `root`'s x on every rank (the others' x gives the shape and dtype, which must match).
/// The gradient reaches root's x only: the sum of the ranks' gradients.
template <Element T> Tensor<T> broadcast(const Tensor<T>& x, int root = 0, SourceLoc loc = SourceLoc::current());

// The instances xgrad::compiled holds (core/config.hpp).
#define XGRAD_COLLECTIVES_NUMERIC_INSTANCE(T, X)                    \
  X Tensor<T> all_reduce<T>(const Tensor<T>&, ReduceOp, SourceLoc); \
  X Tensor<T> reduce_scatter<T>(const Tensor<T>&, ReduceOp, SourceLoc);
#define XGRAD_COLLECTIVES_ELEMENT_INSTANCE(T, X)          \
  X Tensor<T> all_gather<T>(const Tensor<T>&, SourceLoc); \
  X Tensor<T> broadcast<T>(const Tensor<T>&, int, SourceLoc);
#define XGRAD_COLLECTIVES_INSTANCES(X)                          \
  XGRAD_FOR_EACH_Numeric(XGRAD_COLLECTIVES_NUMERIC_INSTANCE, X) \
      XGRAD_FOR_EACH_Element(XGRAD_COLLECTIVES_ELEMENT_INSTANCE, X)
#if defined(XGRAD_COMPILED) && !defined(XGRAD_INSTANTIATE_COLLECTIVES)
XGRAD_COLLECTIVES_INSTANCES(extern template)
#endif

}  // namespace xgrad::distributed

#if !defined(XGRAD_COMPILED)
#include "xgrad/distributed/collectives-inl.hpp"
#endif
