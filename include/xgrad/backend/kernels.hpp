// Kernels that exist on every device, called with the device the data lives on: the cpu
// backend's, or with XGRAD_WITH_THRUST the Thrust backend's for Device::thrust.
#pragma once

#include <algorithm>
#include <cstdint>

#include "xgrad/backend/cpu/attention.hpp"
#include "xgrad/backend/cpu/conv.hpp"
#include "xgrad/backend/cpu/conv_pooled.hpp"
#include "xgrad/backend/cpu/copy.hpp"
#include "xgrad/backend/cpu/gemm.hpp"
#include "xgrad/backend/cpu/pool.hpp"
#include "xgrad/backend/cpu/reduce.hpp"
#include "xgrad/backend/cpu/resize.hpp"
#include "xgrad/backend/cpu/softmax_xent.hpp"
#include "xgrad/backend/math.hpp"
#include "xgrad/core/device.hpp"
#include "xgrad/core/dtype.hpp"
#if defined(XGRAD_WITH_THRUST)
#include "xgrad/backend/thrust/attention.hpp"
#include "xgrad/backend/thrust/conv_pool.hpp"
#include "xgrad/backend/thrust/copy.hpp"
#include "xgrad/backend/thrust/gemm.hpp"
#include "xgrad/backend/thrust/resize.hpp"
#include "xgrad/backend/thrust/softmax_xent.hpp"
#endif

namespace xgrad::kernels {

#if defined(XGRAD_WITH_THRUST)
#define XGRAD_ON_THRUST(device, call) \
  if ((device) == Device::thrust) return thrust_backend::call
#else
#define XGRAD_ON_THRUST(device, call) (void)(device)
#endif

/// See cpu::strided_copy.
template <class T> void strided_copy(Device device, const Shape& shape, const T* src, const cpu::Strides& src_strides,
                                     T* dst, const cpu::Strides& dst_strides) {
  XGRAD_ON_THRUST(device, strided_copy(shape, src, src_strides, dst, dst_strides));
  cpu::strided_copy(shape, src, src_strides, dst, dst_strides);
}

/// dst[i] = f(i) for i < n, in parallel; f is a host-and-device functor (XGRAD_HD).
template <class T, class F> void tabulate(Device device, T* dst, std::int64_t n, F f) {
  XGRAD_ON_THRUST(device, tabulate(dst, n, f));
  cpu::parallel_for(0, n, 1 << 15, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) dst[i] = f(i);
  });
}

/// f(i) for i < n, in parallel (on the cpu in chunks of at least `grain`); f is a host-and-device
/// functor (XGRAD_HD) whose calls write disjoint data.
template <class F> void for_each_index(Device device, std::int64_t n, std::int64_t grain, F f) {
  XGRAD_ON_THRUST(device, for_each_index(n, f));
  cpu::parallel_for(0, n, grain, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) f(i);
  });
}

template <class T> void fill(Device device, T* dst, std::int64_t n, T value) {
  XGRAD_ON_THRUST(device, fill(dst, n, value));
  std::fill_n(dst, n, value);
}

/// dst[i] = U(src[i]), defined for every value (math::convert: float to int saturates, NaN -> 0).
template <class U, class T> void cast(Device device, const T* src, U* dst, std::int64_t n) {
  XGRAD_ON_THRUST(device, cast(src, dst, n));
  for (std::int64_t i = 0; i < n; ++i) dst[i] = math::convert<U>(src[i]);
}

/// See cpu::reduce.
template <class R, class T>
void reduce(Device device, const T* x, T* y, std::int64_t outer, std::int64_t reduced, std::int64_t inner) {
  XGRAD_ON_THRUST(device, reduce<R>(x, y, outer, reduced, inner));
  cpu::reduce<R>(x, y, outer, reduced, inner);
}

/// See cpu::argmax.
template <class T, class I>
void argmax(Device device, const T* x, I* y, std::int64_t outer, std::int64_t reduced, std::int64_t inner) {
  XGRAD_ON_THRUST(device, argmax(x, y, outer, reduced, inner));
  cpu::argmax(x, y, outer, reduced, inner);
}

/// See cpu::batched_gemm; `done` (fusion's epilogue) is cpu only: on a device the fused group
/// runs after its anchor.
template <class T> void batched_gemm(Device device, const cpu::BroadcastPlan<2>& plan, std::int64_t count,
                                     std::int64_t m, std::int64_t n, std::int64_t k, const T* a, std::int64_t a_rs,
                                     std::int64_t a_cs, const T* b, std::int64_t b_rs, std::int64_t b_cs, T* c,
                                     const cpu::RangeDone* done) {
  XGRAD_ON_THRUST(device, batched_gemm(plan, count, m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c));
  cpu::batched_gemm(plan, count, m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c, done);
}

