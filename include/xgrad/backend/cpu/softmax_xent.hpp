// xgrad CPU backend: softmax cross-entropy of rows of logits against integer class labels, and
// its gradient, each in one pass per row: no softmax, one-hot or log-softmax tensor is made.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "xgrad/backend/cpu/thread_pool.hpp"

namespace xgrad::cpu {

/// One row's shift (its maximum) and the sum of exp(x - shift) over it.
template <class T> struct SoftmaxRow {
  T shift;
  T sum;
};

template <class T> SoftmaxRow<T> softmax_row(const T* x, std::int64_t classes) {
  const T shift = *std::max_element(x, x + classes);
  T sum = 0;
  for (std::int64_t c = 0; c < classes; ++c) sum += std::exp(x[c] - shift);
  return {shift, sum};
}

// Rows per task below which threading does not pay.
inline constexpr std::int64_t k_softmax_xent_grain = 256;

/// loss[i] = log(sum_c exp(x[i, c])) - x[i, labels[i]], computed from the row's maximum so it
/// neither overflows nor underflows. Labels must be in range (the op checks them first).
template <class T> void softmax_xent_forward(const T* logits, const std::int32_t* labels, std::int64_t rows,
                                             std::int64_t classes, T* loss) {
  parallel_for(0, rows, k_softmax_xent_grain, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) {
      const T* x = logits + i * classes;
      const auto [shift, sum] = softmax_row(x, classes);
      loss[i] = std::log(sum) - (x[labels[i]] - shift);
    }
  });
}

/// grad[i, c] = g[i] * (softmax(x[i])[c] - (c == labels[i])): the loss's gradient w.r.t. the
/// logits, scaled per row by the incoming gradient g.
template <class T> void softmax_xent_backward(const T* logits, const std::int32_t* labels, const T* g,
                                              std::int64_t rows, std::int64_t classes, T* grad) {
  parallel_for(0, rows, k_softmax_xent_grain, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) {
      const T* x = logits + i * classes;
      T* out = grad + i * classes;
      // The exponentials go into the output first, so each is computed once (they are the
      // kernel's cost: a row of 10 classes is 10 calls, and the step waits on this kernel).
      const T shift = *std::max_element(x, x + classes);
      T sum = 0;
      for (std::int64_t c = 0; c < classes; ++c) sum += out[c] = std::exp(x[c] - shift);
      const T scale = g[i] / sum;
      for (std::int64_t c = 0; c < classes; ++c) out[c] *= scale;
      out[labels[i]] -= g[i];
    }
  });
}

}  // namespace xgrad::cpu
