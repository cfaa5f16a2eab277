// Device::thrust softmax cross-entropy and its gradient (cpu: backend/cpu/softmax_xent.hpp):
// one functor call per row, with the same arithmetic as the cpu kernels.
#pragma once

#include <cmath>
#include <cstdint>

#include <thrust/device_ptr.h>
#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform.h>

#include "xgrad/core/device.hpp"

namespace xgrad::thrust_backend {

namespace detail {

/// A row's maximum and the sum of exp(x - maximum) over it (cpu::softmax_row).
template <class T> struct RowStats { T shift, sum; };
template <class T> XGRAD_HD RowStats<T> row_stats(const T* x, std::int64_t classes) {
  T shift = x[0];
  for (std::int64_t c = 1; c < classes; ++c) shift = x[c] > shift ? x[c] : shift;
  T sum = 0;
  for (std::int64_t c = 0; c < classes; ++c) sum += std::exp(x[c] - shift);
  return {shift, sum};
}

template <class T> struct XentForwardFn {
  const T* logits;
  const std::int32_t* labels;
  std::int64_t classes;
  XGRAD_HD T operator()(std::int64_t i) const {
    const T* x = logits + i * classes;
    const RowStats<T> s = row_stats(x, classes);
    return std::log(s.sum) - (x[labels[i]] - s.shift);
  }
};

template <class T> struct XentBackwardFn {
  const T* logits;
  const std::int32_t* labels;
  const T* g;
  std::int64_t classes;
  T* grad;
  XGRAD_HD void operator()(std::int64_t i) const {
    const T* x = logits + i * classes;
    T* out = grad + i * classes;
    const RowStats<T> s = row_stats(x, classes);
    const T scale = g[i] / s.sum;
    for (std::int64_t c = 0; c < classes; ++c) out[c] = std::exp(x[c] - s.shift) * scale;
    out[labels[i]] -= g[i];
  }
};

}  // namespace detail

/// See cpu::softmax_xent_forward; labels must be in range.
template <class T> void softmax_xent_forward(const T* logits, const std::int32_t* labels, std::int64_t rows,
                                             std::int64_t classes, T* loss) {
  thrust::counting_iterator<std::int64_t> first(0);
  thrust::transform(thrust::device, first, first + rows, thrust::device_ptr<T>(loss),
                    detail::XentForwardFn<T>{logits, labels, classes});
}

/// See cpu::softmax_xent_backward.
template <class T> void softmax_xent_backward(const T* logits, const std::int32_t* labels, const T* g,
                                              std::int64_t rows, std::int64_t classes, T* grad) {
  thrust::counting_iterator<std::int64_t> first(0);
  thrust::for_each(thrust::device, first, first + rows, detail::XentBackwardFn<T>{logits, labels, g, classes, grad});
}

}  // namespace xgrad::thrust_backend
