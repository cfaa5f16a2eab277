// The shape of a scaled dot-product attention, apart from its kernels: the op reads it
// (ops/nn-inl.hpp), and so do the CPU and Thrust kernels.
#pragma once

#include <cstdint>

#include "xgrad/core/device.hpp"

namespace xgrad::cpu {

/// `batch` independent attentions of `tq` queries over `tk` keys: q [batch, tq, d], k [batch,
/// tk, d], v [batch, tk, dv] and out [batch, tq, dv], out = softmax(q k^T * scale) v. With
/// `causal`, query i sees key j only when j <= i + tk - tq: the queries are the newest tq
/// positions of the keys' sequence (the square case's lower triangle; with a cache of past keys,
/// the last query sees them all). A query that sees no key gets zeros.
struct AttentionGeometry {
  std::int64_t batch = 0, tq = 0, tk = 0, d = 0, dv = 0;
  double scale = 1;
  bool causal = false;
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
  /// Elements of one batch item's gradients, packed as dq [tq, d], dk [tk, d], dv [tk, dv].
  XGRAD_HD std::int64_t grads_size() const { return tq * d + tk * d + tk * dv; }
};

}  // namespace xgrad::cpu
