// xgrad CPU backend: 2-D max and average pooling kernels (forward and adjoints) on contiguous NCHW data.
#pragma once

#include <algorithm>
#include <array>
#include <cassert>
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <xsimd/xsimd.hpp>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "xgrad/backend/cpu/elementwise.hpp"
#include "xgrad/backend/cpu/thread_pool.hpp"
#include "xgrad/backend/pool_geometry.hpp"
#include "xgrad/core/device.hpp"

namespace xgrad::cpu {

namespace detail {

// Rough element-visit count below which splitting planes across threads does not pay.
inline constexpr int64_t k_pool_min_parallel_work = int64_t{1} << 12;

/// The in-bounds input indices [lo, hi) of the window of output index o along one axis
/// (empty, lo == hi, when the window lies entirely in the padding).
struct PoolSpan {
  int64_t lo, hi;

  int64_t size() const { return hi - lo; }
};

XGRAD_HD inline PoolSpan pool_span(int64_t o, int64_t stride, int64_t pad, int64_t k, int64_t in) {
  const int64_t start = o * stride - pad;
  const int64_t lo = std::clamp<int64_t>(start, 0, in);
  return {lo, std::clamp<int64_t>(start + k, lo, in)};
}

// Input elements one pass of the window reductions covers (whole planes, at least one): its
// working buffers, four of this size, stay in L2.
inline constexpr int64_t k_pool_chunk_elements = int64_t{1} << 13;

/// The output indices along one axis whose window lies wholly inside the input (the others
/// are edges, done one by one).
inline PoolSpan pool_interior(int64_t out, int64_t in, int64_t k, int64_t stride, int64_t pad) {
  const int64_t lo = std::min(out, (pad + stride - 1) / stride);
  if (in < k) return {lo, lo};
  return {lo, std::clamp((in - k + pad) / stride + 1, lo, out)};
}

/// Per-thread working buffers of the pooling kernels, one element per input element of a chunk.
template <class T> struct PoolScratch {
  std::vector<T> m_values, m_rows, m_win_rows, m_win_taps;

  explicit PoolScratch(int64_t elements)
      : m_values(static_cast<std::size_t>(elements)),
        m_rows(static_cast<std::size_t>(elements)),
        m_win_rows(static_cast<std::size_t>(elements)),
        m_win_taps(static_cast<std::size_t>(elements)) {}
};

/// Runs f(first, count, scratch) over chunks of consecutive (n, c) planes, in parallel when the
/// work is large; scratch is a PoolScratch<T> private to the calling thread.
template <class T, class F> void for_each_pool_chunk(const Pool2dGeometry& g, F&& f) {
  assert(g.stride_h > 0 && g.stride_w > 0);
  const int64_t planes = g.n * g.c;
  const int64_t plane = std::max<int64_t>(1, g.h * g.w);
  const int64_t per_plane = g.out_h * g.out_w * g.kw + plane;
  const int64_t grain = std::max<int64_t>(1, k_pool_min_parallel_work / per_plane);
  const int64_t chunk = std::max<int64_t>(1, k_pool_chunk_elements / plane);
  parallel_for(0, planes, grain, [&](int64_t lo, int64_t hi) {
    PoolScratch<T> scratch(std::min(chunk, hi - lo) * plane);
    for (int64_t p = lo; p < hi; p += chunk) f(p, std::min(chunk, hi - p), scratch);
  });
}

/// Calls body(i, V{}) for i in [0, n): V = xsimd::batch<T> at i = 0, lanes, ... while a whole
/// batch fits, then V = T for the rest. The bodies use only comparisons, selects and single
/// IEEE operations, so a lane gets the same bits whichever form computes it.
template <class T, class F> void for_batches(int64_t n, F&& body) {
  constexpr auto lanes = static_cast<int64_t>(xsimd::batch<T>::size);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) body(i, xsimd::batch<T>{});
  for (; i < n; ++i) body(i, T{});
}

template <class V, class T> V load_as(const T* p) {
  if constexpr (std::is_same_v<V, T>)
    return *p;
  else
    return V::load_unaligned(p);
}
template <class T> void store_as(T* p, T v) { *p = v; }
template <class T, class A> void store_as(T* p, const xsimd::batch<T, A>& v) { v.store_unaligned(p); }

template <class T> T pick(bool take, T a, T b) { return take ? a : b; }
template <class T, class A>
xsimd::batch<T, A> pick(const xsimd::batch_bool<T, A>& take, const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) {
  return xsimd::select(take, a, b);
}

/// Whether candidate v from row r replaces the best so far (best, from row best_r) when a
/// window is scanned column by column: a greater value, or an equal one from an earlier row,
/// so the first maximum in row-major order wins; a NaN beats every number and the first NaN
/// wins. Branch-free on scalars and batches alike: on real data each comparison is a coin flip.
/// (Forced inline: GCC otherwise calls it once per batch, passing the batches through memory.)
template <class V>
[[gnu::always_inline]] inline auto pool_takes(const V& v, const V& r, const V& best, const V& best_r) {
  using std::isnan;
  using xsimd::isnan;
  const auto earlier = r < best_r;
  return (v > best) | ((v == best) & earlier) | (isnan(v) & (earlier | !isnan(best)));
}
/// pool_takes for a candidate from a later row than the best's: only a greater value, or the
/// first NaN, replaces it.
template <class V> [[gnu::always_inline]] inline auto pool_takes_later(const V& v, const V& best) {
  using std::isnan;
  using xsimd::isnan;
  return (v > best) | (isnan(v) & !isnan(best));
}

/// Sum divided by the in-bounds count, the reduction of average pooling.
struct PoolAvgOp {
  template <class V> static V combine(const V& acc, const V& v) { return acc + v; }
  template <class V, class T> static V finish(const V& v, T count) { return v / V(count); }
};

/// Visits the outputs of `count` consecutive planes, o being an output's index from the first
/// plane's start: interior(o, f, base) for an output whose window lies inside its plane, f being the
/// index of the window's top-left element from the first plane's start, and edge(o, base, rows,
/// cols) for the others, with their plane's first index and the window's in-bounds spans.
template <class Interior, class Edge>
void for_each_pool_output(const Pool2dGeometry& g, int64_t count, Interior&& interior, Edge&& edge) {
  const PoolSpan in_h = pool_interior(g.out_h, g.h, g.kh, g.stride_h, g.pad_top);
  const PoolSpan in_w = pool_interior(g.out_w, g.w, g.kw, g.stride_w, g.pad_left);
  int64_t o = 0;
  for (int64_t p = 0; p < count; ++p) {
    const int64_t base = p * g.h * g.w;
    for (int64_t oh = 0; oh < g.out_h; ++oh, o += g.out_w) {
      const PoolSpan rows = pool_span(oh, g.stride_h, g.pad_top, g.kh, g.h);
      auto edges = [&](int64_t lo, int64_t hi) {
        for (int64_t ow = lo; ow < hi; ++ow) edge(o + ow, base, rows, pool_span(ow, g.stride_w, g.pad_left, g.kw, g.w));
      };
      if (oh < in_h.lo || oh >= in_h.hi) {
        edges(0, g.out_w);
        continue;
      }
      edges(0, in_w.lo);
      const int64_t f = base + (oh * g.stride_h - g.pad_top) * g.w - g.pad_left;
      for (int64_t ow = in_w.lo; ow < in_w.hi; ++ow) interior(o + ow, f + ow * g.stride_w, base);
      edges(in_w.hi, g.out_w);
    }
  }
}

/// The window reduction of `count` consecutive planes of x into y (their outputs). The chunk is reduced as one flat
/// array: each element first combines the kh elements below it (every kernel row, top to bottom), then the kw results
/// to its right (left to right), so an output's window is the result at its top-left element. Edge windows combine
/// their in-bounds part in the same order.
template <class Op, class T>
void pool_reduce_chunk(const Pool2dGeometry& g, const T* x, int64_t count, PoolScratch<T>& s, T* y) {
  const int64_t size = count * g.h * g.w;
  const T* cols = x;
  const int64_t down = size - (g.kh - 1) * g.w;  // elements with kh rows below them
  if (g.kh > 1 && down > 0) {
    T* acc = s.m_values.data();
    for_batches<T>(down, [&]<class V>(int64_t i, V) {
      V v = load_as<V>(x + i);
      for (int64_t ki = 1; ki < g.kh; ++ki) v = Op::combine(v, load_as<V>(x + i + ki * g.w));
      store_as(acc + i, v);
    });
    cols = acc;
  }
  T* win = s.m_win_rows.data();
  for_batches<T>(down - (g.kw - 1), [&]<class V>(int64_t i, V) {
    V v = load_as<V>(cols + i);
    for (int64_t kj = 1; kj < g.kw; ++kj) v = Op::combine(v, load_as<V>(cols + i + kj));
    store_as(win + i, v);
  });

  const T full = static_cast<T>(g.kh * g.kw);
  for_each_pool_output(
      g, count, [&](int64_t o, int64_t f, int64_t) { y[o] = Op::finish(win[f], full); },
      [&](int64_t o, int64_t base, PoolSpan rows, PoolSpan span) {
        T& out = y[o];
        if (rows.size() == 0 || span.size() == 0) {
          out = T(0);
          return;
        }
        const T* xp = x + base;
        T acc{};
        for (int64_t iw = span.lo; iw < span.hi; ++iw) {
          T v = xp[rows.lo * g.w + iw];
          for (int64_t ih = rows.lo + 1; ih < rows.hi; ++ih) v = Op::combine(v, xp[ih * g.w + iw]);
          acc = iw == span.lo ? v : Op::combine(acc, v);
        }
        out = Op::finish(acc, static_cast<T>(rows.size() * span.size()));
      });
}

/// Calls emit(o, a) for each output o of `count` planes of x (counted from the first plane's
/// start) with the offset a in its plane of the first maximum, in row-major order, of its
/// window, or a = -1 for an empty window. A NaN beats every number, so it propagates as in PyTorch;
/// the first NaN wins. Separable as pool_reduce_chunk is: each element first finds the first
/// maximum of the kh elements below it, then each window compares its columns' results.
template <class T, class Emit>
void max_pool_argmax_chunk(const Pool2dGeometry& g, const T* x, int64_t count, PoolScratch<T>& s, Emit&& emit) {
  assert(g.kh <= (int64_t{1} << 24) && g.kw <= (int64_t{1} << 24));  // offsets must stay exact in T
  const int64_t size = count * g.h * g.w;
  const int64_t down = size - (g.kh - 1) * g.w;
  T* val = s.m_values.data();
  T* row = s.m_rows.data();
  for_batches<T>(down, [&]<class V>(int64_t i, V) {
    V best = load_as<V>(x + i), best_r(T(0));
    for (int64_t ki = 1; ki < g.kh; ++ki) {
      const V v = load_as<V>(x + i + ki * g.w);
      const auto take = pool_takes_later(v, best);
      best = pick(take, v, best);
      best_r = pick(take, V(static_cast<T>(ki)), best_r);
    }
    store_as(val + i, best);
    store_as(row + i, best_r);
  });
  T* win_row = s.m_win_rows.data();
  T* win_tap = s.m_win_taps.data();
  for_batches<T>(down - (g.kw - 1), [&]<class V>(int64_t i, V) {
    V best = load_as<V>(val + i), best_r = load_as<V>(row + i), best_tap(T(0));
    for (int64_t kj = 1; kj < g.kw; ++kj) {
      const V v = load_as<V>(val + i + kj), r = load_as<V>(row + i + kj);
      const auto take = pool_takes(v, r, best, best_r);
      best = pick(take, v, best);
      best_r = pick(take, r, best_r);
      best_tap = pick(take, V(static_cast<T>(kj)), best_tap);
    }
    store_as(win_row + i, best_r);
    store_as(win_tap + i, best_tap);
  });

  for_each_pool_output(
      g, count,
      [&](int64_t o, int64_t f, int64_t base) {
        emit(o, f - base + static_cast<int64_t>(win_row[f]) * g.w + static_cast<int64_t>(win_tap[f]));
      },
      [&](int64_t o, int64_t base, PoolSpan rows, PoolSpan span) {
        if (rows.size() == 0 || span.size() == 0) {
          emit(o, int64_t{-1});
          return;
        }
        const T* xp = x + base;
        T best{}, best_r{};
        int64_t best_col = span.lo;
        for (int64_t iw = span.lo; iw < span.hi; ++iw) {
          T v = xp[rows.lo * g.w + iw], r = static_cast<T>(rows.lo);
          for (int64_t ih = rows.lo + 1; ih < rows.hi; ++ih) {
            const T c = xp[ih * g.w + iw];
            if (pool_takes(c, static_cast<T>(ih), v, r)) {
              v = c;
              r = static_cast<T>(ih);
            }
          }
          if (iw == span.lo || pool_takes(v, r, best, best_r)) {
            best = v;
            best_r = r;
            best_col = iw;
          }
        }
        emit(o, static_cast<int64_t>(best_r) * g.w + best_col);
      });
}

/// Whether the pooling is 2 x 2 windows at stride 2 without padding, each output reading its
/// own four inputs (the common down-sampling, LeNet's and VGG's): max_pool_argmax_2x2 serves it.
inline bool pool_is_2x2(const Pool2dGeometry& g) {
  return g.kh == 2 && g.kw == 2 && g.stride_h == 2 && g.stride_w == 2 && g.pad_top == 0 && g.pad_left == 0 &&
         g.out_h == g.h / 2 && g.out_w == g.w / 2 && g.h * g.w < (int64_t{1} << 24);
}

/// The first maximum, in row-major order, of the window whose top-left element is at x (rows w apart),
/// as its offset from x: the scalar form of max_pool_argmax_2x2's lanes.
template <class T> int32_t first_max_2x2(const T* x, int64_t w) {
  int64_t best = 0;
  for (int64_t o : {int64_t{1}, w, w + 1})
    if (pool_takes_later(x[o], x[best])) best = o;
  return static_cast<int32_t>(best);
}

#if defined(__AVX512F__)
/// Whether deinterleave serves xsimd::batch<T>: AVX-512's two-source permute (xsimd 8 has none;
/// nor do its other targets than AVX2, below, have a deinterleave).
template <class T> inline constexpr bool has_deinterleave = sizeof(xsimd::batch<T>) == 64;

/// The even lanes of the 2L lanes (a, b) in order, and the odd ones.
inline std::array<xsimd::batch<float>, 2> deinterleave(const xsimd::batch<float>& a, const xsimd::batch<float>& b) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  return {_mm512_permutex2var_ps(a, even, b), _mm512_permutex2var_ps(a, odd, b)};
}
inline std::array<xsimd::batch<double>, 2> deinterleave(const xsimd::batch<double>& a, const xsimd::batch<double>& b) {
  const __m512i even = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
  const __m512i odd = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
  return {_mm512_permutex2var_pd(a, even, b), _mm512_permutex2var_pd(a, odd, b)};
}
#elif defined(__AVX2__)
/// Whether deinterleave serves xsimd::batch<T>: AVX2's in-lane shuffles and a cross-lane permute.
template <class T> inline constexpr bool has_deinterleave = sizeof(xsimd::batch<T>) == 32;

