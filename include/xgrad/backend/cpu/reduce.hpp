// Reduction kernels over an [outer, reduced, inner] view, vectorized along contiguous memory.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "xgrad/backend/cpu/elementwise.hpp"
#include "xgrad/backend/cpu/thread_pool.hpp"

namespace xgrad::cpu {

namespace detail {

/// Combines `n` contiguous elements into one value with op R.
template <class R, class T> T reduce_contiguous(const T* x, std::int64_t n) {
  std::int64_t i = 0;
  T acc = R::template identity<T>();
  if constexpr (simd_type<T>) {
    using B = xsimd::batch<T>;
    constexpr auto w = static_cast<std::int64_t>(B::size);
    if (n >= 4 * w) {
      // Four accumulators hide the add latency.
      B a0(acc), a1(acc), a2(acc), a3(acc);
      for (; i + 4 * w <= n; i += 4 * w) {
        a0 = R::combine(a0, B::load_unaligned(x + i));
        a1 = R::combine(a1, B::load_unaligned(x + i + w));
        a2 = R::combine(a2, B::load_unaligned(x + i + 2 * w));
        a3 = R::combine(a3, B::load_unaligned(x + i + 3 * w));
      }
      for (; i + w <= n; i += w) a0 = R::combine(a0, B::load_unaligned(x + i));
      acc = R::horizontal(R::combine(R::combine(a0, a1), R::combine(a2, a3)));
    }
  }
  for (; i < n; ++i) acc = R::combine(acc, x[i]);
  return acc;
}

/// acc[j] = combine(acc[j], x[j]) for j < n.
template <class R, class T> void combine_rows(T* acc, const T* x, std::int64_t n) {
  std::int64_t j = 0;
  if constexpr (simd_type<T>) {
    using B = xsimd::batch<T>;
    for (; j + static_cast<std::int64_t>(B::size) <= n; j += B::size)
      R::combine(B::load_unaligned(acc + j), B::load_unaligned(x + j)).store_unaligned(acc + j);
  }
  for (; j < n; ++j) acc[j] = R::combine(acc[j], x[j]);
}

}  // namespace detail

/// Elements per deterministic partial result of a full reduction.
inline constexpr std::int64_t kReduceChunk = 1 << 16;

/// The fewest columns a task of a reduction over a middle axis takes: four AVX-512 vectors of float.
inline constexpr std::int64_t kReduceColumns = 64;

/// y[o, j] = R-combination of x[o, r, j] over r, for x viewed as [outer, reduced, inner].
/// The result does not depend on the number of threads.
template <class R, class T>
void reduce(const T* x, T* y, std::int64_t outer, std::int64_t reduced, std::int64_t inner) {
  if (inner == 1 && outer == 1 && reduced > kReduceChunk) {
    std::int64_t chunks = (reduced + kReduceChunk - 1) / kReduceChunk;
    std::vector<T> partial(static_cast<std::size_t>(chunks));
    parallel_for(0, chunks, 1, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t c = lo; c < hi; ++c)
        partial[c] =
            detail::reduce_contiguous<R>(x + c * kReduceChunk, std::min(kReduceChunk, reduced - c * kReduceChunk));
    });
    y[0] = detail::reduce_contiguous<R>(partial.data(), chunks);
    return;
  }
  if (inner == 1) {
    const std::int64_t grain = std::max<std::int64_t>(1, kElementwiseGrain / std::max<std::int64_t>(reduced, 1));
    parallel_for(0, outer, grain, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t o = lo; o < hi; ++o) y[o] = detail::reduce_contiguous<R>(x + o * reduced, reduced);
    });
    return;
  }
  // Fewer slices than threads (a bias's gradient is one slice of [rows, columns]): each slice's
  // columns split in as many ranges, at least kReduceColumns wide, each read row by row. Each
  // column still combines its rows in order: the result does not depend on the split.
  const std::int64_t ranges =
      outer >= num_threads()
          ? 1
          : std::clamp<std::int64_t>(num_threads() / outer, 1, (inner + kReduceColumns - 1) / kReduceColumns);
  const std::int64_t width = ((inner + ranges - 1) / ranges + 15) / 16 * 16;
  const std::int64_t column_tasks = (inner + width - 1) / width;
  const std::int64_t grain =
      std::max<std::int64_t>(1, kElementwiseGrain / std::max<std::int64_t>(reduced * std::min(inner, width), 1));
  parallel_for(0, outer * column_tasks, grain, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t t = lo; t < hi; ++t) {
      const std::int64_t o = t / column_tasks, c = t % column_tasks * width;
      const std::int64_t n = std::min(width, inner - c);
      const T* src = x + o * reduced * inner + c;
      T* dst = y + o * inner + c;
      std::fill(dst, dst + n, R::template identity<T>());
      for (std::int64_t r = 0; r < reduced; ++r) detail::combine_rows<R>(dst, src + r * inner, n);
    }
  });
}

/// y[o, j] = index r of the largest x[o, r, j] (the first on ties; NaN counts as largest).
template <class T, class I>
void argmax(const T* x, I* y, std::int64_t outer, std::int64_t reduced, std::int64_t inner) {
  parallel_for(0, outer * inner, kElementwiseGrain, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t k = lo; k < hi; ++k) {
      std::int64_t o = k / inner, j = k % inner;
      const T* src = x + o * reduced * inner + j;
      std::int64_t best = 0;
      for (std::int64_t r = 1; r < reduced; ++r) {
        T v = src[r * inner], b = src[best * inner];
        if (v > b || (v != v && b == b)) best = r;
      }
      y[k] = static_cast<I>(best);
    }
  });
}

}  // namespace xgrad::cpu
