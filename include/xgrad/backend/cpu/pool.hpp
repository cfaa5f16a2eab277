// xgrad CPU backend: 2-D max and average pooling kernels (forward and adjoints) on contiguous NCHW data.
#pragma once

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "xgrad/backend/cpu/thread_pool.hpp"

namespace xgrad::cpu {

/// Geometry of one 2-D pooling. x is [n, c, h, w] and y is [n, c, out_h, out_w]. Bottom/right
/// padding is implied by out_h/out_w, which the caller computes.
struct Pool2dGeometry {
  int64_t n, c, h, w, kh, kw, stride_h, stride_w, pad_top, pad_left, out_h, out_w;
};

namespace detail {

// Rough element-visit count below which splitting planes across threads does not pay.
inline constexpr int64_t k_pool_min_parallel_work = int64_t{1} << 15;

/// The in-bounds input indices [lo, hi) of the window of output index o along one axis
/// (empty, lo == hi, when the window lies entirely in the padding).
struct PoolSpan {
  int64_t lo, hi;

  int64_t size() const { return hi - lo; }
};

inline PoolSpan pool_span(int64_t o, int64_t stride, int64_t pad, int64_t k, int64_t in) {
  const int64_t start = o * stride - pad;
  const int64_t lo = std::clamp<int64_t>(start, 0, in);
  return {lo, std::clamp<int64_t>(start + k, lo, in)};
}

/// Per-thread working rows for the pooling kernels.
template <class T> struct PoolScratch {
  std::vector<T> m_values;        // one per input column
  std::vector<T> m_rows;          // one per input column: a row index, held as T for SIMD (exact below 2^24)
  std::vector<int64_t> m_argmax;  // one per output column

  explicit PoolScratch(const Pool2dGeometry& g)
      : m_values(static_cast<std::size_t>(g.w)),
        m_rows(static_cast<std::size_t>(g.w)),
        m_argmax(static_cast<std::size_t>(g.out_w)) {}
};

/// Runs f(plane, scratch) for every (n, c) plane index, in parallel when the work is large;
/// scratch is a PoolScratch<T> private to the calling thread.
template <class T, class F> void for_each_pool_plane(const Pool2dGeometry& g, F&& f) {
  assert(g.stride_h > 0 && g.stride_w > 0);
  const int64_t planes = g.n * g.c;
  const int64_t per_plane = std::max<int64_t>(1, g.out_h * g.out_w * g.kw + g.h * g.w);
  const int64_t grain = std::max<int64_t>(1, k_pool_min_parallel_work / per_plane);
  parallel_for(0, planes, grain, [&](int64_t lo, int64_t hi) {
    PoolScratch<T> scratch(g);
    for (int64_t p = lo; p < hi; ++p) f(p, scratch);
  });
}

/// Fills s.m_argmax with the in-plane index of the first maximum (row-major order) of each
/// window of output row oh, or -1 for an empty window. A NaN beats every number, so it
/// propagates as in PyTorch; the first NaN wins. Separable: each input column first finds its
/// first maximum down the window's rows, then each output compares its window's columns.
template <class T> void max_pool_argmax_row(const Pool2dGeometry& g, const T* xp, int64_t oh, PoolScratch<T>& s) {
  int64_t* arg = s.m_argmax.data();
  const PoolSpan rows = pool_span(oh, g.stride_h, g.pad_top, g.kh, g.h);
  if (rows.size() == 0) {
    std::fill(arg, arg + g.out_w, int64_t{-1});
    return;
  }
  T* val = s.m_values.data();
  T* row = s.m_rows.data();
  assert(g.h <= (int64_t{1} << 24));  // row indices must stay exact in T
  std::copy(xp + rows.lo * g.w, xp + (rows.lo + 1) * g.w, val);
  std::fill(row, row + g.w, static_cast<T>(rows.lo));

  // Down the rows: a later row wins only when strictly greater, or when it brings the first NaN.
  using batch = xsimd::batch<T>;
  constexpr auto lanes = static_cast<int64_t>(batch::size);
  for (int64_t ih = rows.lo + 1; ih < rows.hi; ++ih) {
    const T* xr = xp + ih * g.w;
    const batch ih_b(static_cast<T>(ih));
    int64_t iw = 0;
    for (; iw + lanes <= g.w; iw += lanes) {
      const batch v = batch::load_unaligned(xr + iw);
      const batch cur = batch::load_unaligned(val + iw);
      const auto take = (v > cur) | (xsimd::isnan(v) & !xsimd::isnan(cur));
      xsimd::select(take, v, cur).store_unaligned(val + iw);
      xsimd::select(take, ih_b, batch::load_unaligned(row + iw)).store_unaligned(row + iw);
    }
    for (; iw < g.w; ++iw) {
      const T v = xr[iw];
      if (v > val[iw] || (std::isnan(v) && !std::isnan(val[iw]))) {
        val[iw] = v;
        row[iw] = static_cast<T>(ih);
      }
    }
  }

  // Across the columns, left to right, so equal candidates are split by row alone.
  for (int64_t ow = 0; ow < g.out_w; ++ow) {
    const PoolSpan cols = pool_span(ow, g.stride_w, g.pad_left, g.kw, g.w);
    if (cols.size() == 0) {
      arg[ow] = -1;
      continue;
    }
    int64_t best_col = cols.lo;
    T best_v = val[cols.lo];
    T best_row = row[cols.lo];
    for (int64_t iw = cols.lo + 1; iw < cols.hi; ++iw) {
      const T v = val[iw];
      const T r = row[iw];
      bool take = false;
      if (std::isnan(v) || std::isnan(best_v)) [[unlikely]]
        take = std::isnan(best_v) ? std::isnan(v) && r < best_row : true;
      else  // bitwise, to stay branch-free: on real data each comparison is a coin flip
        take = (v > best_v) | ((v == best_v) & (r < best_row));
      best_col = take ? iw : best_col;
      best_v = take ? v : best_v;
      best_row = take ? r : best_row;
    }
    arg[ow] = static_cast<int64_t>(best_row) * g.w + best_col;
  }
}

/// NaN-propagating maximum, the reduction of max pooling.
struct PoolMaxOp {
  template <class T> static T combine(T acc, T v) { return (v > acc || std::isnan(v)) ? v : acc; }
  template <class T, class A>
  static xsimd::batch<T, A> combine(const xsimd::batch<T, A>& acc, const xsimd::batch<T, A>& v) {
    return xsimd::select(v > acc || xsimd::isnan(v), v, acc);
  }
  template <class V, class T> static V finish(const V& v, T /*count*/) { return v; }
};

/// Sum divided by the in-bounds count, the reduction of average pooling.
struct PoolAvgOp {
  template <class V> static V combine(const V& acc, const V& v) { return acc + v; }
  template <class V, class T> static V finish(const V& v, T count) { return v / V(count); }
};

/// acc[i] = Op::combine(acc[i], row[i]) for i in [0, count).
template <class Op, class T> void pool_combine_rows(T* acc, const T* row, int64_t count) {
  using batch = xsimd::batch<T>;
  constexpr auto lanes = static_cast<int64_t>(batch::size);
  int64_t i = 0;
  for (; i + lanes <= count; i += lanes)
    Op::combine(batch::load_unaligned(acc + i), batch::load_unaligned(row + i)).store_unaligned(acc + i);
  for (; i < count; ++i) acc[i] = Op::combine(acc[i], row[i]);
}

/// One output row of a separable window reduction: the window's rows are first combined into
/// s.m_values (one value per input column), then each output combines its window's columns.
/// Empty windows give 0.
template <class Op, class T>
void pool_reduce_row(const Pool2dGeometry& g, const T* xp, int64_t oh, PoolScratch<T>& s, T* yrow) {
  const PoolSpan rows = pool_span(oh, g.stride_h, g.pad_top, g.kh, g.h);
  if (rows.size() == 0) {
    std::fill(yrow, yrow + g.out_w, T(0));
    return;
  }
  const T* cols = xp + rows.lo * g.w;
  if (rows.size() > 1) {
    T* acc = s.m_values.data();
    std::copy(cols, cols + g.w, acc);
    for (int64_t ih = rows.lo + 1; ih < rows.hi; ++ih) pool_combine_rows<Op>(acc, xp + ih * g.w, g.w);
    cols = acc;
  }

  auto scalar_output = [&](int64_t ow) {
    const PoolSpan span = pool_span(ow, g.stride_w, g.pad_left, g.kw, g.w);
    if (span.size() == 0) {
      yrow[ow] = T(0);
      return;
    }
    T acc = cols[span.lo];
    for (int64_t iw = span.lo + 1; iw < span.hi; ++iw) acc = Op::combine(acc, cols[iw]);
    yrow[ow] = Op::finish(acc, static_cast<T>(rows.size() * span.size()));
  };

  int64_t ow = 0;
  if (g.stride_w == 1) {
    // Interior outputs (whole window in bounds) are contiguous runs: do them lanes at a time.
    using batch = xsimd::batch<T>;
    constexpr auto lanes = static_cast<int64_t>(batch::size);
    const int64_t in_lo = std::min(g.pad_left, g.out_w);
    const int64_t in_hi = std::clamp(g.w - g.kw + g.pad_left + 1, in_lo, g.out_w);
    for (; ow < in_lo; ++ow) scalar_output(ow);
    const T count = static_cast<T>(rows.size() * g.kw);
    for (; ow + lanes <= in_hi; ow += lanes) {
      const T* base = cols + ow - g.pad_left;
      batch acc = batch::load_unaligned(base);
      for (int64_t kj = 1; kj < g.kw; ++kj) acc = Op::combine(acc, batch::load_unaligned(base + kj));
      Op::finish(acc, count).store_unaligned(yrow + ow);
    }
  }
  for (; ow < g.out_w; ++ow) scalar_output(ow);
}

}  // namespace detail

/// y = max_pool2d(x); padded positions never win and a NaN in a window propagates.
/// An empty (all-padding) window gives 0.
template <class T> void max_pool2d_forward(const Pool2dGeometry& g, const T* x, T* y) {
  const int64_t in_plane = g.h * g.w;
  const int64_t out_plane = g.out_h * g.out_w;
  detail::for_each_pool_plane<T>(g, [&](int64_t p, detail::PoolScratch<T>& s) {
    for (int64_t oh = 0; oh < g.out_h; ++oh)
      detail::pool_reduce_row<detail::PoolMaxOp>(g, x + p * in_plane, oh, s, y + p * out_plane + oh * g.out_w);
  });
}

/// gx (input-shaped, overwritten) receives each gy at the argmax position of its window in x
/// (first maximum on ties). This is the adjoint of max_pool2d_select, i.e. max pooling's backward.
template <class T> void max_pool2d_scatter(const Pool2dGeometry& g, const T* x, const T* gy, T* gx) {
  const int64_t in_plane = g.h * g.w;
  const int64_t out_plane = g.out_h * g.out_w;
  detail::for_each_pool_plane<T>(g, [&](int64_t p, detail::PoolScratch<T>& s) {
    T* gxp = gx + p * in_plane;
    std::fill(gxp, gxp + in_plane, T(0));
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      detail::max_pool_argmax_row(g, x + p * in_plane, oh, s);
      const T* gyr = gy + p * out_plane + oh * g.out_w;
      for (int64_t ow = 0; ow < g.out_w; ++ow)
        if (s.m_argmax[ow] >= 0) gxp[s.m_argmax[ow]] += gyr[ow];
    }
  });
}

