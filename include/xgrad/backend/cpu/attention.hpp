// xgrad CPU backend: scaled dot-product attention and its gradient, blocked as FlashAttention
// is: a block of queries meets a block of keys at a time under an online softmax, so no
// [tq, tk] score matrix is ever made; the block products run on the packed GEMM.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include <xsimd/xsimd.hpp>

#include "xgrad/backend/attention_geometry.hpp"
#include "xgrad/backend/cpu/gemm.hpp"
#include "xgrad/backend/cpu/thread_pool.hpp"
#include "xgrad/backend/math.hpp"
#include "xgrad/core/dtype.hpp"

namespace xgrad::cpu {
namespace detail {

/// Queries and keys per block of the gradient, and of the forward for short key sequences: a
/// 64 x 64 block of scores (16 KiB of float) stays in L1 beside the rows it multiplies.
inline constexpr std::int64_t k_attention_block = 64;

/// Multiply-adds per parallel task below which a task is not worth a thread.
inline constexpr std::int64_t k_attention_task_work = std::int64_t{1} << 15;

/// Keys per block of the forward's online softmax, and queries per task: wider blocks for longer
/// key sequences mean fewer rescales and fewer, larger products (packed once for more rows); a
/// block of 128 x 256 scores still sits in L2. Measured at d = 32, 1 thread: T = 128 forward
/// 0.92 -> 0.81 ms, T = 2048 17.4 -> 12.8 ms. The gradient works out the log-denominators in the
/// same blocks when it does not get the forward's, so the two agree bit for bit. At most the
/// GEMM's depth kc (256 float, 128 double), so that a block of probabilities is one packed A.
template <class T> std::int64_t attention_key_block(const AttentionGeometry& g) {
  return std::min<std::int64_t>(g.tk >= 512 ? 256 : g.tk >= 128 ? 128 : k_attention_block, GemmConfig<T>::kc);
}
inline std::int64_t attention_query_block(const AttentionGeometry& g) { return g.tk >= 512 ? 128 : k_attention_block; }

template <class T> struct AttentionWorkspace { ScratchBuffer<T> scores, scores_grad, shift, total, lse, dot; };

template <class T> AttentionWorkspace<T>& attention_workspace() {
  static thread_local AttentionWorkspace<T> ws;
  return ws;
}

/// A row of a block of scores, `width` wide, of which the first `seen` are a query's: the rest,
/// up to a whole number of vectors, set to -inf, so the row's maximum and exponentials run on
/// whole vectors and those entries come out as 0. Returns that whole number.
template <class T> std::int64_t pad_row(T* x, std::int64_t seen, std::int64_t width = k_attention_block) {
  constexpr auto L = static_cast<std::int64_t>(simd_type<T> ? xsimd::batch<T>::size : 1);
  const std::int64_t padded = std::min((seen + L - 1) / L * L, width);
  std::fill(x + seen, x + padded, -std::numeric_limits<T>::infinity());
  return padded;
}

/// The largest of x[0..n) (n a pad_row result); NaN when a NaN is among them.
template <class T> T row_max(const T* x, std::int64_t n) {
  T m = -std::numeric_limits<T>::infinity();
  std::int64_t i = 0;
  if constexpr (simd_type<T>) {  // no batch in nvcc's device pass
    using B = xsimd::batch<T>;
    constexpr auto L = static_cast<std::int64_t>(B::size);
    B acc(m);
    for (; i + L <= n; i += L) {
      const B v = B::load_unaligned(x + i);
      acc = xsimd::select(v > acc, v, acc);
    }
    alignas(64) T lanes[L];
    acc.store_aligned(lanes);
    for (const T lane : lanes) m = lane > m ? lane : m;
  }
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  if (m == -std::numeric_limits<T>::infinity())  // comparisons skip NaN: look for one
    for (std::int64_t j = 0; j < n; ++j)
      if (std::isnan(x[j])) return x[j];
  return m;
}

/// x[i] = exp(x[i] - shift) for i < n (n a pad_row result; shift at least every x[i]); returns
/// their sum.
template <class T> T exp_shifted(T* x, std::int64_t n, T shift) {
  T sum = 0;
  std::int64_t i = 0;
  if constexpr (simd_type<T>) {  // math::exp is a device function too: no batch in nvcc's device pass
    using B = xsimd::batch<T>;
    constexpr auto L = static_cast<std::int64_t>(B::size);
    const B s(shift);
    B acc(T(0));
    for (; i + L <= n; i += L) {
      const B e = math::exp_nonpositive(B::load_unaligned(x + i) - s);
      e.store_unaligned(x + i);
      acc += e;
    }
    sum = xsimd::hadd(acc);
  }
  for (; i < n; ++i) sum += x[i] = std::exp(x[i] - shift);
  return sum;
}

template <class T> void scale_row(T* x, std::int64_t n, T factor) {
  for (std::int64_t i = 0; i < n; ++i) x[i] *= factor;
}

/// Queries [i0, i0 + rows) of batch item n (q, k, v and out the operands' buffers, laid out
/// as g says): their attention into out when out is given, the log of each one's softmax
/// denominator (with the maximum it was computed from added back) into lse[0, rows) when lse is.
template <class T> void attention_rows(const AttentionGeometry& g, std::int64_t n, const T* q, const T* k, const T* v,
                                       std::int64_t i0, std::int64_t rows, T* out, T* lse) {
  const std::int64_t BK = attention_key_block<T>(g);
  const auto qr = g.q_rows(n), kr = g.k_rows(n), vr = g.v_rows(n), outr = g.out_rows(n);
  q += qr.start + i0 * qr.stride;
  k += kr.start;
  v = v ? v + vr.start : nullptr;
  out = out ? out + outr.start + i0 * outr.stride : nullptr;
  auto& ws = attention_workspace<T>();
  // The scores, then probabilities, laid out as the GEMM packs its A: the product with v reads
  // them in place. Rows past `rows`, up to a whole micro-panel, are zeros it may read.
  using cfg = GemmConfig<T>;
  constexpr std::int64_t LD = cfg::a_row_stride;
  const std::int64_t panel_rows = (rows + cfg::mr - 1) / cfg::mr * cfg::mr;
  T* s = ws.scores.get(panel_rows * LD);
  std::fill(s + rows * LD, s + panel_rows * LD, T(0));
  T* shift = ws.shift.get(rows);
  T* total = ws.total.get(rows);
  constexpr T none = -std::numeric_limits<T>::infinity();  // no key seen yet
  std::fill_n(shift, rows, none);
  std::fill_n(total, rows, T(0));
  if (out)
    for (std::int64_t r = 0; r < rows; ++r) std::fill_n(out + r * outr.stride, g.dv, T(0));
  const T scale = static_cast<T>(g.scale);
  const std::int64_t end = g.key_end(i0 + rows - 1);  // the last query sees the most keys
  for (std::int64_t j0 = 0; j0 < end; j0 += BK) {
    const std::int64_t n_keys = std::min(BK, end - j0);
    gemm<T>(rows, n_keys, g.d, scale, q, qr.stride, 1, k + j0 * kr.stride, 1, kr.stride, T(0), s, LD);
    for (std::int64_t r = 0; r < rows; ++r) {
      T* row = s + r * LD;
      const std::int64_t seen = std::clamp<std::int64_t>(g.key_end(i0 + r) - j0, 0, n_keys);
      const std::int64_t padded = pad_row(row, seen, BK);
      if (padded < n_keys) std::fill(row + padded, row + n_keys, T(0));  // keys this query does not see weigh nothing
      if (seen == 0) continue;
      T m = row_max(row, padded);  // a NaN stays, and makes the row NaN
      if (shift[r] > m) m = shift[r];
      if (m == none) {  // -inf scores only, so far: they weigh 0 beside any finite one to come
        std::fill(row, row + padded, T(0));
        continue;
      }
      const T rescale = shift[r] == none ? T(0) : std::exp(shift[r] - m);
      total[r] = total[r] * rescale + exp_shifted(row, padded, m);
      shift[r] = m;
      if (out && rescale != T(1)) scale_row(out + r * outr.stride, g.dv, rescale);
    }
    if (!out) continue;
    // The keys past the first query's last are hidden from some queries, and a hidden key must
    // not reach them even as 0 * inf: when one of those holds a non-finite value, row by row.
    const std::int64_t shared = std::clamp<std::int64_t>(g.key_end(i0) - j0, 0, n_keys);
    bool finite = true;
    for (std::int64_t j = j0 + shared; finite && j < j0 + n_keys; ++j) finite = all_finite(v + j * vr.stride, g.dv);
    if (finite) {
      gemm_packed_a<T>(rows, g.dv, n_keys, T(1), s, v + j0 * vr.stride, vr.stride, 1, T(1), out, outr.stride);
      continue;
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t seen = std::clamp<std::int64_t>(g.key_end(i0 + r) - j0, 0, n_keys);
      for (std::int64_t j = 0; j < seen; ++j)
        for (std::int64_t c = 0; c < g.dv; ++c) out[r * outr.stride + c] += s[r * LD + j] * v[(j0 + j) * vr.stride + c];
    }
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    // A query that sees no key gets zeros, as FlashAttention gives; one whose scores are all
    // -inf gets NaN, as softmax does.
    const bool sees_none = g.key_end(i0 + r) == 0;
    if (out && total[r] == T(0))
      std::fill_n(out + r * outr.stride, g.dv, sees_none ? T(0) : std::numeric_limits<T>::quiet_NaN());
    else if (out)
      scale_row(out + r * outr.stride, g.dv, T(1) / total[r]);
    if (lse) lse[r] = sees_none ? T(0) : shift[r] + std::log(total[r]);
  }
}

/// Batch item n's gradients, into grads laid out as g says: FlashAttention 2's backward, a block
/// of keys at a time against the queries that see them, the probabilities recomputed from each
/// query's log-denominator: the item's [tq] of saved_lse when given (the forward's), else
/// worked out again here.
template <class T> void attention_backward_item(const AttentionGeometry& g, std::int64_t n, const T* q, const T* k,
                                                const T* v, const T* out, const T* gy, T* grads, const T* saved_lse) {
  constexpr std::int64_t BK = k_attention_block;
  const auto qr = g.q_rows(n), kr = g.k_rows(n), vr = g.v_rows(n), outr = g.out_rows(n);
  const auto dqr = g.dq_rows(n), dkr = g.dk_rows(n), dvr = g.dv_rows(n);
  T* dq = grads + dqr.start;
  T* dk = grads + dkr.start;
  T* dv = grads + dvr.start;
  for (std::int64_t i = 0; i < g.tq; ++i) std::fill_n(dq + i * dqr.stride, g.d, T(0));
  for (std::int64_t j = 0; j < g.tk; ++j) {
    std::fill_n(dk + j * dkr.stride, g.d, T(0));
    std::fill_n(dv + j * dvr.stride, g.dv, T(0));
  }
  auto& ws = attention_workspace<T>();
  const T* lse = saved_lse;
  if (!lse) {
    T* made = ws.lse.get(g.tq);
    const std::int64_t QB = attention_query_block(g);
    for (std::int64_t i0 = 0; i0 < g.tq; i0 += QB)
      attention_rows<T>(g, n, q, k, nullptr, i0, std::min(QB, g.tq - i0), nullptr, made + i0);
    lse = made;
  }
  T* dot = ws.dot.get(g.tq);  // dot[i] = gy_i . out_i = sum_j p_ij (gy_i . v_j)
  q += qr.start;
  k += kr.start;
  v += vr.start;
  out += outr.start;
  gy += outr.start;
  for (std::int64_t i = 0; i < g.tq; ++i) {
    T sum = 0;
    for (std::int64_t c = 0; c < g.dv; ++c) sum += gy[i * outr.stride + c] * out[i * outr.stride + c];
    dot[i] = sum;
  }
  // ds in pack_a's layout (see attention_rows): the product with k reads it in place.
  using cfg = GemmConfig<T>;
  constexpr std::int64_t LD = cfg::a_row_stride;
  constexpr std::int64_t panel_rows = (BK + cfg::mr - 1) / cfg::mr * cfg::mr;
  T* p = ws.scores.get(BK * BK);
  T* ds = ws.scores_grad.get(panel_rows * LD);
  std::fill(ds, ds + panel_rows * LD, T(0));
  const T scale = static_cast<T>(g.scale);
  for (std::int64_t j0 = 0; j0 < g.tk; j0 += BK) {
    const std::int64_t n_keys = std::min(BK, g.tk - j0);
    for (std::int64_t i0 = g.query_begin(j0); i0 < g.tq; i0 += BK) {
      const std::int64_t rows = std::min(BK, g.tq - i0);
      const T* qi = q + i0 * qr.stride;
      const T* gyi = gy + i0 * outr.stride;
      gemm<T>(rows, n_keys, g.d, scale, qi, qr.stride, 1, k + j0 * kr.stride, 1, kr.stride, T(0), p, BK);
      for (std::int64_t r = 0; r < rows; ++r) {
        T* row = p + r * BK;
        const std::int64_t seen = std::clamp<std::int64_t>(g.key_end(i0 + r) - j0, 0, n_keys);
        const std::int64_t padded = pad_row(row, seen);
        if (padded < n_keys) std::fill(row + padded, row + n_keys, T(0));
        if (seen > 0) exp_shifted(row, padded, lse[i0 + r]);
      }
      // dv += p^T gy; d(scores) = p * (gy v^T - dot); dq += scale ds k; dk += scale ds^T q.
      gemm<T>(n_keys, g.dv, rows, T(1), p, 1, BK, gyi, outr.stride, 1, T(1), dv + j0 * dvr.stride, dvr.stride);
      gemm<T>(rows, n_keys, g.dv, T(1), gyi, outr.stride, 1, v + j0 * vr.stride, 1, vr.stride, T(0), ds, LD);
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t seen = std::clamp<std::int64_t>(g.key_end(i0 + r) - j0, 0, n_keys);
        T* row = ds + r * LD;
        const T* prob = p + r * BK;
        for (std::int64_t c = 0; c < seen; ++c) row[c] = prob[c] * (row[c] - dot[i0 + r]);
        std::fill(row + seen, row + n_keys, T(0));
      }
      if (rows < BK) std::fill(ds + rows * LD, ds + panel_rows * LD, T(0));  // a last, short block
      gemm_packed_a<T>(rows, g.d, n_keys, scale, ds, k + j0 * kr.stride, kr.stride, 1, T(1), dq + i0 * dqr.stride,
                       dqr.stride);
      gemm<T>(n_keys, g.d, rows, scale, ds, 1, LD, qi, qr.stride, 1, T(1), dk + j0 * dkr.stride, dkr.stride);
    }
  }
}

/// Tasks per parallel chunk so that a chunk is worth a thread: each does `work` multiply-adds.
inline std::int64_t attention_grain(std::int64_t work) {
  return std::max<std::int64_t>(1, k_attention_task_work / std::max<std::int64_t>(work, 1));
}

}  // namespace detail

