// Random numbers as a pure op: random_uniform(key, shape) is a function of the key's value and
// each element's index (a counter-based generator), so the same key gives the same numbers in
// eager mode and in a compiled graph, on any thread split. A layer that needs fresh numbers on
// every call (Dropout) keeps its key in a buffer and advances it in place.
//
// Declarations only: the op's struct and the function's definition are in ops/random-inl.hpp.
#pragma once

#include <cstdint>

#include "xgrad/core/dtype.hpp"
#include "xgrad/core/shape.hpp"
#include "xgrad/core/source_loc.hpp"
#include "xgrad/core/tensor.hpp"

namespace xgrad {

/// Samples of U[0, 1) of `shape`, determined by the int64 scalar `key` alone. They are made on
/// the key's device, or on the default device when the key is a cpu scalar.
template <FloatingPoint T>
Tensor<T> random_uniform(const Tensor<std::int64_t>& key, const Shape& shape, SourceLoc loc = SourceLoc::current());

// The instances xgrad::compiled holds (core/config.hpp).
#define XGRAD_RANDOM_INSTANCE(T, X) X Tensor<T> random_uniform<T>(const Tensor<std::int64_t>&, const Shape&, SourceLoc);
#define XGRAD_RANDOM_INSTANCES(X) XGRAD_FOR_EACH_FloatingPoint(XGRAD_RANDOM_INSTANCE, X)
#if defined(XGRAD_COMPILED) && !defined(XGRAD_INSTANTIATE_RANDOM)
XGRAD_RANDOM_INSTANCES(extern template)
#endif

}  // namespace xgrad

#if !defined(XGRAD_COMPILED)
#include "xgrad/ops/random-inl.hpp"
#endif
