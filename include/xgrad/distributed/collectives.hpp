// Collectives as ops: they run eagerly, are traced into graphs as nodes (kept in program order:
// every rank must run the same collectives in the same order), and have gradient rules, so a
// loss computed from all ranks' tensors differentiates like any other. On Device::thrust the
// elements go through the host. Declarations only: the definitions are in
// distributed/collectives-inl.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

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

/// Each collective in two halves, so that work between them overlaps the exchange (data-parallel
/// training starts each gradient bucket's all_reduce as the backward pass finishes it). A
/// `_start` form checks and sends what the collective above does and returns the tensor the
/// result is being written into; pass it, untouched, to wait(), which returns the result once it
/// is there. Every start is waited for; collectives issued in between run after it, in order.
/// On Device::thrust the exchange happens at the start. Not differentiable.
template <Numeric T>
Tensor<T> all_reduce_start(const Tensor<T>& x, ReduceOp reduce = ReduceOp::sum, SourceLoc loc = SourceLoc::current());
template <Element T> Tensor<T> all_gather_start(const Tensor<T>& x, SourceLoc loc = SourceLoc::current());
template <Numeric T> Tensor<T> reduce_scatter_start(const Tensor<T>& x, ReduceOp reduce = ReduceOp::sum,
                                                    SourceLoc loc = SourceLoc::current());
template <Element T> Tensor<T> broadcast_start(const Tensor<T>& x, int root = 0, SourceLoc loc = SourceLoc::current());
/// The result of the collective started into `started`.
template <Element T> Tensor<T> wait(const Tensor<T>& started, SourceLoc loc = SourceLoc::current());

/// all_reduce of many tensors (a model's gradients) in few messages: they are packed, from the
/// last to the first, into flat buckets of at most `bucket_bytes` (a tensor larger than that is
/// a bucket of its own), one all_reduce per bucket. The last tensors go first because a
/// backward pass makes the last layers' gradients first. Every rank must pass the same shapes.
template <FloatingPoint T>
std::vector<Tensor<T>> all_reduce_bucketed(const std::vector<Tensor<T>>& xs, ReduceOp reduce = ReduceOp::sum,
                                           std::int64_t bucket_bytes = std::int64_t{25} << 20,
                                           SourceLoc loc = SourceLoc::current());

/// Writes rank `root`'s elements into every rank's `t`, in place, any dtype and device: not an
/// op (no gradient; not inside jit), for state such as a model's parameters when data-parallel
/// training starts.
XGRAD_API void broadcast_into(const TensorBase& t, int root = 0, SourceLoc loc = SourceLoc::current());

/// The mean over the ranks of a model's gradients, reduced while the backward pass runs
/// (ModelOptions::data_parallel): ready(i, g) takes parameter i's gradient as the pass finishes
/// it (value_and_grad's on_gradient); when a bucket of all_reduce_bucketed's is complete and the
/// buckets before it have started, its all_reduce starts (all_reduce_start) and runs beside the
/// rest of the pass. finish() waits for every bucket and returns the means, one per parameter.
class GradientMean {
 public:
  XGRAD_API GradientMean(const std::vector<Shape>& shapes, std::int64_t bucket_bytes, SourceLoc loc);
  XGRAD_API void ready(std::size_t i, const Tensor<float>& grad);
  XGRAD_API std::vector<Tensor<float>> finish();

 private:
  XGRAD_API void start_complete_buckets();

  std::vector<Shape> m_shapes;
  std::vector<std::pair<std::size_t, std::size_t>> m_buckets;  // [begin, end) of the parameters, last first
  std::vector<std::size_t> m_bucket_of;                        // per parameter
  std::vector<std::size_t> m_missing;                          // per bucket: gradients not yet ready
  std::vector<Tensor<float>> m_grads, m_started;
  std::size_t m_next = 0;  // the first bucket not started
  SourceLoc m_loc;
};

namespace detail {
/// all_reduce_bucketed's buckets for tensors of these sizes in bytes: [begin, end) ranges,
/// packed from the last tensor to the first, at most `bucket_bytes` each unless one tensor is
/// larger.
XGRAD_API std::vector<std::pair<std::size_t, std::size_t>> bucket_ranges(const std::vector<std::int64_t>& bytes,
                                                                         std::int64_t bucket_bytes);
}  // namespace detail

// The instances xgrad::compiled holds (core/config.hpp).
#define XGRAD_COLLECTIVES_NUMERIC_INSTANCE(T, X)                          \
  X Tensor<T> all_reduce<T>(const Tensor<T>&, ReduceOp, SourceLoc);       \
  X Tensor<T> reduce_scatter<T>(const Tensor<T>&, ReduceOp, SourceLoc);   \
  X Tensor<T> all_reduce_start<T>(const Tensor<T>&, ReduceOp, SourceLoc); \
  X Tensor<T> reduce_scatter_start<T>(const Tensor<T>&, ReduceOp, SourceLoc);
#define XGRAD_COLLECTIVES_ELEMENT_INSTANCE(T, X)                    \
  X Tensor<T> all_gather<T>(const Tensor<T>&, SourceLoc);           \
  X Tensor<T> broadcast<T>(const Tensor<T>&, int, SourceLoc);       \
  X Tensor<T> all_gather_start<T>(const Tensor<T>&, SourceLoc);     \
  X Tensor<T> broadcast_start<T>(const Tensor<T>&, int, SourceLoc); \
  X Tensor<T> wait<T>(const Tensor<T>&, SourceLoc);
#define XGRAD_COLLECTIVES_FLOAT_INSTANCE(T, X) \
  X std::vector<Tensor<T>> all_reduce_bucketed<T>(const std::vector<Tensor<T>>&, ReduceOp, std::int64_t, SourceLoc);
#define XGRAD_COLLECTIVES_INSTANCES(X)                                                  \
  XGRAD_FOR_EACH_Numeric(XGRAD_COLLECTIVES_NUMERIC_INSTANCE, X) XGRAD_FOR_EACH_Element( \
      XGRAD_COLLECTIVES_ELEMENT_INSTANCE, X) XGRAD_FOR_EACH_FloatingPoint(XGRAD_COLLECTIVES_FLOAT_INSTANCE, X)
#if defined(XGRAD_COMPILED) && !defined(XGRAD_INSTANTIATE_COLLECTIVES)
XGRAD_COLLECTIVES_INSTANCES(extern template)
#endif

}  // namespace xgrad::distributed

#if !defined(XGRAD_COMPILED)
#include "xgrad/distributed/collectives-inl.hpp"
#endif
