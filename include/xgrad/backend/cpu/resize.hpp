// xgrad CPU backend: bilinear resize of contiguous NCHW data and its exact adjoint.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <vector>

#include "xgrad/backend/cpu/thread_pool.hpp"
#include "xgrad/core/device.hpp"

namespace xgrad::cpu {

namespace detail {

// Rough element count below which splitting planes across threads does not pay.
inline constexpr int64_t k_resize_min_parallel_work = int64_t{1} << 15;

/// One output coordinate reads in[i0] * w0 + in[i1] * w1.
template <class T> struct BilinearTap {
  int64_t i0, i1;
  T w0, w1;
};

/// Source taps along one axis. align_corners maps the corner pixel centres onto each other;
/// otherwise pixel centres sit at half-integers and the source coordinate is clamped at 0
/// (PyTorch's align_corners=False).
template <class T> std::vector<BilinearTap<T>> bilinear_taps(int64_t in, int64_t out, bool align_corners) {
  assert(in > 0 || out == 0);
  std::vector<BilinearTap<T>> taps(static_cast<std::size_t>(std::max<int64_t>(out, 0)));
  double scale = 0.0;
  if (align_corners)
    scale = out > 1 ? static_cast<double>(in - 1) / static_cast<double>(out - 1) : 0.0;
  else
    scale = out > 0 ? static_cast<double>(in) / static_cast<double>(out) : 0.0;
  for (int64_t d = 0; d < out; ++d) {
    double src = align_corners ? static_cast<double>(d) * scale : (static_cast<double>(d) + 0.5) * scale - 0.5;
    src = std::clamp(src, 0.0, static_cast<double>(in - 1));
    const int64_t i0 = static_cast<int64_t>(src);
    const int64_t i1 = std::min(i0 + 1, in - 1);
    const double lambda = src - static_cast<double>(i0);
    taps[static_cast<std::size_t>(d)] = {i0, i1, static_cast<T>(1.0 - lambda), static_cast<T>(lambda)};
  }
  return taps;
}

/// v * w, where a tap of weight 0 adds nothing: resizing onto a source pixel gives that pixel
/// even when its neighbour is infinite (inf * 0 would make it NaN).
template <class T> XGRAD_HD T weighted(T v, T w) { return w == T(0) ? T(0) : v * w; }

/// Runs f(plane) for every one of `planes` planes, in parallel when the work is large.
template <class F> void for_each_resize_plane(int64_t planes, int64_t work_per_plane, F&& f) {
  const int64_t grain = std::max<int64_t>(1, k_resize_min_parallel_work / std::max<int64_t>(work_per_plane, 1));
  parallel_for(0, planes, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) f(p);
  });
}

}  // namespace detail

/// y [n, c, out_h, out_w] (overwritten) = bilinear resize of x [n, c, h, w]. With align_corners
/// false, pixel centres are at half-integers and source coordinates are clamped at 0 (like
/// PyTorch's align_corners=False).
template <class T> void resize_bilinear_forward(int64_t n, int64_t c, int64_t h, int64_t w, int64_t out_h,
                                                int64_t out_w, bool align_corners, const T* x, T* y) {
  const int64_t out_plane = out_h * out_w;
  if (n * c == 0 || out_plane == 0) return;
  const auto th = detail::bilinear_taps<T>(h, out_h, align_corners);
  const auto tw = detail::bilinear_taps<T>(w, out_w, align_corners);
  detail::for_each_resize_plane(n * c, out_plane, [&](int64_t p) {
    const T* xp = x + p * h * w;
    T* yp = y + p * out_plane;
    for (int64_t oh = 0; oh < out_h; ++oh) {
      const auto& a = th[static_cast<std::size_t>(oh)];
      const T* r0 = xp + a.i0 * w;
      const T* r1 = xp + a.i1 * w;
      T* yrow = yp + oh * out_w;
      for (int64_t ow = 0; ow < out_w; ++ow) {
        const auto& b = tw[static_cast<std::size_t>(ow)];
        const T top = detail::weighted(r0[b.i0], b.w0) + detail::weighted(r0[b.i1], b.w1);
        const T bottom = detail::weighted(r1[b.i0], b.w0) + detail::weighted(r1[b.i1], b.w1);
        yrow[ow] = detail::weighted(top, a.w0) + detail::weighted(bottom, a.w1);
      }
    }
  });
}

/// gx [n, c, h, w] (overwritten) = the adjoint of resize_bilinear_forward applied to
/// gy [n, c, out_h, out_w]: each gy is spread onto its four source pixels with the forward weights.
template <class T> void resize_bilinear_backward(int64_t n, int64_t c, int64_t h, int64_t w, int64_t out_h,
                                                 int64_t out_w, bool align_corners, const T* gy, T* gx) {
  const int64_t in_plane = h * w;
  const int64_t out_plane = out_h * out_w;
  if (n * c == 0 || in_plane == 0) return;
  if (out_plane == 0) {
    std::fill(gx, gx + n * c * in_plane, T(0));
    return;
  }
  const auto th = detail::bilinear_taps<T>(h, out_h, align_corners);
  const auto tw = detail::bilinear_taps<T>(w, out_w, align_corners);
  detail::for_each_resize_plane(n * c, out_plane + in_plane, [&](int64_t p) {
    const T* gyp = gy + p * out_plane;
    T* gxp = gx + p * in_plane;
    std::fill(gxp, gxp + in_plane, T(0));
    for (int64_t oh = 0; oh < out_h; ++oh) {
      const auto& a = th[static_cast<std::size_t>(oh)];
      T* r0 = gxp + a.i0 * w;
      T* r1 = gxp + a.i1 * w;
      const T* grow = gyp + oh * out_w;
      for (int64_t ow = 0; ow < out_w; ++ow) {
        const auto& b = tw[static_cast<std::size_t>(ow)];
        const T top = detail::weighted(grow[ow], a.w0);
        const T bottom = detail::weighted(grow[ow], a.w1);
        r0[b.i0] += detail::weighted(top, b.w0);
        r0[b.i1] += detail::weighted(top, b.w1);
        r1[b.i0] += detail::weighted(bottom, b.w0);
        r1[b.i1] += detail::weighted(bottom, b.w1);
      }
    }
  });
}

}  // namespace xgrad::cpu
