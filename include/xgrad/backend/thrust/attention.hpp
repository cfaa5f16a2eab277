// Device::thrust scaled dot-product attention and its gradient (cpu: backend/cpu/attention.hpp).
// A block of scores at a time (at most k_attention_scores of them: every query of several batch
// items, or a range of one item's queries), its products as strided batches (cuBLAS on a GPU),
// its softmax one row or one element per functor call: a GPU runs the products on its matrix
// units and never walks a long row of keys in one thread. Inputs with a NaN or an infinity take
// the exact path instead, one functor call per query row (or, for the keys' gradients, per key
// row), which skips the keys a query does not see rather than multiplying them by 0.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include <thrust/execution_policy.h>
#include <thrust/fill.h>
#include <thrust/for_each.h>
#include <thrust/functional.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform_reduce.h>

#include "xgrad/backend/attention_geometry.hpp"
#include "xgrad/backend/thrust/gemm.hpp"
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

/// Scores per block: 16 MiB of float (4 items of 1024 x 1024, or one item's 2048 x 2048).
inline constexpr std::int64_t k_attention_scores = std::int64_t{1} << 22;

/// `count` batch items from n0 (a fixed step apart in every operand: one sequence's heads in the
/// heads layout, any run of items otherwise) and their queries [i0, i0 + rows), which see at
/// most keys [0, keys).
struct AttentionBlock {
  std::int64_t n0, count, i0, rows, keys;
  XGRAD_HD std::int64_t scores() const { return count * rows * keys; }
};

/// Calls f(block) for blocks that cover every query of every item.
template <class F> void for_each_attention_block(const cpu::AttentionGeometry& g, F f) {
  const std::int64_t group = g.heads ? g.heads : g.batch;
  const std::int64_t per_item = std::max<std::int64_t>(g.tq * g.tk, 1);
  const std::int64_t items = std::clamp<std::int64_t>(k_attention_scores / per_item, 1, group);
  const std::int64_t rows = per_item <= k_attention_scores
                                ? g.tq
                                : std::max<std::int64_t>(1, k_attention_scores / std::max<std::int64_t>(g.tk, 1));
  for (std::int64_t first = 0; first < g.batch; first += group)
    for (std::int64_t n0 = first; n0 < first + group; n0 += items)
      for (std::int64_t i0 = 0; i0 < g.tq; i0 += rows) {
        const std::int64_t r = std::min(rows, g.tq - i0);
        f(AttentionBlock{n0, std::min(items, first + group - n0), i0, r, g.key_end(i0 + r - 1)});
      }
}

/// The distance between consecutive items' matrices of an operand in a block.
using RowsOf = cpu::AttentionGeometry::Rows (cpu::AttentionGeometry::*)(std::int64_t) const;
inline std::int64_t item_step(const cpu::AttentionGeometry& g, const AttentionBlock& b, RowsOf rows) {
  return b.count > 1 ? (g.*rows)(b.n0 + 1).start - (g.*rows)(b.n0).start : 0;
}

/// Partial sums per row of the log-denominators: lane c of a row takes keys c, c + lanes, ...,
/// so that neighbouring lanes read neighbouring scores (a GPU's warp reads a row in whole lines).
inline constexpr std::int64_t k_lse_lanes = 32;

/// Lane `t % lanes` of block row `t / lanes`: the largest of its scores among the keys the query
/// sees (-inf for none), and the sum of their exp(s - that largest).
template <class T> struct BlockLsePartFn {
  cpu::AttentionGeometry g;
  AttentionBlock b;
  const T* s;
  T *shift, *total;
  XGRAD_HD void operator()(std::int64_t t) const {
    const std::int64_t row = t / k_lse_lanes, lane = t % k_lse_lanes, i = b.i0 + row % b.rows;
    const std::int64_t seen = g.key_end(i) < b.keys ? g.key_end(i) : b.keys;
    const T* x = s + row * b.keys;
    T m = -std::numeric_limits<T>::infinity();
    for (std::int64_t j = lane; j < seen; j += k_lse_lanes) m = x[j] > m ? x[j] : m;
    T sum = 0;
    for (std::int64_t j = lane; j < seen; j += k_lse_lanes) sum += std::exp(x[j] - m);
    shift[t] = m;
    total[t] = sum;
  }
};

