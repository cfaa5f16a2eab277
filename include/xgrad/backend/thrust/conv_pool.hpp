// Device::thrust convolution and pooling: each output element computed directly from its window
// (one functor call per element, gathers only: no atomics). The semantics are the cpu kernels'
// (backend/cpu/conv.hpp, pool.hpp): count_include_pad = false for averages, an empty window
// gives 0, and max pooling's argmax is the first maximum in row-major order, a NaN first.
#pragma once

#include <cstdint>

#include <thrust/device_ptr.h>
#include <thrust/execution_policy.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform.h>

#include "xgrad/backend/cpu/conv.hpp"
#include "xgrad/backend/cpu/pool.hpp"

namespace xgrad::thrust_backend {

namespace detail {

template <class T, class F> void for_outputs(std::int64_t count, T* out, F f) {
  thrust::counting_iterator<std::int64_t> first(0);
  thrust::transform(thrust::device, first, first + count, thrust::device_ptr<T>(out), f);
}

/// The first integer q >= 0 with q * stride >= v, for v possibly negative.
XGRAD_HD inline std::int64_t ceil_div_at_least_zero(std::int64_t v, std::int64_t stride) {
  return v <= 0 ? 0 : (v + stride - 1) / stride;
}

template <class T> struct ConvForwardFn {
  cpu::Conv2dGeometry g;
  const T *x, *w;
  XGRAD_HD T operator()(std::int64_t i) const {  // y[n, co, oh, ow]
    const std::int64_t ow = i % g.out_w, oh = i / g.out_w % g.out_h, co = i / (g.out_w * g.out_h) % g.c_out,
                       n = i / (g.out_w * g.out_h * g.c_out);
    T acc(0);
    for (std::int64_t ci = 0; ci < g.c_in; ++ci)
      for (std::int64_t a = 0; a < g.kh; ++a) {
        const std::int64_t ih = oh * g.stride_h - g.pad_top + a * g.dil_h;
        if (ih < 0 || ih >= g.h) continue;
        for (std::int64_t b = 0; b < g.kw; ++b) {
          const std::int64_t iw = ow * g.stride_w - g.pad_left + b * g.dil_w;
          if (iw < 0 || iw >= g.w) continue;
          acc += x[((n * g.c_in + ci) * g.h + ih) * g.w + iw] * w[((co * g.c_in + ci) * g.kh + a) * g.kw + b];
        }
      }
    return acc;
  }
};

template <class T> struct ConvBackwardInputFn {
  cpu::Conv2dGeometry g;
  const T *gy, *w;
  XGRAD_HD T operator()(std::int64_t i) const {  // gx[n, ci, ih, iw]
    const std::int64_t iw = i % g.w, ih = i / g.w % g.h, ci = i / (g.w * g.h) % g.c_in, n = i / (g.w * g.h * g.c_in);
    T acc(0);
    for (std::int64_t co = 0; co < g.c_out; ++co)
      for (std::int64_t a = 0; a < g.kh; ++a) {
        const std::int64_t th = ih + g.pad_top - a * g.dil_h;  // = oh * stride_h
        if (th < 0 || th % g.stride_h != 0 || th / g.stride_h >= g.out_h) continue;
        for (std::int64_t b = 0; b < g.kw; ++b) {
          const std::int64_t tw = iw + g.pad_left - b * g.dil_w;
          if (tw < 0 || tw % g.stride_w != 0 || tw / g.stride_w >= g.out_w) continue;
          acc += gy[((n * g.c_out + co) * g.out_h + th / g.stride_h) * g.out_w + tw / g.stride_w] *
                 w[((co * g.c_in + ci) * g.kh + a) * g.kw + b];
        }
      }
    return acc;
  }
};

template <class T> struct ConvBackwardWeightFn {
  cpu::Conv2dGeometry g;
  const T *x, *gy;
  XGRAD_HD T operator()(std::int64_t i) const {  // gw[co, ci, a, b]
    const std::int64_t b = i % g.kw, a = i / g.kw % g.kh, ci = i / (g.kw * g.kh) % g.c_in,
                       co = i / (g.kw * g.kh * g.c_in);
    T acc(0);
    for (std::int64_t n = 0; n < g.n; ++n)
      for (std::int64_t oh = 0; oh < g.out_h; ++oh) {
        const std::int64_t ih = oh * g.stride_h - g.pad_top + a * g.dil_h;
        if (ih < 0 || ih >= g.h) continue;
        for (std::int64_t ow = 0; ow < g.out_w; ++ow) {
          const std::int64_t iw = ow * g.stride_w - g.pad_left + b * g.dil_w;
          if (iw < 0 || iw >= g.w) continue;
          acc += gy[((n * g.c_out + co) * g.out_h + oh) * g.out_w + ow] * x[((n * g.c_in + ci) * g.h + ih) * g.w + iw];
        }
      }
    return acc;
  }
};

/// Window o's in-bounds rows and columns, and its plane, for pooling output index i.
struct PoolWindow {
  std::int64_t plane, row_lo, row_hi, col_lo, col_hi;
};
XGRAD_HD inline PoolWindow pool_window(const cpu::Pool2dGeometry& g, std::int64_t i) {
  const std::int64_t ow = i % g.out_w, oh = i / g.out_w % g.out_h, plane = i / (g.out_w * g.out_h);
  const auto rows = cpu::detail::pool_span(oh, g.stride_h, g.pad_top, g.kh, g.h);
  const auto cols = cpu::detail::pool_span(ow, g.stride_w, g.pad_left, g.kw, g.w);
  return {plane, rows.lo, rows.hi, cols.lo, cols.hi};
}

/// Calls f(o) for each output index o, in order, whose window holds input (ih, iw) of `plane`.
template <class F> XGRAD_HD void for_each_window_holding(const cpu::Pool2dGeometry& g, std::int64_t plane,
                                                         std::int64_t ih, std::int64_t iw, F&& f) {
  // Output rows whose window can hold row ih: oh * stride - pad <= ih < oh * stride - pad + kh.
  const std::int64_t oh_lo = ceil_div_at_least_zero(ih + g.pad_top - g.kh + 1, g.stride_h),
                     ow_lo = ceil_div_at_least_zero(iw + g.pad_left - g.kw + 1, g.stride_w);
  for (std::int64_t oh = oh_lo; oh < g.out_h && oh * g.stride_h - g.pad_top <= ih; ++oh)
    for (std::int64_t ow = ow_lo; ow < g.out_w && ow * g.stride_w - g.pad_left <= iw; ++ow)
      f((plane * g.out_h + oh) * g.out_w + ow);
}

/// Index within the plane of the first maximum of window `win` in row-major order (a NaN
/// before any number), or -1 for an empty window.
template <class T>
XGRAD_HD std::int64_t window_argmax(const cpu::Pool2dGeometry& g, const T* plane, const PoolWindow& win) {
  std::int64_t best = -1;
  for (std::int64_t ih = win.row_lo; ih < win.row_hi; ++ih)
    for (std::int64_t iw = win.col_lo; iw < win.col_hi; ++iw) {
      const std::int64_t k = ih * g.w + iw;
      const T v = plane[k];
      if (best < 0) {
        best = k;
        continue;
      }
      const T b = plane[best];
      if (b != b) continue;  // a NaN stays
      if (v > b || v != v) best = k;
    }
  return best;
}

template <class T> struct MaxPoolFn {
  cpu::Pool2dGeometry g;
  const T* x;
  XGRAD_HD T operator()(std::int64_t i) const {
    const PoolWindow win = pool_window(g, i);
    const T* plane = x + win.plane * g.h * g.w;
    const std::int64_t k = window_argmax(g, plane, win);
    return k < 0 ? T(0) : plane[k];
  }
};

/// out[o] = v[argmax of window o in x] (cpu::max_pool2d_select).
template <class T> struct MaxPoolSelectFn {
  cpu::Pool2dGeometry g;
  const T *x, *v;
  XGRAD_HD T operator()(std::int64_t i) const {
    const PoolWindow win = pool_window(g, i);
    const std::int64_t k = window_argmax(g, x + win.plane * g.h * g.w, win);
    return k < 0 ? T(0) : v[win.plane * g.h * g.w + k];
  }
};

/// gx[input] = sum of gy over the windows whose argmax it is, in output order
/// (cpu::max_pool2d_scatter).
template <class T> struct MaxPoolScatterFn {
  cpu::Pool2dGeometry g;
  const T *x, *gy;
  XGRAD_HD T operator()(std::int64_t i) const {
    const std::int64_t iw = i % g.w, ih = i / g.w % g.h, plane = i / (g.w * g.h);
    T acc(0);
    for_each_window_holding(g, plane, ih, iw, [&](std::int64_t o) {
      if (window_argmax(g, x + plane * g.h * g.w, pool_window(g, o)) == ih * g.w + iw) acc += gy[o];
    });
    return acc;
  }
};

/// The mean over each window's in-bounds elements, summed down each column then across.
template <class T> struct AvgPoolFn {
  cpu::Pool2dGeometry g;
  const T* x;
  XGRAD_HD T operator()(std::int64_t i) const {
    const PoolWindow win = pool_window(g, i);
    if (win.row_hi == win.row_lo || win.col_hi == win.col_lo) return T(0);
    const T* plane = x + win.plane * g.h * g.w;
    T acc(0);
    for (std::int64_t iw = win.col_lo; iw < win.col_hi; ++iw) {
      T v = plane[win.row_lo * g.w + iw];
      for (std::int64_t ih = win.row_lo + 1; ih < win.row_hi; ++ih) v += plane[ih * g.w + iw];
      acc = iw == win.col_lo ? v : acc + v;
    }
    return acc / static_cast<T>((win.row_hi - win.row_lo) * (win.col_hi - win.col_lo));
  }
};

/// gx[input] = sum over the windows holding it of gy / the window's in-bounds size.
template <class T> struct AvgPoolBackwardFn {
  cpu::Pool2dGeometry g;
  const T* gy;
  XGRAD_HD T operator()(std::int64_t i) const {
    const std::int64_t iw = i % g.w, ih = i / g.w % g.h, plane = i / (g.w * g.h);
    T acc(0);
    for_each_window_holding(g, plane, ih, iw, [&](std::int64_t o) {
      const PoolWindow win = pool_window(g, o);
      acc += gy[o] / static_cast<T>((win.row_hi - win.row_lo) * (win.col_hi - win.col_lo));
    });
    return acc;
  }
};

}  // namespace detail

template <class T> void conv2d_forward(const cpu::Conv2dGeometry& g, const T* x, const T* w, T* y) {
  detail::for_outputs(g.n * g.c_out * g.out_h * g.out_w, y, detail::ConvForwardFn<T>{g, x, w});
}
template <class T> void conv2d_backward_input(const cpu::Conv2dGeometry& g, const T* gy, const T* w, T* gx) {
  detail::for_outputs(g.n * g.c_in * g.h * g.w, gx, detail::ConvBackwardInputFn<T>{g, gy, w});
}
template <class T> void conv2d_backward_weight(const cpu::Conv2dGeometry& g, const T* x, const T* gy, T* gw) {
  detail::for_outputs(g.c_out * g.c_in * g.kh * g.kw, gw, detail::ConvBackwardWeightFn<T>{g, x, gy});
}
template <class T> void max_pool2d_forward(const cpu::Pool2dGeometry& g, const T* x, T* y) {
  detail::for_outputs(g.n * g.c * g.out_h * g.out_w, y, detail::MaxPoolFn<T>{g, x});
}
template <class T> void max_pool2d_scatter(const cpu::Pool2dGeometry& g, const T* x, const T* gy, T* gx) {
  detail::for_outputs(g.n * g.c * g.h * g.w, gx, detail::MaxPoolScatterFn<T>{g, x, gy});
}
template <class T> void max_pool2d_select(const cpu::Pool2dGeometry& g, const T* x, const T* v, T* out) {
  detail::for_outputs(g.n * g.c * g.out_h * g.out_w, out, detail::MaxPoolSelectFn<T>{g, x, v});
}
template <class T> void avg_pool2d_forward(const cpu::Pool2dGeometry& g, const T* x, T* y) {
  detail::for_outputs(g.n * g.c * g.out_h * g.out_w, y, detail::AvgPoolFn<T>{g, x});
}
template <class T> void avg_pool2d_backward(const cpu::Pool2dGeometry& g, const T* gy, T* gx) {
  detail::for_outputs(g.n * g.c * g.h * g.w, gx, detail::AvgPoolBackwardFn<T>{g, gy});
}

}  // namespace xgrad::thrust_backend
