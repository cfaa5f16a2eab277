// Device::thrust scaled dot-product attention and its gradient (cpu: backend/cpu/attention.hpp):
// one functor call per query row (or, for the keys' gradients, per key row), each a softmax
// over the keys it sees computed in place, so no score matrix is made here either.
#pragma once

#include <cmath>
#include <cstdint>

#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include "xgrad/backend/attention_geometry.hpp"
#include "xgrad/backend/thrust/memory.hpp"
#include "xgrad/core/device.hpp"

namespace xgrad::thrust_backend {

namespace detail {

template <class T> XGRAD_HD T dot(const T* a, const T* b, std::int64_t n) {
  T sum = 0;
  for (std::int64_t c = 0; c < n; ++c) sum += a[c] * b[c];
  return sum;
}

/// Query row `row` (batch item row / tq): its output when out is given, and the log of its
/// softmax denominator into lse[row] when lse is (0 for a query that sees no key).
template <class T> struct AttentionRowFn {
  cpu::AttentionGeometry g;
  const T *q, *k, *v;
  T *out, *lse;
  XGRAD_HD void operator()(std::int64_t row) const {
    const std::int64_t b = row / g.tq, i = row % g.tq;
    const T* qi = q + row * g.d;
    const T* kb = k + b * g.tk * g.d;
    const T* vb = v ? v + b * g.tk * g.dv : nullptr;
    T* o = out ? out + row * g.dv : nullptr;
    if (o)
      for (std::int64_t c = 0; c < g.dv; ++c) o[c] = T(0);
    // Two passes, the maximum first: each exponential then has the row's final shift, as the
    // cpu's have (a first score of -inf would give an online pass exp(-inf + inf)).
    const std::int64_t end = g.key_end(i);
    const T scale = static_cast<T>(g.scale);
    T shift = 0;
    for (std::int64_t j = 0; j < end; ++j) {
      const T s = scale * dot(qi, kb + j * g.d, g.d);
      shift = j == 0 || s > shift ? s : shift;
    }
    T total = 0;
    for (std::int64_t j = 0; j < end; ++j) {
      const T p = std::exp(scale * dot(qi, kb + j * g.d, g.d) - shift);
      total += p;
      if (o)
        for (std::int64_t c = 0; c < g.dv; ++c) o[c] += p * vb[j * g.dv + c];
    }
    const T inv = total == T(0) ? T(0) : T(1) / total;
    if (o)
      for (std::int64_t c = 0; c < g.dv; ++c) o[c] *= inv;
    if (lse) lse[row] = total == T(0) ? T(0) : shift + std::log(total);
  }
};

/// dot[row] = gy_row . out_row.
template <class T> struct AttentionDotFn {
  std::int64_t dv;
  const T *gy, *out;
  T* dots;
  XGRAD_HD void operator()(std::int64_t row) const { dots[row] = dot(gy + row * dv, out + row * dv, dv); }
};

/// What the gradients' functors read, and the probability and score gradient of a query-key
/// pair: p = exp(scale q.k - lse), ds = p (gy.v - dot).
template <class T> struct AttentionGradParts {
  cpu::AttentionGeometry g;
  const T *q, *k, *v, *gy, *lse, *dots;
  T* grads;
  struct Pair {
    T p, ds;
  };
  /// Query row qrow (b * tq + i) with key row krow (b * tk + j).
  XGRAD_HD Pair pair(std::int64_t qrow, std::int64_t krow) const {
    const T p = std::exp(static_cast<T>(g.scale) * dot(q + qrow * g.d, k + krow * g.d, g.d) - lse[qrow]);
    return {p, p * (dot(gy + qrow * g.dv, v + krow * g.dv, g.dv) - dots[qrow])};
  }
};

/// Query row `row`'s gradient: dq_i = scale sum_j ds_ij k_j.
template <class T> struct AttentionQueryGradFn : AttentionGradParts<T> {
  XGRAD_HD void operator()(std::int64_t row) const {
    const cpu::AttentionGeometry& g = this->g;
    const std::int64_t b = row / g.tq, i = row % g.tq;
    T* dq = this->grads + b * g.grads_size() + i * g.d;
    for (std::int64_t c = 0; c < g.d; ++c) dq[c] = T(0);
    const T scale = static_cast<T>(g.scale);
    for (std::int64_t j = 0; j < g.key_end(i); ++j) {
      const T ds = this->pair(row, b * g.tk + j).ds;
      for (std::int64_t c = 0; c < g.d; ++c) dq[c] += scale * ds * this->k[(b * g.tk + j) * g.d + c];
    }
  }
};

/// Key row `row`'s gradients: dv_j = sum_i p_ij gy_i, dk_j = scale sum_i ds_ij q_i, over the
/// queries that see key j.
template <class T> struct AttentionKeyGradFn : AttentionGradParts<T> {
  XGRAD_HD void operator()(std::int64_t row) const {
    const cpu::AttentionGeometry& g = this->g;
    const std::int64_t b = row / g.tk, j = row % g.tk;
    T* dk = this->grads + b * g.grads_size() + g.tq * g.d + j * g.d;
    T* dv = this->grads + b * g.grads_size() + g.tq * g.d + g.tk * g.d + j * g.dv;
    for (std::int64_t c = 0; c < g.d; ++c) dk[c] = T(0);
    for (std::int64_t c = 0; c < g.dv; ++c) dv[c] = T(0);
    const T scale = static_cast<T>(g.scale);
    for (std::int64_t i = g.query_begin(j); i < g.tq; ++i) {
      const std::int64_t qrow = b * g.tq + i;
      const auto [p, ds] = this->pair(qrow, row);
      for (std::int64_t c = 0; c < g.dv; ++c) dv[c] += p * this->gy[qrow * g.dv + c];
      for (std::int64_t c = 0; c < g.d; ++c) dk[c] += scale * ds * this->q[qrow * g.d + c];
    }
  }
};

}  // namespace detail

/// See cpu::attention_forward.
template <class T> void attention_forward(const cpu::AttentionGeometry& g, const T* q, const T* k, const T* v, T* out) {
  thrust::counting_iterator<std::int64_t> first(0);
  thrust::for_each(thrust::device, first, first + g.batch * g.tq, detail::AttentionRowFn<T>{g, q, k, v, out, nullptr});
}

/// See cpu::attention_backward.
template <class T> void attention_backward(const cpu::AttentionGeometry& g, const T* q, const T* k, const T* v,
                                           const T* out, const T* gy, T* grads) {
  const std::int64_t queries = g.batch * g.tq;
  Scratch<T> lse(static_cast<std::size_t>(queries)), dots(static_cast<std::size_t>(queries));
  thrust::counting_iterator<std::int64_t> first(0);
  thrust::for_each(thrust::device, first, first + queries,
                   detail::AttentionRowFn<T>{g, q, k, nullptr, nullptr, lse.data()});
  thrust::for_each(thrust::device, first, first + queries, detail::AttentionDotFn<T>{g.dv, gy, out, dots.data()});
  thrust::for_each(thrust::device, first, first + queries,
                   detail::AttentionQueryGradFn<T>{{g, q, k, v, gy, lse.data(), dots.data(), grads}});
  thrust::for_each(thrust::device, first, first + g.batch * g.tk,
                   detail::AttentionKeyGradFn<T>{{g, q, k, v, gy, lse.data(), dots.data(), grads}});
}

}  // namespace xgrad::thrust_backend