/// out[o] = v[argmax position of window o in x]: v is input-shaped, out output-shaped
/// (overwritten). Linear in v; the adjoint of max_pool2d_scatter. select(x, x) == forward(x).
template <class T> void max_pool2d_select(const Pool2dGeometry& g, const T* x, const T* v, T* out) {
  const int64_t in_plane = g.h * g.w;
  const int64_t out_plane = g.out_h * g.out_w;
  detail::for_each_pool_plane<T>(g, [&](int64_t p, detail::PoolScratch<T>& s) {
    const T* vp = v + p * in_plane;
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      detail::max_pool_argmax_row(g, x + p * in_plane, oh, s);
      T* orow = out + p * out_plane + oh * g.out_w;
      for (int64_t ow = 0; ow < g.out_w; ++ow) orow[ow] = s.m_argmax[ow] < 0 ? T(0) : vp[s.m_argmax[ow]];
    }
  });
}

/// y = avg_pool2d(x), dividing by the number of in-bounds elements of each window
/// (count_include_pad = false). An empty window gives 0.
template <class T> void avg_pool2d_forward(const Pool2dGeometry& g, const T* x, T* y) {
  const int64_t in_plane = g.h * g.w;
  const int64_t out_plane = g.out_h * g.out_w;
  detail::for_each_pool_plane<T>(g, [&](int64_t p, detail::PoolScratch<T>& s) {
    for (int64_t oh = 0; oh < g.out_h; ++oh)
      detail::pool_reduce_row<detail::PoolAvgOp>(g, x + p * in_plane, oh, s, y + p * out_plane + oh * g.out_w);
  });
}

/// gx (overwritten) = the adjoint of avg_pool2d_forward applied to gy: each gy is spread evenly
/// over the in-bounds elements of its window.
template <class T> void avg_pool2d_backward(const Pool2dGeometry& g, const T* gy, T* gx) {
  const int64_t in_plane = g.h * g.w;
  const int64_t out_plane = g.out_h * g.out_w;
  detail::for_each_pool_plane<T>(g, [&](int64_t p, detail::PoolScratch<T>& s) {
    T* gxp = gx + p * in_plane;
    T* spread = s.m_values.data();
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
      for (int64_t ih = rows.lo; ih < rows.hi; ++ih)
        detail::pool_combine_rows<detail::PoolAvgOp>(gxp + ih * g.w, static_cast<const T*>(spread), g.w);
    }
  });
}

}  // namespace xgrad::cpu