/// The even lanes of the 2L lanes (a, b) in order, and the odd ones: each 128-bit half shuffled
/// to [a's evens, b's evens] (odds alike), then the halves' middle quarters swapped.
inline std::array<xsimd::batch<float>, 2> deinterleave(const xsimd::batch<float>& a, const xsimd::batch<float>& b) {
  const __m256 even = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
  const __m256 odd = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
  constexpr int order = _MM_SHUFFLE(3, 1, 2, 0);
  return {_mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(even), order)),
          _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(odd), order))};
}
inline std::array<xsimd::batch<double>, 2> deinterleave(const xsimd::batch<double>& a, const xsimd::batch<double>& b) {
  constexpr int order = _MM_SHUFFLE(3, 1, 2, 0);
  return {_mm256_permute4x64_pd(_mm256_unpacklo_pd(a, b), order),
          _mm256_permute4x64_pd(_mm256_unpackhi_pd(a, b), order)};
}
#else
template <class T> inline constexpr bool has_deinterleave = false;
template <class V> std::array<V, 2> deinterleave(const V&, const V&) { return {}; }
#endif

/// Where max_pool_argmax_2x2 reads its input: rows `row` elements apart and planes `plane`
/// apart (g.w and g.h * g.w for a dense tensor; a convolution's rows on its input's grid are
/// wider). x_end bounds what may be read. The argmax is an offset in the dense plane whatever
/// the layout.
template <class T> struct PoolInput {
  const T* x;
  const T* x_end;
  int64_t row, plane;
};