/// See cpu::conv2d_forward; `done` (fusion's epilogue, compiled graphs only) is cpu only.
template <class T> void conv2d_forward(Device device, const cpu::Conv2dGeometry& g, const T* x, const T* w, T* y,
                                       const cpu::RangeDone* done) {
  XGRAD_ON_THRUST(device, conv2d_forward(g, x, w, y));
  cpu::conv2d_forward(g, x, w, y, done);
}
template <class T>
void conv2d_backward_input(Device device, const cpu::Conv2dGeometry& g, const T* gy, const T* w, T* gx) {
  XGRAD_ON_THRUST(device, conv2d_backward_input(g, gy, w, gx));
  cpu::conv2d_backward_input(g, gy, w, gx);
}
template <class T>
void conv2d_backward_weight(Device device, const cpu::Conv2dGeometry& g, const T* x, const T* gy, T* gw) {
  XGRAD_ON_THRUST(device, conv2d_backward_weight(g, x, gy, gw));
  cpu::conv2d_backward_weight(g, x, gy, gw);
}
/// See cpu::conv2d_backward_input_pooled.
template <class T> void conv2d_backward_input_pooled(Device device, const cpu::Conv2dGeometry& g,
                                                     const cpu::Pool2dGeometry& p, const std::int32_t* idx, const T* gp,
                                                     const T* w, T* gx) {
  XGRAD_ON_THRUST(device, conv2d_backward_input_pooled(g, p, idx, gp, w, gx));
  cpu::conv2d_backward_input_pooled(g, p, idx, gp, w, gx);
}
/// See cpu::conv2d_backward_weight_pooled.
template <class T> void conv2d_backward_weight_pooled(Device device, const cpu::Conv2dGeometry& g,
                                                      const cpu::Pool2dGeometry& p, const T* x, const std::int32_t* idx,
                                                      const T* gp, T* gw) {
  XGRAD_ON_THRUST(device, conv2d_backward_weight_pooled(g, p, x, idx, gp, gw));
  cpu::conv2d_backward_weight_pooled(g, p, x, idx, gp, gw);
}
/// See cpu::max_pool2d_argmax.
template <class T> void max_pool2d_argmax(Device device, const cpu::Pool2dGeometry& g, const T* x, std::int32_t* idx,
                                          T* values = nullptr, bool drop_nonpositive = false) {
  XGRAD_ON_THRUST(device, max_pool2d_argmax(g, x, idx, values, drop_nonpositive));
  cpu::max_pool2d_argmax(g, x, idx, values, drop_nonpositive);
}
/// See cpu::conv2d_relu_max_pool.
template <class T> void conv2d_relu_max_pool(Device device, const cpu::Conv2dGeometry& g, const cpu::Pool2dGeometry& p,
                                             const T* x, const T* w, const T* bias, T* values, std::int32_t* idx) {
  XGRAD_ON_THRUST(device, conv2d_relu_max_pool(g, p, x, w, bias, values, idx));
  cpu::conv2d_relu_max_pool(g, p, x, w, bias, values, idx);
}
template <class T>
void max_pool2d_take(Device device, const cpu::Pool2dGeometry& g, const std::int32_t* idx, const T* v, T* out) {
  XGRAD_ON_THRUST(device, max_pool2d_take(g, idx, v, out));
  cpu::max_pool2d_take(g, idx, v, out);
}
template <class T>
void max_pool2d_put(Device device, const cpu::Pool2dGeometry& g, const std::int32_t* idx, const T* gy, T* gx) {
  XGRAD_ON_THRUST(device, max_pool2d_put(g, idx, gy, gx));
  cpu::max_pool2d_put(g, idx, gy, gx);
}
template <class T> void avg_pool2d_forward(Device device, const cpu::Pool2dGeometry& g, const T* x, T* y) {
  XGRAD_ON_THRUST(device, avg_pool2d_forward(g, x, y));
  cpu::avg_pool2d_forward(g, x, y);
}
template <class T> void avg_pool2d_backward(Device device, const cpu::Pool2dGeometry& g, const T* gy, T* gx) {
  XGRAD_ON_THRUST(device, avg_pool2d_backward(g, gy, gx));
  cpu::avg_pool2d_backward(g, gy, gx);
}

/// See cpu::resize_bilinear_forward.
template <class T> void resize_bilinear_forward(Device device, std::int64_t n, std::int64_t c, std::int64_t h,
                                                std::int64_t w, std::int64_t out_h, std::int64_t out_w,
                                                bool align_corners, const T* x, T* y) {
  XGRAD_ON_THRUST(device, resize_bilinear_forward(n, c, h, w, out_h, out_w, align_corners, x, y));
  cpu::resize_bilinear_forward(n, c, h, w, out_h, out_w, align_corners, x, y);
}
/// See cpu::resize_bilinear_backward.
template <class T> void resize_bilinear_backward(Device device, std::int64_t n, std::int64_t c, std::int64_t h,
                                                 std::int64_t w, std::int64_t out_h, std::int64_t out_w,
                                                 bool align_corners, const T* gy, T* gx) {
  XGRAD_ON_THRUST(device, resize_bilinear_backward(n, c, h, w, out_h, out_w, align_corners, gy, gx));
  cpu::resize_bilinear_backward(n, c, h, w, out_h, out_w, align_corners, gy, gx);
}