/// Block row `row`'s log-denominator from its lanes, into lse[n * tq + i]: the log of the sum
/// of exp(s - max) over the keys the query sees, plus that max (0 for a query that sees none).
template <class T> struct BlockLseFn {
  cpu::AttentionGeometry g;
  AttentionBlock b;
  const T *shift, *total;
  T* lse;
  XGRAD_HD void operator()(std::int64_t row) const {
    const std::int64_t i = b.i0 + row % b.rows, lanes = g.key_end(i) < k_lse_lanes ? g.key_end(i) : k_lse_lanes;
    const T *m = shift + row * k_lse_lanes, *sum = total + row * k_lse_lanes;
    T most = -std::numeric_limits<T>::infinity();
    for (std::int64_t c = 0; c < lanes; ++c) most = m[c] > most ? m[c] : most;
    T all = 0;
    for (std::int64_t c = 0; c < lanes; ++c) all += sum[c] * std::exp(m[c] - most);
    lse[(b.n0 + row / b.rows) * g.tq + i] = lanes > 0 ? most + std::log(all) : T(0);
  }
};

/// The block's log-denominators (s its scores) into lse, as above.
template <class T> void block_lse(const cpu::AttentionGeometry& g, const AttentionBlock& b, const T* s, T* lse) {
  const std::int64_t rows = b.count * b.rows;
  Scratch<T> shift(static_cast<std::size_t>(rows * k_lse_lanes)), total(static_cast<std::size_t>(rows * k_lse_lanes));
  thrust::counting_iterator<std::int64_t> first(0);
  thrust::for_each(thrust::device, first, first + rows * k_lse_lanes,
                   BlockLsePartFn<T>{g, b, s, shift.data(), total.data()});
  thrust::for_each(thrust::device, first, first + rows, BlockLseFn<T>{g, b, shift.data(), total.data(), lse});
}

/// Score e of the block becomes its probability exp(s - lse), 0 where the query does not see the
/// key.
template <class T> struct BlockProbabilityFn {
  cpu::AttentionGeometry g;
  AttentionBlock b;
  T* s;
  const T* lse;
  XGRAD_HD void operator()(std::int64_t e) const {
    const std::int64_t row = e / b.keys, j = e % b.keys, i = b.i0 + row % b.rows;
    s[e] = j < g.key_end(i) ? std::exp(s[e] - lse[(b.n0 + row / b.rows) * g.tq + i]) : T(0);
  }
};

/// The probabilities' gradient: ds = p (dp - gy_i . out_i), in place of dp.
template <class T> struct BlockScoreGradFn {
  cpu::AttentionGeometry g;
  AttentionBlock b;
  const T* p;
  T* dp;
  const T* dots;
  XGRAD_HD void operator()(std::int64_t e) const {
    const std::int64_t row = e / b.keys;
    dp[e] = p[e] * (dp[e] - dots[(b.n0 + row / b.rows) * g.tq + b.i0 + row % b.rows]);
  }
};

/// The block's scale q k^T into s, [count, rows, keys].
template <class T>
void block_scores(const cpu::AttentionGeometry& g, const AttentionBlock& b, const T* q, const T* k, T* s) {
  const auto qr = g.q_rows(b.n0), kr = g.k_rows(b.n0);
  strided_gemm<T>(b.count, b.rows, b.keys, g.d, static_cast<T>(g.scale), q + qr.start + b.i0 * qr.stride, qr.stride, 1,
                  item_step(g, b, &cpu::AttentionGeometry::q_rows), k + kr.start, 1, kr.stride,
                  item_step(g, b, &cpu::AttentionGeometry::k_rows), T(0), s, b.keys, b.rows * b.keys);
}

