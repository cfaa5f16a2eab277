// Device::thrust scaled dot-product attention and its gradient (cpu: backend/cpu/attention.hpp):
// one functor call per query row (or, for the keys' gradients, per key row), each a softmax
// over the keys it sees computed in place, so no score matrix is made here either.
#pragma once

#include <cmath>
#include <cstdint>

#include <thrust/execution_policy.h>
#include <thrust/fill.h>
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

/// Where query row qrow (item qrow / tq, query qrow % tq) and key row krow (item krow / tk)
/// of each operand lie, laid out as g says.
struct AttentionRowsAt {
  cpu::AttentionGeometry g;
  XGRAD_HD std::int64_t q(std::int64_t qrow) const { return at(g.q_rows(qrow / g.tq), qrow % g.tq); }
  XGRAD_HD std::int64_t out(std::int64_t qrow) const { return at(g.out_rows(qrow / g.tq), qrow % g.tq); }
  XGRAD_HD std::int64_t dq(std::int64_t qrow) const { return at(g.dq_rows(qrow / g.tq), qrow % g.tq); }
  XGRAD_HD std::int64_t k(std::int64_t krow) const { return at(g.k_rows(krow / g.tk), krow % g.tk); }
  XGRAD_HD std::int64_t v(std::int64_t krow) const { return at(g.v_rows(krow / g.tk), krow % g.tk); }
  XGRAD_HD std::int64_t dk(std::int64_t krow) const { return at(g.dk_rows(krow / g.tk), krow % g.tk); }
  XGRAD_HD std::int64_t dv(std::int64_t krow) const { return at(g.dv_rows(krow / g.tk), krow % g.tk); }

 private:
  XGRAD_HD static std::int64_t at(cpu::AttentionGeometry::Rows rows, std::int64_t i) {
    return rows.start + i * rows.stride;
  }
};

/// Query row `row` (batch item row / tq): its output when out is given, and the log of its
/// softmax denominator into lse[row] when lse is (0 for a query that sees no key).
template <class T> struct AttentionRowFn {
  AttentionRowsAt at;
  const T *q, *k, *v;
  T *out, *lse;
  XGRAD_HD void operator()(std::int64_t row) const {
    const cpu::AttentionGeometry& g = at.g;
    const std::int64_t first_key = row / g.tq * g.tk, i = row % g.tq;
    const T* qi = q + at.q(row);
    T* o = out ? out + at.out(row) : nullptr;
    if (o)
      for (std::int64_t c = 0; c < g.dv; ++c) o[c] = T(0);
    // Two passes, the maximum first: each exponential then has the row's final shift, as the
    // cpu's have (a first score of -inf would give an online pass exp(-inf + inf)).
    const std::int64_t end = g.key_end(i);
    const T scale = static_cast<T>(g.scale);
    T shift = 0;
    for (std::int64_t j = 0; j < end; ++j) {
      const T s = scale * dot(qi, k + at.k(first_key + j), g.d);
      shift = j == 0 || s > shift ? s : shift;
    }
    T total = 0;
    for (std::int64_t j = 0; j < end; ++j) {
      const T p = std::exp(scale * dot(qi, k + at.k(first_key + j), g.d) - shift);
      total += p;
      if (o) {
        const T* vj = v + at.v(first_key + j);
        for (std::int64_t c = 0; c < g.dv; ++c) o[c] += p * vj[c];
      }
    }
    const T inv = total == T(0) ? T(0) : T(1) / total;
    if (o)
      for (std::int64_t c = 0; c < g.dv; ++c) o[c] *= inv;
    if (lse) lse[row] = total == T(0) ? T(0) : shift + std::log(total);
  }
};

/// dot[row] = gy_row . out_row.
template <class T> struct AttentionDotFn {
  AttentionRowsAt at;
  const T *gy, *out;
  T* dots;
  XGRAD_HD void operator()(std::int64_t row) const { dots[row] = dot(gy + at.out(row), out + at.out(row), at.g.dv); }
};