/// See cpu::attention_forward.
template <class T> void attention_forward(Device device, const cpu::AttentionGeometry& g, const T* q, const T* k,
                                          const T* v, T* out, T* lse = nullptr) {
  XGRAD_ON_THRUST(device, attention_forward(g, q, k, v, out, lse));
  cpu::attention_forward(g, q, k, v, out, lse);
}
/// See cpu::attention_backward.
template <class T> void attention_backward(Device device, const cpu::AttentionGeometry& g, const T* q, const T* k,
                                           const T* v, const T* out, const T* gy, T* grads, const T* lse = nullptr) {
  XGRAD_ON_THRUST(device, attention_backward(g, q, k, v, out, gy, grads, lse));
  cpu::attention_backward(g, q, k, v, out, gy, grads, lse);
}
/// See cpu::softmax_xent_forward.
template <class T> void softmax_xent_forward(Device device, const T* logits, const std::int32_t* labels,
                                             std::int64_t rows, std::int64_t classes, T* loss) {
  XGRAD_ON_THRUST(device, softmax_xent_forward(logits, labels, rows, classes, loss));
  cpu::softmax_xent_forward(logits, labels, rows, classes, loss);
}
/// See cpu::softmax_xent_backward.
template <class T> void softmax_xent_backward(Device device, const T* logits, const std::int32_t* labels, const T* g,
                                              std::int64_t rows, std::int64_t classes, T* grad) {
  XGRAD_ON_THRUST(device, softmax_xent_backward(logits, labels, g, rows, classes, grad));
  cpu::softmax_xent_backward(logits, labels, g, rows, classes, grad);
}

// The instances xgrad::compiled holds (core/config.hpp), in src/kernels.cpp: the sources whose
// ops and passes call these compile none of the kernels below them.
#define XGRAD_KERNELS_INSTANCE(T, X)                                                                                   \
  X void batched_gemm<T>(Device, const cpu::BroadcastPlan<2>&, std::int64_t, std::int64_t, std::int64_t, std::int64_t, \
                         const T*, std::int64_t, std::int64_t, const T*, std::int64_t, std::int64_t, T*,               \
                         const cpu::RangeDone*);                                                                       \
  X void conv2d_forward<T>(Device, const cpu::Conv2dGeometry&, const T*, const T*, T*, const cpu::RangeDone*);         \
  X void conv2d_backward_input<T>(Device, const cpu::Conv2dGeometry&, const T*, const T*, T*);                         \
  X void conv2d_backward_weight<T>(Device, const cpu::Conv2dGeometry&, const T*, const T*, T*);                        \
  X void conv2d_backward_input_pooled<T>(Device, const cpu::Conv2dGeometry&, const cpu::Pool2dGeometry&,               \
                                         const std::int32_t*, const T*, const T*, T*);                                 \
  X void conv2d_backward_weight_pooled<T>(Device, const cpu::Conv2dGeometry&, const cpu::Pool2dGeometry&, const T*,    \
                                          const std::int32_t*, const T*, T*);                                          \
  X void max_pool2d_argmax<T>(Device, const cpu::Pool2dGeometry&, const T*, std::int32_t*, T*, bool);                  \
  X void conv2d_relu_max_pool<T>(Device, const cpu::Conv2dGeometry&, const cpu::Pool2dGeometry&, const T*, const T*,   \
                                 const T*, T*, std::int32_t*);                                                         \
  X void max_pool2d_take<T>(Device, const cpu::Pool2dGeometry&, const std::int32_t*, const T*, T*);                    \
  X void max_pool2d_put<T>(Device, const cpu::Pool2dGeometry&, const std::int32_t*, const T*, T*);                     \
  X void avg_pool2d_forward<T>(Device, const cpu::Pool2dGeometry&, const T*, T*);                                      \
  X void avg_pool2d_backward<T>(Device, const cpu::Pool2dGeometry&, const T*, T*);                                     \
  X void resize_bilinear_forward<T>(Device, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,      \
                                    std::int64_t, bool, const T*, T*);                                                 \
  X void resize_bilinear_backward<T>(Device, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,     \
                                     std::int64_t, bool, const T*, T*);                                                \
  X void attention_forward<T>(Device, const cpu::AttentionGeometry&, const T*, const T*, const T*, T*, T*);            \
  X void attention_backward<T>(Device, const cpu::AttentionGeometry&, const T*, const T*, const T*, const T*,          \
                               const T*, T*, const T*);                                                                \
  X void softmax_xent_forward<T>(Device, const T*, const std::int32_t*, std::int64_t, std::int64_t, T*);               \
  X void softmax_xent_backward<T>(Device, const T*, const std::int32_t*, const T*, std::int64_t, std::int64_t, T*);
#define XGRAD_KERNELS_INSTANCES(X) XGRAD_FOR_EACH_FloatingPoint(XGRAD_KERNELS_INSTANCE, X)
#if defined(XGRAD_COMPILED) && !defined(XGRAD_INSTANTIATE_KERNELS)
XGRAD_KERNELS_INSTANCES(extern template)
#endif

#undef XGRAD_ON_THRUST

}  // namespace xgrad::kernels
