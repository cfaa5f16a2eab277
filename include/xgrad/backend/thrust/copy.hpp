// Device::thrust data movement and reductions: the Thrust forms of backend/cpu/copy.hpp and
// backend/cpu/reduce.hpp, each one thrust::transform (or reduce) over output indices, a
// reduction over long segments in two passes.
#pragma once

#include <algorithm>
#include <cstdint>

#include <thrust/device_ptr.h>
#include <thrust/execution_policy.h>
#include <thrust/fill.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/reduce.h>
#include <thrust/tabulate.h>
#include <thrust/transform.h>

#include "xgrad/backend/cpu/copy.hpp"
#include "xgrad/backend/math.hpp"
#include "xgrad/backend/thrust/memory.hpp"

namespace xgrad::thrust_backend {

namespace detail {

inline thrust::counting_iterator<std::int64_t> indices(std::int64_t from = 0) {
  return thrust::counting_iterator<std::int64_t>(from);
}

template <class T> struct StridedCopyFn {
  Shape shape;
  const T* src;
  cpu::Strides src_strides;
  T* dst;
  cpu::Strides dst_strides;
  XGRAD_HD void operator()(std::int64_t i) const {
    std::int64_t so = 0, dof = 0;
    for (int k = shape.ndim() - 1; k >= 0; --k) {
      const std::int64_t idx = i % shape[k];
      i /= shape[k];
      so += idx * src_strides[k];
      dof += idx * dst_strides[k];
    }
    dst[dof] = src[so];
  }
};

template <class R, class T> struct ReduceFn {
  const T* x;
  std::int64_t reduced, inner;
  XGRAD_HD T operator()(std::int64_t k) const {  // output k of [outer, inner]
    const T* src = x + (k / inner) * reduced * inner + k % inner;
    T acc = R::template identity<T>();
    for (std::int64_t r = 0; r < reduced; ++r) acc = R::combine(acc, src[r * inner]);
    return acc;
  }
};

/// Partial c of output k (i = k * chunks + c): the R-combination of the chunk's stretch of the
/// reduced axis.
template <class R, class T> struct PartialReduceFn {
  const T* x;
  std::int64_t reduced, inner, chunks, chunk_len;
  XGRAD_HD T operator()(std::int64_t i) const {
    const std::int64_t k = i / chunks, lo = i % chunks * chunk_len,
                       hi = lo + chunk_len < reduced ? lo + chunk_len : reduced;
    const T* src = x + (k / inner) * reduced * inner + k % inner;
    T acc = R::template identity<T>();
    for (std::int64_t r = lo; r < hi; ++r) acc = R::combine(acc, src[r * inner]);
    return acc;
  }
};

template <class R> struct CombineFn {
  template <class T> XGRAD_HD T operator()(const T& a, const T& b) const { return R::combine(a, b); }
};

template <class T, class I> struct ArgmaxFn {
  const T* x;
  std::int64_t reduced, inner;
  XGRAD_HD I operator()(std::int64_t k) const {  // the first largest; NaN counts as largest (cpu::argmax)
    const T* src = x + (k / inner) * reduced * inner + k % inner;
    std::int64_t best = 0;
    for (std::int64_t r = 1; r < reduced; ++r) {
      const T v = src[r * inner], b = src[best * inner];
      if (v > b || (v != v && b == b)) best = r;
    }
    return static_cast<I>(best);
  }
};

template <class U, class T> struct CastFn {
  XGRAD_HD U operator()(const T& v) const { return math::convert<U>(v); }  // as the cpu's (kernels::cast)
};

}  // namespace detail

/// dst[i * dst_strides] = src[i * src_strides] for every index i of `shape` (cpu::strided_copy).
template <class T> void strided_copy(const Shape& shape, const T* src, const cpu::Strides& src_strides, T* dst,
                                     const cpu::Strides& dst_strides) {
  thrust::for_each(thrust::device, detail::indices(), detail::indices(shape.numel()),
                   detail::StridedCopyFn<T>{shape, src, src_strides, dst, dst_strides});
}

/// f(i) for i < n, in parallel; f is a host-and-device functor (XGRAD_HD).
template <class F> void for_each_index(std::int64_t n, F f) {
  thrust::for_each(thrust::device, detail::indices(), detail::indices(n), f);
}

/// dst[i] = f(i) for i < n; f is a host-and-device functor (XGRAD_HD).
template <class T, class F> void tabulate(T* dst, std::int64_t n, F f) {
  thrust::tabulate(thrust::device, thrust::device_ptr<T>(dst), thrust::device_ptr<T>(dst) + n, f);
}

template <class T> void fill(T* dst, std::int64_t n, T value) {
  thrust::fill_n(thrust::device, thrust::device_ptr<T>(dst), n, value);
}

template <class U, class T> void cast(const T* src, U* dst, std::int64_t n) {
  thrust::transform(thrust::device, thrust::device_ptr<const T>(src), thrust::device_ptr<const T>(src) + n,
                    thrust::device_ptr<U>(dst), detail::CastFn<U, T>{});
}

/// y[o, j] = R-combination of x[o, r, j] over r (cpu::reduce). One output: a parallel reduce.
/// Outputs too few to keep the device busy, over long segments: each segment is cut into chunks
/// reduced in parallel, then each output combines its chunks' partial results.
template <class R, class T>
void reduce(const T* x, T* y, std::int64_t outer, std::int64_t reduced, std::int64_t inner) {
  const std::int64_t outputs = outer * inner;
  if (outputs == 1) {
    const T value =
        thrust::reduce(thrust::device, thrust::device_ptr<const T>(x), thrust::device_ptr<const T>(x) + reduced,
                       R::template identity<T>(), detail::CombineFn<R>{});
    fill(y, 1, value);
    return;
  }
  constexpr std::int64_t kBusy = std::int64_t{1} << 14, kMinChunk = 64;  // parallel tasks wanted; chunk length
  if (outputs < kBusy && reduced >= 2 * kMinChunk) {
    const std::int64_t wanted = std::min((reduced + kMinChunk - 1) / kMinChunk, (kBusy + outputs - 1) / outputs);
    const std::int64_t chunk_len = (reduced + wanted - 1) / wanted, chunks = (reduced + chunk_len - 1) / chunk_len;
    Scratch<T> partial(static_cast<std::size_t>(outputs * chunks));
    thrust::transform(thrust::device, detail::indices(), detail::indices(outputs * chunks),
                      thrust::device_ptr<T>(partial.data()),
                      detail::PartialReduceFn<R, T>{x, reduced, inner, chunks, chunk_len});
    thrust::transform(thrust::device, detail::indices(), detail::indices(outputs), thrust::device_ptr<T>(y),
                      detail::ReduceFn<R, T>{partial.data(), chunks, 1});
    return;
  }
  thrust::transform(thrust::device, detail::indices(), detail::indices(outputs), thrust::device_ptr<T>(y),
                    detail::ReduceFn<R, T>{x, reduced, inner});
}

/// y[o, j] = index r of the largest x[o, r, j] (cpu::argmax).
template <class T, class I>
void argmax(const T* x, I* y, std::int64_t outer, std::int64_t reduced, std::int64_t inner) {
  thrust::transform(thrust::device, detail::indices(), detail::indices(outer * inner), thrust::device_ptr<I>(y),
                    detail::ArgmaxFn<T, I>{x, reduced, inner});
}

}  // namespace xgrad::thrust_backend
