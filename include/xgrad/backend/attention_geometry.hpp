// The shape of a scaled dot-product attention, apart from its kernels: the op reads it
// (ops/nn-inl.hpp), and so do the CPU and Thrust kernels.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "xgrad/core/device.hpp"

namespace xgrad::cpu {

/// `batch` independent attentions of `tq` queries over `tk` keys: q [batch, tq, d], k [batch,
/// tk, d], v [batch, tk, dv] and out [batch, tq, dv], out = softmax(q k^T * scale) v. With
/// `causal`, query i sees key j only when j <= i + tk - tq: the queries are the newest tq
/// positions of the keys' sequence (the square case's lower triangle; with a cache of past keys,
/// the last query sees them all). A query that sees no key gets zeros.
///
/// `heads` > 0 is the heads layout, which the jit's layout pass (passes/layout.hpp) folds
/// MultiheadAttention's head split and merge into, so that neither is copied: item n is head
/// n % heads of sequence n / heads, q, k and v are column ranges of one [batch / heads, tq,
/// width] buffer (tq == tk), head h's at column q_column + h * d (k_column + h * d, v_column +
/// h * dv), and out is [batch / heads, tq, heads * dv], head h's at column h * dv. The gradients
/// are then one buffer like q's, each at its operand's columns, zero in any other column.
struct AttentionGeometry {
  std::int64_t batch = 0, tq = 0, tk = 0, d = 0, dv = 0;
  double scale = 1;
  bool causal = false;
  std::int64_t heads = 0, width = 0, q_column = 0, k_column = 0, v_column = 0;
  bool operator==(const AttentionGeometry&) const = default;

  /// One past the last key query i sees.
  XGRAD_HD std::int64_t key_end(std::int64_t i) const {
    if (!causal) return tk;
    const std::int64_t end = i + tk - tq + 1;
    return end < 0 ? 0 : (end < tk ? end : tk);
  }
  /// The first query that sees key j (tq when none does).
  XGRAD_HD std::int64_t query_begin(std::int64_t j) const {
    if (!causal) return 0;
    const std::int64_t begin = j - (tk - tq);
    return begin < 0 ? 0 : (begin < tq ? begin : tq);
  }
  /// Elements of one batch item's gradients in the standard layout, packed as dq [tq, d], dk
  /// [tk, d], dv [tk, dv].
  XGRAD_HD std::int64_t grads_size() const { return tq * d + tk * d + tk * dv; }

  /// Where one item's matrix of an operand lies: its first row, in elements from the buffer's
  /// start, and the distance between its rows.
  struct Rows {
    std::int64_t start, stride;
  };
  XGRAD_HD Rows q_rows(std::int64_t n) const { return heads ? in_heads(n, tq, q_column, d) : Rows{n * tq * d, d}; }
  XGRAD_HD Rows k_rows(std::int64_t n) const { return heads ? in_heads(n, tk, k_column, d) : Rows{n * tk * d, d}; }
  XGRAD_HD Rows v_rows(std::int64_t n) const { return heads ? in_heads(n, tk, v_column, dv) : Rows{n * tk * dv, dv}; }
  /// The output's, and its gradient's.
  XGRAD_HD Rows out_rows(std::int64_t n) const {
    return heads ? Rows{n / heads * tq * heads * dv + n % heads * dv, heads * dv} : Rows{n * tq * dv, dv};
  }
  /// The gradients', in their buffer.
  XGRAD_HD Rows dq_rows(std::int64_t n) const { return heads ? q_rows(n) : Rows{n * grads_size(), d}; }
  XGRAD_HD Rows dk_rows(std::int64_t n) const { return heads ? k_rows(n) : Rows{n * grads_size() + tq * d, d}; }
  XGRAD_HD Rows dv_rows(std::int64_t n) const {
    return heads ? v_rows(n) : Rows{n * grads_size() + tq * d + tk * d, dv};
  }
  /// True when the gradients write every element of their buffer (the heads layout's q, k and
  /// v columns leave none out).
  bool grads_fill_buffer() const {
    if (!heads) return true;
    std::array<std::array<std::int64_t, 2>, 3> ranges{
        {{q_column, heads * d}, {k_column, heads * d}, {v_column, heads * dv}}};
    std::sort(ranges.begin(), ranges.end());
    std::int64_t covered = 0;
    for (const auto& [begin, size] : ranges) {
      if (begin > covered) return false;
      covered = std::max(covered, begin + size);
    }
    return covered >= width;
  }

 private:
  XGRAD_HD Rows in_heads(std::int64_t n, std::int64_t t, std::int64_t column, std::int64_t size) const {
    return {n / heads * t * width + column + n % heads * size, width};
  }
};

}  // namespace xgrad::cpu
