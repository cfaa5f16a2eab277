// Device::thrust convolution and pooling. A convolution is im2col + GEMM: the input patches
// each output position reads become the columns of a matrix (col), and batched_gemm (cuBLAS on a
// GPU) multiplies it by the weights; its gradients are the transposed products, with col2im
// (im2col's adjoint, as a gather) back to the input. Pooling computes each output element from
// its window (gathers only: no atomics). The semantics are the cpu kernels' (backend/cpu/conv.hpp,
// pool.hpp): count_include_pad = false for averages, an empty window gives 0, and max pooling's
// argmax is the first maximum in row-major order, a NaN first.
#pragma once

#include <algorithm>
#include <cstdint>

#include <thrust/device_ptr.h>
#include <thrust/execution_policy.h>
#include <thrust/fill.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform.h>

#include "xgrad/backend/cpu/conv.hpp"
#include "xgrad/backend/cpu/pool.hpp"
#include "xgrad/backend/math.hpp"
#include "xgrad/backend/thrust/gemm.hpp"
#include "xgrad/backend/thrust/memory.hpp"

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

/// col[n][K = (ci, a, b)][P = (oh, ow)] for the images from `first`: the input element kernel
/// tap (ci, a, b) reads at output position (oh, ow), 0 in the padding.
template <class T> struct Im2ColFn {
  cpu::Conv2dGeometry g;
  const T* x;
  std::int64_t first;
  XGRAD_HD T operator()(std::int64_t i) const {
    const std::int64_t ow = i % g.out_w, oh = i / g.out_w % g.out_h, tap = i / (g.out_w * g.out_h);
    const std::int64_t b = tap % g.kw, a = tap / g.kw % g.kh, ci = tap / (g.kw * g.kh) % g.c_in,
                       n = first + tap / (g.kw * g.kh * g.c_in);
    const std::int64_t ih = oh * g.stride_h - g.pad_top + a * g.dil_h, iw = ow * g.stride_w - g.pad_left + b * g.dil_w;
    return ih < 0 || ih >= g.h || iw < 0 || iw >= g.w ? T(0) : x[((n * g.c_in + ci) * g.h + ih) * g.w + iw];
  }
};

/// gx[n, ci, ih, iw], n counted from the chunk's first image: the sum of the col entries im2col
/// fills from that input element (im2col's adjoint, gathered so no two threads write one element).
template <class T> struct Col2ImFn {
  cpu::Conv2dGeometry g;
  const T* col;
  XGRAD_HD T operator()(std::int64_t i) const {
    const std::int64_t iw = i % g.w, ih = i / g.w % g.h, ci = i / (g.w * g.h) % g.c_in, n = i / (g.w * g.h * g.c_in);
    const std::int64_t positions = g.out_h * g.out_w;
    T acc(0);
    for (std::int64_t a = 0; a < g.kh; ++a) {
      const std::int64_t th = ih + g.pad_top - a * g.dil_h;  // = oh * stride_h
      if (th < 0 || th % g.stride_h != 0 || th / g.stride_h >= g.out_h) continue;
      for (std::int64_t b = 0; b < g.kw; ++b) {
        const std::int64_t tw = iw + g.pad_left - b * g.dil_w;
        if (tw < 0 || tw % g.stride_w != 0 || tw / g.stride_w >= g.out_w) continue;
        const std::int64_t tap = (ci * g.kh + a) * g.kw + b;
        acc += col[(n * g.c_in * g.kh * g.kw + tap) * positions + th / g.stride_h * g.out_w + tw / g.stride_w];
      }
    }
    return acc;
  }
};

/// gw[j] = (gw[j] when accumulating) + the per-image partial products partial[n][j], in image order.
template <class T> struct SumImagesFn {
  const T* partial;
  T* gw;
  std::int64_t size, images;
  bool accumulate;
  XGRAD_HD void operator()(std::int64_t j) const {
    T acc = accumulate ? gw[j] : T(0);
    for (std::int64_t n = 0; n < images; ++n) acc += partial[n * size + j];
    gw[j] = acc;
  }
};

/// Calls f(first, count) for runs of images whose col matrices together stay under a budget, so
/// the scratch col buffer stays bounded however large the batch.
template <class F> void for_image_chunks(const cpu::Conv2dGeometry& g, F f) {
  constexpr std::int64_t kColBudget = std::int64_t{1} << 24;  // elements
  const std::int64_t per_image = std::max<std::int64_t>(1, g.c_in * g.kh * g.kw * g.out_h * g.out_w);
  const std::int64_t chunk = std::clamp<std::int64_t>(kColBudget / per_image, 1, std::max<std::int64_t>(1, g.n));
  for (std::int64_t first = 0; first < g.n; first += chunk) f(first, std::min(chunk, g.n - first));
}