/// max_pool2d_argmax for pool_is_2x2 on planes [first, first + count), and when `values` is
/// given each window's maximum there too. Each column of a row pair keeps its first maximum of
/// the two rows; then each window's left column meets its right one: with AVX-512 or AVX2, 2L
/// columns are split into their even and odd columns (L windows a step); elsewhere the odd lanes are
/// swapped beside the even ones and the even lanes' results gathered to the front (L / 2
/// windows a step). Narrow rows run into the next rows' elements, whose windows are stored over
/// later; a step that would read past x_end goes scalar.
template <class T> void max_pool_argmax_2x2(const Pool2dGeometry& g, const PoolInput<T>& in, int64_t first,
                                            int64_t count, int32_t* idx, T* values, bool drop_nonpositive) {
  using V = xsimd::batch<T>;
  using U = xsimd::batch<xsimd::as_unsigned_integer_t<T>>;
  constexpr auto L = static_cast<int64_t>(V::size);
  // Rows of at most L / 2 windows fill no more of a 2L-column step.
  const bool wide = has_deinterleave<T> && g.out_w > L / 2;
  const int64_t step_columns = wide ? 2 * L : L;
  const int64_t step_windows = step_columns / 2;
  struct PairSwap {
    static constexpr unsigned get(unsigned i, unsigned) { return i ^ 1u; }
  };
  struct EvensFirst {
    static constexpr unsigned get(unsigned i, unsigned n) { return (2 * i) % n; }
  };
  const auto swap = xsimd::make_batch_constant<U, PairSwap>();
  const auto evens = xsimd::make_batch_constant<U, EvensFirst>();
  // The column of lane l's window's left element, from the step's first column.
  const V lane_column = wide ? lane_indices<V>() * V(T(2)) : lane_indices<V>();
  const V row_step(static_cast<T>(g.w)), zero(T(0)), one(T(1));
  const int64_t out_plane = g.out_h * g.out_w;
  const int64_t end_output = (first + count) * out_plane;
  // Stores the first `outputs` of a step's window offsets and maxima (in lanes [0, outputs)):
  // the whole vector when it stays within this call's outputs, as later steps store over the rest.
  auto store = [&](int64_t o, int64_t outputs, const V& offset, const V& value) {
    const bool whole = o + L <= end_output;
    if constexpr (sizeof(T) == sizeof(int32_t)) {
      if (whole) {
        xsimd::to_int(offset).store_unaligned(idx + o);
        if (values) value.store_unaligned(values + o);
        return;
      }
    }
    alignas(64) std::array<T, L> at, max;
    offset.store_aligned(at.data());
    value.store_aligned(max.data());
    for (int64_t t = 0; t < outputs; ++t) idx[o + t] = static_cast<int32_t>(at[t]);
    if (values) std::copy_n(max.data(), outputs, values + o);
  };
  for (int64_t p = first; p < first + count; ++p) {
    const T* xp = in.x + p * in.plane;
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      const T* top = xp + 2 * oh * in.row;
      for (int64_t ow = 0; ow < g.out_w; ow += step_windows) {
        const int64_t outputs = std::min(step_windows, g.out_w - ow);
        const int64_t o = p * out_plane + oh * g.out_w + ow;
        const int64_t col = 2 * ow;
        const T* a = top + col;
        auto scalar_step = [&] {
          for (int64_t t = 0; t < outputs; ++t) {
            const int32_t at = first_max_2x2(a + 2 * t, in.row);  // from the window's top left, as read
            const T max = a[2 * t + at];
            const int64_t lower = at >= in.row;
            idx[o + t] = drop_nonpositive && !(max > T(0))
                             ? -1
                             : static_cast<int32_t>((2 * oh + lower) * g.w + col + 2 * t + at - lower * in.row);
            if (values) values[o + t] = max;
          }
        };
        if (a + in.row + step_columns > in.x_end) {
          scalar_step();
          continue;
        }
        // Each column's maximum of its two rows, and that row's offset (0 or w); a tie keeps the
        // upper row, which comes first.
        auto column_max = [&](const V& upper, const V& lower, V& v, V& r) {
          const auto down = lower > upper;
          v = xsimd::select(down, lower, upper);
          r = xsimd::select(down, row_step, zero);
        };
        V left, left_r, right, right_r;
        if (wide) {
          const V u0 = V::load_unaligned(a), l0 = V::load_unaligned(a + in.row);
          const V u1 = V::load_unaligned(a + L), l1 = V::load_unaligned(a + in.row + L);
          // A NaN anywhere (or inf - inf, harmlessly) sends the step to the scalar rules.
          if (xsimd::any(xsimd::isnan((u0 + l0) + (u1 + l1)))) {
            scalar_step();
            continue;
          }
          V v0, r0, v1, r1;
          column_max(u0, l0, v0, r0);
          column_max(u1, l1, v1, r1);
          const auto [ve, vo] = deinterleave(v0, v1);
          const auto [re, ro] = deinterleave(r0, r1);
          left = ve, left_r = re, right = vo, right_r = ro;
        } else {
          const V u = V::load_unaligned(a), l = V::load_unaligned(a + in.row);
          if (xsimd::any(xsimd::isnan(u + l))) {
            scalar_step();
            continue;
          }
          column_max(u, l, left, left_r);
          right = xsimd::swizzle(left, swap), right_r = xsimd::swizzle(left_r, swap);
        }
        // The right column wins with a greater value, or an equal one in an earlier row.
        const auto takes_right = (right > left) | ((right == left) & (right_r < left_r));
        V offset =
            xsimd::select(takes_right, right_r + one, left_r) + lane_column + V(static_cast<T>(2 * oh * g.w + col));
        V value = xsimd::select(takes_right, right, left);
        if (drop_nonpositive) offset = xsimd::select(value > zero, offset, V(T(-1)));
        if (!wide) {
          offset = xsimd::swizzle(offset, evens);
          value = xsimd::swizzle(value, evens);
        }
        store(o, outputs, offset, value);
      }
    }
  }
}