/// What the gradients' functors read, and the probability and score gradient of a query-key
/// pair: p = exp(scale q.k - lse), ds = p (gy.v - dot).
template <class T> struct AttentionGradParts {
  AttentionRowsAt at;
  const T *q, *k, *v, *gy, *lse, *dots;
  T* grads;
  struct Pair {
    T p, ds;
  };
  /// Query row qrow (n * tq + i) with key row krow (n * tk + j).
  XGRAD_HD Pair pair(std::int64_t qrow, std::int64_t krow) const {
    const cpu::AttentionGeometry& g = at.g;
    const T p = std::exp(static_cast<T>(g.scale) * dot(q + at.q(qrow), k + at.k(krow), g.d) - lse[qrow]);
    return {p, p * (dot(gy + at.out(qrow), v + at.v(krow), g.dv) - dots[qrow])};
  }
};

/// Query row `row`'s gradient: dq_i = scale sum_j ds_ij k_j.
template <class T> struct AttentionQueryGradFn : AttentionGradParts<T> {
  XGRAD_HD void operator()(std::int64_t row) const {
    const cpu::AttentionGeometry& g = this->at.g;
    const std::int64_t first_key = row / g.tq * g.tk, i = row % g.tq;
    T* dq = this->grads + this->at.dq(row);
    for (std::int64_t c = 0; c < g.d; ++c) dq[c] = T(0);
    const T scale = static_cast<T>(g.scale);
    for (std::int64_t j = 0; j < g.key_end(i); ++j) {
      const T ds = this->pair(row, first_key + j).ds;
      const T* kj = this->k + this->at.k(first_key + j);
      for (std::int64_t c = 0; c < g.d; ++c) dq[c] += scale * ds * kj[c];
    }
  }
};

/// Key row `row`'s gradients: dv_j = sum_i p_ij gy_i, dk_j = scale sum_i ds_ij q_i, over the
/// queries that see key j.
template <class T> struct AttentionKeyGradFn : AttentionGradParts<T> {
  XGRAD_HD void operator()(std::int64_t row) const {
    const cpu::AttentionGeometry& g = this->at.g;
    const std::int64_t first_query = row / g.tk * g.tq, j = row % g.tk;
    T* dk = this->grads + this->at.dk(row);
    T* dv = this->grads + this->at.dv(row);
    for (std::int64_t c = 0; c < g.d; ++c) dk[c] = T(0);
    for (std::int64_t c = 0; c < g.dv; ++c) dv[c] = T(0);
    const T scale = static_cast<T>(g.scale);
    for (std::int64_t i = g.query_begin(j); i < g.tq; ++i) {
      const std::int64_t qrow = first_query + i;
      const auto [p, ds] = this->pair(qrow, row);
      const T* gyi = this->gy + this->at.out(qrow);
      const T* qi = this->q + this->at.q(qrow);
      for (std::int64_t c = 0; c < g.dv; ++c) dv[c] += p * gyi[c];
      for (std::int64_t c = 0; c < g.d; ++c) dk[c] += scale * ds * qi[c];
    }
  }
};

}  // namespace detail

/// See cpu::attention_forward.
template <class T> void attention_forward(const cpu::AttentionGeometry& g, const T* q, const T* k, const T* v, T* out) {
  thrust::counting_iterator<std::int64_t> first(0);
  thrust::for_each(thrust::device, first, first + g.batch * g.tq,
                   detail::AttentionRowFn<T>{{g}, q, k, v, out, nullptr});
}

/// See cpu::attention_backward.
template <class T> void attention_backward(const cpu::AttentionGeometry& g, const T* q, const T* k, const T* v,
                                           const T* out, const T* gy, T* grads) {
  if (!g.grads_fill_buffer()) thrust::fill_n(thrust::device, grads, g.batch / g.heads * g.tq * g.width, T(0));
  const std::int64_t queries = g.batch * g.tq;
  Scratch<T> lse(static_cast<std::size_t>(queries)), dots(static_cast<std::size_t>(queries));
  thrust::counting_iterator<std::int64_t> first(0);
  const detail::AttentionRowsAt at{g};
  thrust::for_each(thrust::device, first, first + queries,
                   detail::AttentionRowFn<T>{at, q, k, nullptr, nullptr, lse.data()});
  thrust::for_each(thrust::device, first, first + queries, detail::AttentionDotFn<T>{at, gy, out, dots.data()});
  thrust::for_each(thrust::device, first, first + queries,
                   detail::AttentionQueryGradFn<T>{{at, q, k, v, gy, lse.data(), dots.data(), grads}});
  thrust::for_each(thrust::device, first, first + g.batch * g.tk,
                   detail::AttentionKeyGradFn<T>{{at, q, k, v, gy, lse.data(), dots.data(), grads}});
}

}  // namespace xgrad::thrust_backend
