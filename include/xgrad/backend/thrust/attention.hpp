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

/// One batch item's matrix of an operand, laid out as AttentionGeometry says: row i at
/// base + i * stride. Worked out once per functor call, so that the loops only multiply.
template <class P> struct ItemMatrix {
  P base;
  std::int64_t stride;
  XGRAD_HD P row(std::int64_t i) const { return base + i * stride; }
};
template <class P> XGRAD_HD ItemMatrix<P> item_matrix(P data, cpu::AttentionGeometry::Rows rows) {
  return {data + rows.start, rows.stride};
}

/// Query row `row` (batch item row / tq): its output when out is given, and the log of its
/// softmax denominator into lse[row] when lse is (0 for a query that sees no key).
template <class T> struct AttentionRowFn {
  cpu::AttentionGeometry g;
  const T *q, *k, *v;
  T *out, *lse;
  XGRAD_HD void operator()(std::int64_t row) const {
    const std::int64_t n = row / g.tq, i = row % g.tq;
    const T* qi = item_matrix(q, g.q_rows(n)).row(i);
    const auto keys = item_matrix(k, g.k_rows(n));
    const auto values = v ? item_matrix(v, g.v_rows(n)) : ItemMatrix<const T*>{nullptr, 0};
    T* o = out ? item_matrix(out, g.out_rows(n)).row(i) : nullptr;
    if (o)
      for (std::int64_t c = 0; c < g.dv; ++c) o[c] = T(0);
    // Two passes, the maximum first: each exponential then has the row's final shift, as the
    // cpu's have (a first score of -inf would give an online pass exp(-inf + inf)).
    const std::int64_t end = g.key_end(i);
    const T scale = static_cast<T>(g.scale);
    T shift = 0;
    for (std::int64_t j = 0; j < end; ++j) {
      const T s = scale * dot(qi, keys.row(j), g.d);
      shift = j == 0 || s > shift ? s : shift;
    }
    T total = 0;
    for (std::int64_t j = 0; j < end; ++j) {
      const T p = std::exp(scale * dot(qi, keys.row(j), g.d) - shift);
      total += p;
      if (o) {
        const T* vj = values.row(j);
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
  cpu::AttentionGeometry g;
  const T *gy, *out;
  T* dots;
  XGRAD_HD void operator()(std::int64_t row) const {
    const auto rows = g.out_rows(row / g.tq);
    const std::int64_t i = row % g.tq;
    dots[row] = dot(item_matrix(gy, rows).row(i), item_matrix(out, rows).row(i), g.dv);
  }
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
  /// Query row qrow (n * tq + i, its q and gy rows qi and gyi) with key row j of item n (kj, vj).
  XGRAD_HD Pair pair(std::int64_t qrow, const T* qi, const T* gyi, const T* kj, const T* vj) const {
    const T p = std::exp(static_cast<T>(g.scale) * dot(qi, kj, g.d) - lse[qrow]);
    return {p, p * (dot(gyi, vj, g.dv) - dots[qrow])};
  }
};

/// Query row `row`'s gradient: dq_i = scale sum_j ds_ij k_j.
template <class T> struct AttentionQueryGradFn : AttentionGradParts<T> {
  XGRAD_HD void operator()(std::int64_t row) const {
    const cpu::AttentionGeometry& g = this->g;
    const std::int64_t n = row / g.tq, i = row % g.tq;
    const T* qi = item_matrix(this->q, g.q_rows(n)).row(i);
    const T* gyi = item_matrix(this->gy, g.out_rows(n)).row(i);
    const auto keys = item_matrix(this->k, g.k_rows(n));
    const auto values = item_matrix(this->v, g.v_rows(n));
    T* dq = item_matrix(this->grads, g.dq_rows(n)).row(i);
    for (std::int64_t c = 0; c < g.d; ++c) dq[c] = T(0);
    const T scale = static_cast<T>(g.scale);
    for (std::int64_t j = 0; j < g.key_end(i); ++j) {
      const T* kj = keys.row(j);
      const T ds = this->pair(row, qi, gyi, kj, values.row(j)).ds;
      for (std::int64_t c = 0; c < g.d; ++c) dq[c] += scale * ds * kj[c];
    }
  }
};

/// Key row `row`'s gradients: dv_j = sum_i p_ij gy_i, dk_j = scale sum_i ds_ij q_i, over the
/// queries that see key j.
template <class T> struct AttentionKeyGradFn : AttentionGradParts<T> {
  XGRAD_HD void operator()(std::int64_t row) const {
    const cpu::AttentionGeometry& g = this->g;
    const std::int64_t n = row / g.tk, j = row % g.tk;
    const T* kj = item_matrix(this->k, g.k_rows(n)).row(j);
    const T* vj = item_matrix(this->v, g.v_rows(n)).row(j);
    const auto queries = item_matrix(this->q, g.q_rows(n));
    const auto gys = item_matrix(this->gy, g.out_rows(n));
    T* dk = item_matrix(this->grads, g.dk_rows(n)).row(j);
    T* dv = item_matrix(this->grads, g.dv_rows(n)).row(j);
    for (std::int64_t c = 0; c < g.d; ++c) dk[c] = T(0);
    for (std::int64_t c = 0; c < g.dv; ++c) dv[c] = T(0);
    const T scale = static_cast<T>(g.scale);
    for (std::int64_t i = g.query_begin(j); i < g.tq; ++i) {
      const T *qi = queries.row(i), *gyi = gys.row(i);
      const auto [p, ds] = this->pair(n * g.tq + i, qi, gyi, kj, vj);
      for (std::int64_t c = 0; c < g.dv; ++c) dv[c] += p * gyi[c];
      for (std::int64_t c = 0; c < g.d; ++c) dk[c] += scale * ds * qi[c];
    }
  }
};

}  // namespace detail

/// See cpu::attention_forward.
template <class T>
void attention_forward(const cpu::AttentionGeometry& g, const T* q, const T* k, const T* v, T* out, T* lse = nullptr) {
  thrust::counting_iterator<std::int64_t> first(0);
  thrust::for_each(thrust::device, first, first + g.batch * g.tq, detail::AttentionRowFn<T>{g, q, k, v, out, lse});
}

/// See cpu::attention_backward.
template <class T> void attention_backward(const cpu::AttentionGeometry& g, const T* q, const T* k, const T* v,
                                           const T* out, const T* gy, T* grads, const T* saved_lse = nullptr) {
  if (!g.grads_fill_buffer()) thrust::fill_n(thrust::device, grads, g.batch / g.heads * g.tq * g.width, T(0));
  const std::int64_t queries = g.batch * g.tq;
  Scratch<T> made(static_cast<std::size_t>(queries)), dots(static_cast<std::size_t>(queries));
  thrust::counting_iterator<std::int64_t> first(0);
  if (!saved_lse)
    thrust::for_each(thrust::device, first, first + queries,
                     detail::AttentionRowFn<T>{g, q, k, nullptr, nullptr, made.data()});
  const T* lse = saved_lse ? saved_lse : made.data();
  thrust::for_each(thrust::device, first, first + queries, detail::AttentionDotFn<T>{g, gy, out, dots.data()});
  thrust::for_each(thrust::device, first, first + queries,
                   detail::AttentionQueryGradFn<T>{{g, q, k, v, gy, lse, dots.data(), grads}});
  thrust::for_each(thrust::device, first, first + g.batch * g.tk,
                   detail::AttentionKeyGradFn<T>{{g, q, k, v, gy, lse, dots.data(), grads}});
}

}  // namespace xgrad::thrust_backend