template <class T> struct IsFiniteFn {
  XGRAD_HD bool operator()(T x) const { return std::isfinite(x); }
};
template <class T> bool all_finite(const T* x, std::int64_t n) {
  return thrust::transform_reduce(thrust::device, x, x + n, IsFiniteFn<T>{}, true, thrust::logical_and<bool>());
}
/// Whether q, k and v (when given) and gy (likewise) hold finite values only, in the whole of
/// their buffers.
template <class T>
bool finite_operands(const cpu::AttentionGeometry& g, const T* q, const T* k, const T* v, const T* gy = nullptr) {
  const std::int64_t sequences = g.heads ? g.batch / g.heads : g.batch;
  const std::int64_t q_size = g.heads ? sequences * g.tq * g.width : g.batch * g.tq * g.d;
  const std::int64_t k_size = g.heads ? sequences * g.tk * g.width : g.batch * g.tk * g.d;
  const std::int64_t v_size = g.heads ? sequences * g.tk * g.width : g.batch * g.tk * g.dv;
  return all_finite(q, q_size) && all_finite(k, k_size) && (!v || all_finite(v, v_size)) &&
         (!gy || all_finite(gy, g.batch * g.tq * g.dv));
}

}  // namespace detail

/// See cpu::attention_forward. Block by block: s = scale q k^T, each query's lse, p = exp(s -
/// lse) over the keys it sees, out = p v.
template <class T>
void attention_forward(const cpu::AttentionGeometry& g, const T* q, const T* k, const T* v, T* out, T* lse = nullptr) {
  if (g.batch == 0 || g.tq == 0 || (g.dv == 0 && !lse)) return;
  thrust::counting_iterator<std::int64_t> first(0);
  if (!detail::finite_operands(g, q, k, v)) {
    thrust::for_each(thrust::device, first, first + g.batch * g.tq, detail::AttentionRowFn<T>{g, q, k, v, out, lse});
    return;
  }
  const std::int64_t most = std::min(detail::k_attention_scores, g.batch * g.tq * g.tk);
  Scratch<T> scores(static_cast<std::size_t>(std::max<std::int64_t>(most, 1)));
  Scratch<T> made(static_cast<std::size_t>(lse ? 0 : g.batch * g.tq));
  T* lse_out = lse ? lse : made.data();
  detail::for_each_attention_block(g, [&](const detail::AttentionBlock& b) {
    detail::block_scores(g, b, q, k, scores.data());
    detail::block_lse(g, b, scores.data(), lse_out);
    if (!out) return;
    thrust::for_each(thrust::device, first, first + b.scores(),
                     detail::BlockProbabilityFn<T>{g, b, scores.data(), lse_out});
    const auto vr = g.v_rows(b.n0), outr = g.out_rows(b.n0);
    strided_gemm<T>(b.count, b.rows, g.dv, b.keys, T(1), scores.data(), b.keys, 1, b.rows * b.keys, v + vr.start,
                    vr.stride, 1, detail::item_step(g, b, &cpu::AttentionGeometry::v_rows), T(0),
                    out + outr.start + b.i0 * outr.stride, outr.stride,
                    detail::item_step(g, b, &cpu::AttentionGeometry::out_rows));
  });
}