/// The batch plan of `images` matrix products; a shared operand is the same matrix for all.
inline cpu::BroadcastPlan<2> image_batch(std::int64_t images, bool a_shared) {
  const Shape batch{images}, one{1};
  return cpu::BroadcastPlan<2>(batch, {a_shared ? &one : &batch, &batch});
}

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

/// The plane offset of window o's argmax (cpu::max_pool2d_argmax).
template <class T> struct MaxPoolArgmaxFn {
  cpu::Pool2dGeometry g;
  const T* x;
  XGRAD_HD std::int32_t operator()(std::int64_t i) const {
    const PoolWindow win = pool_window(g, i);
    return static_cast<std::int32_t>(window_argmax(g, x + win.plane * g.h * g.w, win));
  }
};

/// out[o] = v[idx[o]] in o's plane (cpu::max_pool2d_take).
template <class T> struct MaxPoolTakeFn {
  cpu::Pool2dGeometry g;
  const std::int32_t* idx;
  const T* v;
  XGRAD_HD T operator()(std::int64_t i) const {
    const std::int64_t plane = i / (g.out_h * g.out_w);
    return idx[i] < 0 ? T(0) : v[plane * g.h * g.w + idx[i]];
  }
};

/// gx[input] = sum of gy over the windows whose argmax it is, in output order (cpu::max_pool2d_put).
template <class T> struct MaxPoolPutFn {
  cpu::Pool2dGeometry g;
  const std::int32_t* idx;
  const T* gy;
  XGRAD_HD T operator()(std::int64_t i) const {
    const std::int64_t iw = i % g.w, ih = i / g.w % g.h, plane = i / (g.w * g.h);
    T acc(0);
    for_each_window_holding(g, plane, ih, iw, [&](std::int64_t o) {
      if (idx[o] == ih * g.w + iw) acc += gy[o];
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

/// Element i of y [n, c, plane] plus its channel's bias (none when null), through ReLU
/// (math::max(y, 0): NaN stays, -0 becomes +0).
template <class T> struct BiasReluFn {
  const T* y;
  const T* bias;
  std::int64_t c, plane;
  XGRAD_HD T operator()(std::int64_t i) const { return math::max(bias ? y[i] + bias[i / plane % c] : y[i], T(0)); }
};

}  // namespace detail

/// y[n] = w (c_out x K) @ col[n] (K x P), per chunk of images.
template <class T> void conv2d_forward(const cpu::Conv2dGeometry& g, const T* x, const T* w, T* y) {
  const std::int64_t taps = g.c_in * g.kh * g.kw, positions = g.out_h * g.out_w;
  detail::for_image_chunks(g, [&](std::int64_t first, std::int64_t images) {
    Scratch<T> col(static_cast<std::size_t>(images * taps * positions));
    detail::for_outputs(images * taps * positions, col.data(), detail::Im2ColFn<T>{g, x, first});
    batched_gemm(detail::image_batch(images, true), images, g.c_out, positions, taps, w, taps, 1, col.data(), positions,
                 1, y + first * g.c_out * positions);
  });
}

/// gcol[n] = w^T (K x c_out) @ gy[n] (c_out x P), then col2im into gx.
template <class T> void conv2d_backward_input(const cpu::Conv2dGeometry& g, const T* gy, const T* w, T* gx) {
  const std::int64_t taps = g.c_in * g.kh * g.kw, positions = g.out_h * g.out_w;
  detail::for_image_chunks(g, [&](std::int64_t first, std::int64_t images) {
    Scratch<T> col(static_cast<std::size_t>(images * taps * positions));
    batched_gemm(detail::image_batch(images, true), images, taps, positions, g.c_out, w, 1, taps,
                 gy + first * g.c_out * positions, positions, 1, col.data());
    detail::for_outputs(images * g.c_in * g.h * g.w, gx + first * g.c_in * g.h * g.w,
                        detail::Col2ImFn<T>{g, col.data()});
  });
}

/// gw = the sum over n of gy[n] (c_out x P) @ col[n]^T (P x K): per-image products, then their sum.
template <class T> void conv2d_backward_weight(const cpu::Conv2dGeometry& g, const T* x, const T* gy, T* gw) {
  const std::int64_t taps = g.c_in * g.kh * g.kw, positions = g.out_h * g.out_w, size = g.c_out * taps;
  if (g.n == 0) {
    thrust::fill_n(thrust::device, thrust::device_ptr<T>(gw), size, T(0));
    return;
  }
  detail::for_image_chunks(g, [&](std::int64_t first, std::int64_t images) {
    Scratch<T> col(static_cast<std::size_t>(images * taps * positions));
    Scratch<T> partial(static_cast<std::size_t>(images * size));
    detail::for_outputs(images * taps * positions, col.data(), detail::Im2ColFn<T>{g, x, first});
    batched_gemm(detail::image_batch(images, false), images, g.c_out, taps, positions, gy + first * g.c_out * positions,
                 positions, 1, col.data(), 1, positions, partial.data());
    thrust::counting_iterator<std::int64_t> begin(0);
    thrust::for_each(thrust::device, begin, begin + size,
                     detail::SumImagesFn<T>{partial.data(), gw, size, images, first > 0});
  });
}

template <class T> void max_pool2d_take(const cpu::Pool2dGeometry& g, const std::int32_t* idx, const T* v, T* out) {
  detail::for_outputs(g.n * g.c * g.out_h * g.out_w, out, detail::MaxPoolTakeFn<T>{g, idx, v});
}
/// cpu::max_pool2d_argmax: the window maxima, and the drop, by passes of their own.
template <class T> void max_pool2d_argmax(const cpu::Pool2dGeometry& g, const T* x, std::int32_t* idx,
                                          T* values = nullptr, bool drop_nonpositive = false) {
  const std::int64_t outputs = g.n * g.c * g.out_h * g.out_w;
  detail::for_outputs(outputs, idx, detail::MaxPoolArgmaxFn<T>{g, x});
  if (values) thrust_backend::max_pool2d_take(g, idx, x, values);
  if (drop_nonpositive)
    detail::for_outputs(outputs, idx, cpu::DropNonpositive<T>{x, idx, g.h * g.w, g.out_h * g.out_w});
}
template <class T> void max_pool2d_put(const cpu::Pool2dGeometry& g, const std::int32_t* idx, const T* gy, T* gx) {
  detail::for_outputs(g.n * g.c * g.h * g.w, gx, detail::MaxPoolPutFn<T>{g, idx, gy});
}
/// The convolution's gradients through max pooling (cpu::conv2d_backward_input_pooled): the put
/// into scratch, then the dense kernels.
template <class T> void conv2d_backward_input_pooled(const cpu::Conv2dGeometry& g, const cpu::Pool2dGeometry& p,
                                                     const std::int32_t* idx, const T* gp, const T* w, T* gx) {
  Scratch<T> gy(static_cast<std::size_t>(p.n * p.c * p.h * p.w));
  thrust_backend::max_pool2d_put(p, idx, gp, gy.data());
  thrust_backend::conv2d_backward_input(g, gy.data(), w, gx);
}
template <class T> void conv2d_backward_weight_pooled(const cpu::Conv2dGeometry& g, const cpu::Pool2dGeometry& p,
                                                      const T* x, const std::int32_t* idx, const T* gp, T* gw) {
  Scratch<T> gy(static_cast<std::size_t>(p.n * p.c * p.h * p.w));
  thrust_backend::max_pool2d_put(p, idx, gp, gy.data());
  thrust_backend::conv2d_backward_weight(g, x, gy.data(), gw);
}
/// A convnet block's forward (cpu::conv2d_relu_max_pool): the convolution into scratch, its
/// bias and ReLU in place, then the pooling with its argmax keeping ReLU's mask.
template <class T> void conv2d_relu_max_pool(const cpu::Conv2dGeometry& g, const cpu::Pool2dGeometry& p, const T* x,
                                             const T* w, const T* bias, T* values, std::int32_t* idx) {
  const std::int64_t plane = g.out_h * g.out_w;
  const std::int64_t size = g.n * g.c_out * plane;
  Scratch<T> y(static_cast<std::size_t>(size));
  thrust_backend::conv2d_forward(g, x, w, y.data());
  detail::for_outputs(size, y.data(), detail::BiasReluFn<T>{y.data(), bias, g.c_out, plane});
  thrust_backend::max_pool2d_argmax(p, y.data(), idx, values, true);
}
template <class T> void avg_pool2d_forward(const cpu::Pool2dGeometry& g, const T* x, T* y) {
  detail::for_outputs(g.n * g.c * g.out_h * g.out_w, y, detail::AvgPoolFn<T>{g, x});
}
template <class T> void avg_pool2d_backward(const cpu::Pool2dGeometry& g, const T* gy, T* gx) {
  detail::for_outputs(g.n * g.c * g.h * g.w, gx, detail::AvgPoolBackwardFn<T>{g, gy});
}

}  // namespace xgrad::thrust_backend