/// For pool_is_2x2 with windows spanning at least `lanes` columns: calls vec(oh, col) for each
/// vector of input columns [col, col + lanes) of each output row's row pair within the windows
/// (the last one overlapping the one before when their width is not a multiple of lanes), or
/// one(oh, ow) for each of its windows when the vector would read more of the per-output arrays
/// than `outputs_left` (counted from the plane's start; a vector reads `lanes` of them).
template <class Vec, class One>
void for_each_pool_vector_2x2(const Pool2dGeometry& g, int64_t lanes, int64_t outputs_left, Vec&& vec, One&& one) {
  const int64_t width = 2 * g.out_w;
  for (int64_t oh = 0; oh < g.out_h; ++oh) {
    const int64_t row_outputs_left = outputs_left - oh * g.out_w;
    auto vector_or_windows = [&](int64_t col) {
      if (col / 2 + lanes <= row_outputs_left) return vec(oh, col);
      for (int64_t ow = col / 2; ow < (col + lanes) / 2; ++ow) one(oh, ow);
    };
    int64_t col = 0;
    for (; col + lanes <= width; col += lanes) vector_or_windows(col);
    if (col < width) vector_or_windows(width - lanes);
  }
}

/// max_pool2d_put for pool_is_2x2 on float, planes [first, first + count): each input element
/// is written once, a vector of a row pair at a time, to its window's gy where the argmax points
/// at it and to 0 elsewhere (gy and the argmax spread to both columns of their window in registers);
/// no separate zero fill, no scattered adds.
inline void max_pool_put_2x2(const Pool2dGeometry& g, const int32_t* idx, const float* gy, float* gx, int64_t first,
                             int64_t count, int64_t total_planes) {
  using V = xsimd::batch<float>;
  using I = xsimd::batch<int32_t>;
  using U = xsimd::batch<uint32_t>;
  constexpr auto L = static_cast<int64_t>(V::size);
  struct Spread {  // lanes 2i and 2i + 1 take lane i
    static constexpr unsigned get(unsigned i, unsigned) { return i / 2; }
  };
  const auto spread = xsimd::make_batch_constant<U, Spread>();
  const V lane = lane_indices<V>();
  const int64_t in_plane = g.h * g.w;
  const int64_t out_plane = g.out_h * g.out_w;
  for (int64_t p = first; p < first + count; ++p) {
    float* gp = gx + p * in_plane;
    const float* gyp = gy + p * out_plane;
    const int32_t* ip = idx + p * out_plane;
    for_each_pool_vector_2x2(
        g, L, (total_planes - p) * out_plane,
        [&](int64_t oh, int64_t col) {
          const int64_t o = oh * g.out_w + col / 2;
          const V pair_grad = xsimd::swizzle(V::load_unaligned(gyp + o), spread);
          const V pair_at = xsimd::swizzle(xsimd::to_float(I::load_unaligned(ip + o)), spread);
          const V top = lane + V(static_cast<float>(2 * oh * g.w + col));
          float* row = gp + 2 * oh * g.w + col;
          xsimd::select(pair_at == top, pair_grad, V(0.0f)).store_unaligned(row);
          xsimd::select(pair_at == top + V(static_cast<float>(g.w)), pair_grad, V(0.0f)).store_unaligned(row + g.w);
        },
        [&](int64_t oh, int64_t ow) {
          const int64_t o = oh * g.out_w + ow;
          const int64_t tl = 2 * oh * g.w + 2 * ow;
          for (int64_t at : {tl, tl + 1, tl + g.w, tl + g.w + 1}) gp[at] = ip[o] == at ? gyp[o] : 0.0f;
        });
    // Inputs no window covers: the last column and row of an odd width or height.
    for (int64_t ih = 0; ih < 2 * g.out_h; ++ih) std::fill(gp + ih * g.w + 2 * g.out_w, gp + (ih + 1) * g.w, 0.0f);
    std::fill(gp + 2 * g.out_h * g.w, gp + in_plane, 0.0f);
  }
}

}  // namespace detail