/// See cpu::attention_backward. Block by block, from p as the forward makes it: dv += p^T gy,
/// ds = p (gy v^T - gy . out), dq = scale ds k, dk += scale ds^T q.
template <class T> void attention_backward(const cpu::AttentionGeometry& g, const T* q, const T* k, const T* v,
                                           const T* out, const T* gy, T* grads, const T* saved_lse = nullptr) {
  if (g.batch == 0) return;
  const std::int64_t grads_total = g.heads ? g.batch / g.heads * g.tq * g.width : g.batch * g.grads_size();
  // Zeros first: dk and dv add up over blocks of queries, and the heads layout may leave columns.
  thrust::fill_n(thrust::device, grads, grads_total, T(0));
  if (g.grads_size() == 0) return;
  const bool exact = !detail::finite_operands(g, q, k, v, gy);
  const std::int64_t queries = g.batch * g.tq;
  Scratch<T> made(static_cast<std::size_t>(saved_lse ? 0 : queries)), dots(static_cast<std::size_t>(queries));
  thrust::counting_iterator<std::int64_t> first(0);
  thrust::for_each(thrust::device, first, first + queries, detail::AttentionDotFn<T>{g, gy, out, dots.data()});
  if (exact) {
    if (!saved_lse)
      thrust::for_each(thrust::device, first, first + queries,
                       detail::AttentionRowFn<T>{g, q, k, nullptr, nullptr, made.data()});
    const T* lse = saved_lse ? saved_lse : made.data();
    thrust::for_each(thrust::device, first, first + queries,
                     detail::AttentionQueryGradFn<T>{{g, q, k, v, gy, lse, dots.data(), grads}});
    thrust::for_each(thrust::device, first, first + g.batch * g.tk,
                     detail::AttentionKeyGradFn<T>{{g, q, k, v, gy, lse, dots.data(), grads}});
    return;
  }
  const std::int64_t most = std::max<std::int64_t>(std::min(detail::k_attention_scores, queries * g.tk), 1);
  Scratch<T> p(static_cast<std::size_t>(most)), ds(static_cast<std::size_t>(most));
  const T* lse = saved_lse ? saved_lse : made.data();
  const T scale = static_cast<T>(g.scale);
  detail::for_each_attention_block(g, [&](const detail::AttentionBlock& b) {
    if (b.keys == 0) return;  // no query of the block sees a key: its dq stays 0
    detail::block_scores(g, b, q, k, p.data());
    if (!saved_lse)  // the forward's blocks and arithmetic: its lse, bit for bit
      detail::block_lse(g, b, p.data(), made.data());
    thrust::for_each(thrust::device, first, first + b.scores(), detail::BlockProbabilityFn<T>{g, b, p.data(), lse});
    const auto step = [&](detail::RowsOf rows) { return detail::item_step(g, b, rows); };
    const auto qr = g.q_rows(b.n0), kr = g.k_rows(b.n0), vr = g.v_rows(b.n0), outr = g.out_rows(b.n0);
    const auto dqr = g.dq_rows(b.n0), dkr = g.dk_rows(b.n0), dvr = g.dv_rows(b.n0);
    using G = cpu::AttentionGeometry;
    const std::int64_t q_step = step(&G::q_rows), k_step = step(&G::k_rows), v_step = step(&G::v_rows),
                       out_step = step(&G::out_rows), dq_step = step(&G::dq_rows), dk_step = step(&G::dk_rows),
                       dv_step = step(&G::dv_rows);
    const std::int64_t block_step = b.rows * b.keys;
    const T* q_block = q + qr.start + b.i0 * qr.stride;
    const T* gy_block = gy + outr.start + b.i0 * outr.stride;
    // dv += p^T gy; dp = gy v^T, then ds; dq = scale ds k; dk += scale ds^T q.
    strided_gemm<T>(b.count, b.keys, g.dv, b.rows, T(1), p.data(), 1, b.keys, block_step, gy_block, outr.stride, 1,
                    out_step, T(1), grads + dvr.start, dvr.stride, dv_step);
    strided_gemm<T>(b.count, b.rows, b.keys, g.dv, T(1), gy_block, outr.stride, 1, out_step, v + vr.start, 1, vr.stride,
                    v_step, T(0), ds.data(), b.keys, block_step);
    thrust::for_each(thrust::device, first, first + b.scores(),
                     detail::BlockScoreGradFn<T>{g, b, p.data(), ds.data(), dots.data()});
    strided_gemm<T>(b.count, b.rows, g.d, b.keys, scale, ds.data(), b.keys, 1, block_step, k + kr.start, kr.stride, 1,
                    k_step, T(0), grads + dqr.start + b.i0 * dqr.stride, dqr.stride, dq_step);
    strided_gemm<T>(b.count, b.keys, g.d, b.rows, scale, ds.data(), 1, b.keys, block_step, q_block, qr.stride, 1,
                    q_step, T(1), grads + dkr.start, dkr.stride, dk_step);
  });
}

}  // namespace xgrad::thrust_backend