/// out = softmax(q k^T * scale) v for each batch item, masked and laid out as g says
/// (attention_geometry.hpp); blocks of queries run in parallel. With lse, each query's
/// log-denominator too ([batch, tq]), which attention_backward can take instead of working it
/// out again: the same values, bit for bit.
template <class T>
void attention_forward(const AttentionGeometry& g, const T* q, const T* k, const T* v, T* out, T* lse = nullptr) {
  const std::int64_t BK = detail::attention_query_block(g);
  if (g.batch == 0 || g.tq == 0 || (g.dv == 0 && !lse)) return;
  const std::int64_t blocks = (g.tq + BK - 1) / BK;
  parallel_for(0, g.batch * blocks, detail::attention_grain(std::min(BK, g.tq) * g.tk * (g.d + g.dv)),
               [&](std::int64_t lo, std::int64_t hi) {
                 for (std::int64_t t = lo; t < hi; ++t) {
                   const std::int64_t i0 = t % blocks * BK;
                   const std::int64_t n = t / blocks;
                   detail::attention_rows<T>(g, n, q, k, v, i0, std::min(BK, g.tq - i0), out,
                                             lse ? lse + n * g.tq + i0 : nullptr);
                 }
               });
}

/// attention_forward's gradients for the output's gradient gy, given its output out (and, when
/// not null, the log-denominators it made): dq, dk and dv of each batch item, where g says
/// (packed per item, or in the heads layout at q, k and v's columns). Batch items run in
/// parallel.
template <class T> void attention_backward(const AttentionGeometry& g, const T* q, const T* k, const T* v, const T* out,
                                           const T* gy, T* grads, const T* lse = nullptr) {
  if (g.batch == 0) return;
  if (!g.grads_fill_buffer()) std::fill_n(grads, g.batch / g.heads * g.tq * g.width, T(0));
  if (g.grads_size() == 0) return;
  parallel_for(0, g.batch, detail::attention_grain(3 * g.tq * g.tk * (g.d + g.dv)),
               [&](std::int64_t lo, std::int64_t hi) {
                 for (std::int64_t n = lo; n < hi; ++n)
                   detail::attention_backward_item<T>(g, n, q, k, v, out, gy, grads, lse ? lse + n * g.tq : nullptr);
               });
}

// The instances xgrad::compiled holds (core/config.hpp), in src/kernels.cpp.
#define XGRAD_ATTENTION_INSTANCE(T, X)                                                                         \
  X void attention_forward<T>(const AttentionGeometry&, const T*, const T*, const T*, T*, T*);                 \
  X void attention_backward<T>(const AttentionGeometry&, const T*, const T*, const T*, const T*, const T*, T*, \
                               const T*);
#define XGRAD_ATTENTION_INSTANCES(X) XGRAD_FOR_EACH_FloatingPoint(XGRAD_ATTENTION_INSTANCE, X)
#if defined(XGRAD_COMPILED) && !defined(XGRAD_INSTANTIATE_ATTENTION)
XGRAD_ATTENTION_INSTANCES(extern template)
#endif

}  // namespace xgrad::cpu