template <class T> void max_pool2d_take(const Pool2dGeometry& g, const int32_t* idx, const T* v, T* out);

/// idx[o] = the offset within its plane of window o's first maximum in x (a NaN beats every
/// number; padded positions never win), or -1 for an empty window; and when `values` is given,
/// values[o] = that maximum (0 for an empty window), as max_pool2d_take would. Max pooling is
/// max_pool2d_take(argmax, x), its gradient max_pool2d_put(argmax, gy): the argmax is found once.
/// With `drop_nonpositive`, idx[o] is -1 also where the maximum is not above 0 (NaN included):
/// a gradient put through it is then 0 there, as ReLU's before the pooling makes it.
template <class T> void max_pool2d_argmax(const Pool2dGeometry& g, const T* x, int32_t* idx, T* values = nullptr,
                                          bool drop_nonpositive = false) {
  assert(g.h * g.w <= INT32_MAX);
  const int64_t in_plane = g.h * g.w;
  const int64_t out_plane = g.out_h * g.out_w;
  if (detail::pool_is_2x2(g)) {
    const T* x_end = x + g.n * g.c * in_plane;
    parallel_for(0, g.n * g.c, std::max<int64_t>(1, detail::k_pool_min_parallel_work / std::max<int64_t>(1, in_plane)),
                 [&](int64_t lo, int64_t hi) {
                   detail::max_pool_argmax_2x2(g, detail::PoolInput<T>{x, x_end, g.w, in_plane}, lo, hi - lo, idx,
                                               values, drop_nonpositive);
                 });
    return;
  }
  detail::for_each_pool_chunk<T>(g, [&](int64_t first, int64_t count, detail::PoolScratch<T>& s) {
    int32_t* ic = idx + first * out_plane;
    detail::max_pool_argmax_chunk(g, x + first * in_plane, count, s,
                                  [&](int64_t o, int64_t a) { ic[o] = static_cast<int32_t>(a); });
  });
  if (values) max_pool2d_take(g, idx, x, values);
  if (drop_nonpositive) {
    const DropNonpositive<T> drop{x, idx, in_plane, out_plane};
    for (int64_t o = 0; o < g.n * g.c * out_plane; ++o) idx[o] = drop(o);
  }
}

