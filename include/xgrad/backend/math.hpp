// The math op bodies call (ops/elementwise.hpp), for xsimd batches and scalars alike: xsimd on
// the host, as the CPU backend has always run them, and CUDA's math in device code, where xsimd
// cannot run (the Thrust backend built by nvcc).
#pragma once

#include <cmath>

#include <xsimd/xsimd.hpp>

#include "xgrad/core/device.hpp"

namespace xgrad::math {

#if defined(__CUDA_ARCH__)
#define XGRAD_MATH_UNARY(fn) \
  template <class V> XGRAD_HD V fn(const V& x) { return std::fn(x); }
#else
#define XGRAD_MATH_UNARY(fn) \
  template <class V> XGRAD_HD V fn(const V& x) { return xsimd::fn(x); }
#endif
XGRAD_MATH_UNARY(exp)
XGRAD_MATH_UNARY(log)
XGRAD_MATH_UNARY(sqrt)
XGRAD_MATH_UNARY(tanh)
XGRAD_MATH_UNARY(sin)
XGRAD_MATH_UNARY(cos)
XGRAD_MATH_UNARY(abs)
#undef XGRAD_MATH_UNARY

template <class V> XGRAD_HD V pow(const V& a, const V& b) {
#if defined(__CUDA_ARCH__)
  return std::pow(a, b);
#else
  return xsimd::pow(a, b);
#endif
}

// In device code, the comparisons xsimd's scalar max and min make (so NaN is handled alike).
template <class V> XGRAD_HD V max(const V& a, const V& b) {
#if defined(__CUDA_ARCH__)
  return a < b ? b : a;
#else
  return xsimd::max(a, b);
#endif
}

template <class V> XGRAD_HD V min(const V& a, const V& b) {
#if defined(__CUDA_ARCH__)
  return a > b ? b : a;
#else
  return xsimd::min(a, b);
#endif
}

}  // namespace xgrad::math
