// Reductions: sum, mean, max, min over any axes (keepdims or not), argmax, sum_to, and the running
// sum cumsum.
// Declarations only: the ops' structs and the functions' definitions are in ops/reduce-inl.hpp.
#pragma once

#include <cstdint>
#include <vector>

#include "xgrad/core/dtype.hpp"
#include "xgrad/core/shape.hpp"
#include "xgrad/core/source_loc.hpp"
#include "xgrad/core/tensor.hpp"

namespace xgrad {

/// Sums x over its broadcast axes so that it takes `shape` (the adjoint of broadcast_to).
template <Numeric T> Tensor<T> sum_to(const Tensor<T>& x, const Shape& shape, SourceLoc loc = SourceLoc::current());

/// Sum over `axes` (all axes when empty).
template <Numeric T> Tensor<T> sum(const Tensor<T>& x, const std::vector<std::int64_t>& axes = {},
                                   bool keepdims = false, SourceLoc loc = SourceLoc::current());

/// Mean over `axes` (all axes when empty).
template <FloatingPoint T> Tensor<T> mean(const Tensor<T>& x, const std::vector<std::int64_t>& axes = {},
                                          bool keepdims = false, SourceLoc loc = SourceLoc::current());

/// Largest element over `axes` (all axes when empty).
template <Numeric T> Tensor<T> max(const Tensor<T>& x, const std::vector<std::int64_t>& axes = {},
                                   bool keepdims = false, SourceLoc loc = SourceLoc::current());

/// Smallest element over `axes` (all axes when empty).
template <Numeric T> Tensor<T> min(const Tensor<T>& x, const std::vector<std::int64_t>& axes = {},
                                   bool keepdims = false, SourceLoc loc = SourceLoc::current());

/// Index of the largest element along `axis` (the first on ties), as int32 like labels.
template <Numeric T> Tensor<std::int32_t> argmax(const Tensor<T>& x, std::int64_t axis = -1, bool keepdims = false,
                                                 SourceLoc loc = SourceLoc::current());

/// Running sum along `axis`: out[..., k, ...] = x[..., 0, ...] + ... + x[..., k, ...] (NumPy's
/// cumsum along an axis); with `reverse`, x[..., k, ...] + ... + x[..., n - 1, ...].
template <Numeric T>
Tensor<T> cumsum(const Tensor<T>& x, std::int64_t axis, bool reverse = false, SourceLoc loc = SourceLoc::current());

// The instances xgrad::compiled holds (core/config.hpp).
#define XGRAD_REDUCE_NUMERIC_INSTANCE(T, X)                                                \
  X Tensor<T> sum_to<T>(const Tensor<T>&, const Shape&, SourceLoc);                        \
  X Tensor<T> sum<T>(const Tensor<T>&, const std::vector<std::int64_t>&, bool, SourceLoc); \
  X Tensor<T> max<T>(const Tensor<T>&, const std::vector<std::int64_t>&, bool, SourceLoc); \
  X Tensor<T> min<T>(const Tensor<T>&, const std::vector<std::int64_t>&, bool, SourceLoc); \
  X Tensor<std::int32_t> argmax<T>(const Tensor<T>&, std::int64_t, bool, SourceLoc);       \
  X Tensor<T> cumsum<T>(const Tensor<T>&, std::int64_t, bool, SourceLoc);
#define XGRAD_REDUCE_FLOAT_INSTANCE(T, X) \
  X Tensor<T> mean<T>(const Tensor<T>&, const std::vector<std::int64_t>&, bool, SourceLoc);
#define XGRAD_REDUCE_INSTANCES(X) \
  XGRAD_FOR_EACH_Numeric(XGRAD_REDUCE_NUMERIC_INSTANCE, X) XGRAD_FOR_EACH_FloatingPoint(XGRAD_REDUCE_FLOAT_INSTANCE, X)
#if defined(XGRAD_COMPILED) && !defined(XGRAD_INSTANTIATE_REDUCE)
XGRAD_REDUCE_INSTANCES(extern template)
#endif

}  // namespace xgrad

#if !defined(XGRAD_COMPILED)
#include "xgrad/ops/reduce-inl.hpp"
#endif