/// out[o] = v[idx[o]] in o's plane (0 where idx is -1).
template <class T> void max_pool2d_take(const Pool2dGeometry& g, const int32_t* idx, const T* v, T* out) {
  const int64_t in_plane = g.h * g.w;
  const int64_t out_plane = g.out_h * g.out_w;
  parallel_for(0, g.n * g.c, std::max<int64_t>(1, detail::k_pool_min_parallel_work / std::max<int64_t>(1, out_plane)),
               [&](int64_t lo, int64_t hi) {
                 for (int64_t p = lo; p < hi; ++p) {
                   const T* vp = v + p * in_plane;
                   for (int64_t o = p * out_plane; o < (p + 1) * out_plane; ++o)
                     out[o] = idx[o] < 0 ? T(0) : vp[idx[o]];
                 }
               });
}

/// gx (input-shaped, overwritten) = 0 but gy[o] added at idx[o] of o's plane, in output order:
/// the adjoint of max_pool2d_take.
template <class T> void max_pool2d_put(const Pool2dGeometry& g, const int32_t* idx, const T* gy, T* gx) {
  const int64_t in_plane = g.h * g.w;
  const int64_t out_plane = g.out_h * g.out_w;
  const int64_t grain = std::max<int64_t>(1, detail::k_pool_min_parallel_work / std::max<int64_t>(1, in_plane));
  // Rows of a vector or more: written once, in vectors. Narrower ones: a fill and the adds.
  if constexpr (std::is_same_v<T, float>) {
    if (detail::pool_is_2x2(g) && 2 * g.out_w >= static_cast<int64_t>(xsimd::batch<float>::size)) {
      parallel_for(0, g.n * g.c, grain,
                   [&](int64_t lo, int64_t hi) { detail::max_pool_put_2x2(g, idx, gy, gx, lo, hi - lo, g.n * g.c); });
      return;
    }
  }
  parallel_for(0, g.n * g.c, grain, [&](int64_t lo, int64_t hi) {
    std::fill(gx + lo * in_plane, gx + hi * in_plane, T(0));
    for (int64_t p = lo; p < hi; ++p) {
      T* gp = gx + p * in_plane;
      for (int64_t o = p * out_plane; o < (p + 1) * out_plane; ++o)
        if (idx[o] >= 0) gp[idx[o]] += gy[o];
    }
  });
}

/// y = avg_pool2d(x), dividing by the number of in-bounds elements of each window
/// (count_include_pad = false). An empty window gives 0.
template <class T> void avg_pool2d_forward(const Pool2dGeometry& g, const T* x, T* y) {
  const int64_t in_plane = g.h * g.w;
  const int64_t out_plane = g.out_h * g.out_w;
  detail::for_each_pool_chunk<T>(g, [&](int64_t first, int64_t count, detail::PoolScratch<T>& s) {
    detail::pool_reduce_chunk<detail::PoolAvgOp>(g, x + first * in_plane, count, s, y + first * out_plane);
  });
}

/// gx (overwritten) = the adjoint of avg_pool2d_forward applied to gy: each gy is spread evenly
/// over the in-bounds elements of its window.
template <class T> void avg_pool2d_backward(const Pool2dGeometry& g, const T* gy, T* gx) {
  const int64_t in_plane = g.h * g.w;
  const int64_t out_plane = g.out_h * g.out_w;
  detail::for_each_pool_chunk<T>(g, [&](int64_t first, int64_t count, detail::PoolScratch<T>& s) {
    T* spread = s.m_values.data();
    for (int64_t p = first; p < first + count; ++p) {
      T* gxp = gx + p * in_plane;
      std::fill(gxp, gxp + in_plane, T(0));
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        const detail::PoolSpan rows = detail::pool_span(oh, g.stride_h, g.pad_top, g.kh, g.h);
        if (rows.size() == 0) continue;
        // Separable: spread this row of gy over the input columns once, then add the result
        // to every input row of the window.
        std::fill(spread, spread + g.w, T(0));
        const T* gyr = gy + p * out_plane + oh * g.out_w;
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          const detail::PoolSpan cols = detail::pool_span(ow, g.stride_w, g.pad_left, g.kw, g.w);
          if (cols.size() == 0) continue;
          const T share = gyr[ow] / static_cast<T>(rows.size() * cols.size());
          for (int64_t iw = cols.lo; iw < cols.hi; ++iw) spread[iw] += share;
        }
        for (int64_t ih = rows.lo; ih < rows.hi; ++ih) {
          T* gxr = gxp + ih * g.w;
          detail::for_batches<T>(g.w, [&]<class V>(int64_t i, V) {
            detail::store_as(gxr + i, detail::load_as<V>(gxr + i) + detail::load_as<V>(spread + i));
          });
        }
      }
    }
  });
}

}  // namespace xgrad::cpu
