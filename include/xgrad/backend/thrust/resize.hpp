// Device::thrust bilinear resize and its adjoint (cpu: backend/cpu/resize.hpp), from the cpu
// backend's taps copied to the device. The forward computes each output from its four taps;
// the adjoint gathers, for each input pixel, the products the cpu kernel scatters onto it, in
// the cpu kernel's order, so both give the same bits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include <thrust/device_ptr.h>
#include <thrust/execution_policy.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform.h>

#include "xgrad/backend/cpu/resize.hpp"
#include "xgrad/core/storage.hpp"

namespace xgrad::thrust_backend {

namespace detail {

/// One axis's taps, and for each input index the output indices [lo, hi) whose taps read it.
template <class T> struct AxisTaps {
  const cpu::detail::BilinearTap<T>* taps;
  const std::int64_t* lo;
  const std::int64_t* hi;
};

/// The taps of one axis on the device.
template <class T> class DeviceTaps {
 public:
  DeviceTaps(std::int64_t in, std::int64_t out, bool align_corners) {
    const auto taps = cpu::detail::bilinear_taps<T>(in, out, align_corners);
    std::vector<std::int64_t> lo(static_cast<std::size_t>(in), out), hi(static_cast<std::size_t>(in), 0);
    auto read_by = [&](std::int64_t i, std::int64_t d) {
      lo[static_cast<std::size_t>(i)] = std::min(lo[static_cast<std::size_t>(i)], d);
      hi[static_cast<std::size_t>(i)] = std::max(hi[static_cast<std::size_t>(i)], d + 1);
    };
    for (std::int64_t d = 0; d < out; ++d) {
      read_by(taps[static_cast<std::size_t>(d)].i0, d);
      read_by(taps[static_cast<std::size_t>(d)].i1, d);
    }
    m_taps = upload(taps);
    m_lo = upload(lo);
    m_hi = upload(hi);
  }
  AxisTaps<T> view() const {
    return {static_cast<const cpu::detail::BilinearTap<T>*>(m_taps->data()),
            static_cast<const std::int64_t*>(m_lo->data()), static_cast<const std::int64_t*>(m_hi->data())};
  }

 private:
  template <class V> static std::unique_ptr<Storage> upload(const std::vector<V>& host) {
    auto storage = std::make_unique<Storage>(host.size() * sizeof(V), Device::thrust);
    xgrad::detail::copy_bytes(storage->data(), Device::thrust, host.data(), Device::cpu, host.size() * sizeof(V));
    return storage;
  }
  std::unique_ptr<Storage> m_taps, m_lo, m_hi;
};

template <class T> struct ResizeForwardFn {
  AxisTaps<T> th, tw;
  std::int64_t h, w, out_h, out_w;
  const T* x;
  XGRAD_HD T operator()(std::int64_t i) const {
    const std::int64_t ow = i % out_w, oh = i / out_w % out_h, plane = i / (out_w * out_h);
    const auto& a = th.taps[oh];
    const auto& b = tw.taps[ow];
    const T* r0 = x + plane * h * w + a.i0 * w;
    const T* r1 = x + plane * h * w + a.i1 * w;
    using cpu::detail::weighted;
    const T top = weighted(r0[b.i0], b.w0) + weighted(r0[b.i1], b.w1);
    const T bottom = weighted(r1[b.i0], b.w0) + weighted(r1[b.i1], b.w1);
    return weighted(top, a.w0) + weighted(bottom, a.w1);
  }
};

template <class T> struct ResizeBackwardFn {
  AxisTaps<T> th, tw;
  std::int64_t h, w, out_h, out_w;
  const T* gy;
  XGRAD_HD T operator()(std::int64_t i) const {
    const std::int64_t iw = i % w, ih = i / w % h, plane = i / (w * h);
    const T* g = gy + plane * out_h * out_w;
    T acc(0);
    for (std::int64_t oh = th.lo[ih]; oh < th.hi[ih]; ++oh) {
      const auto& a = th.taps[oh];
      for (std::int64_t ow = tw.lo[iw]; ow < tw.hi[iw]; ++ow) {
        const auto& b = tw.taps[ow];
        using cpu::detail::weighted;
        const T top = weighted(g[oh * out_w + ow], a.w0), bottom = weighted(g[oh * out_w + ow], a.w1);
        if (a.i0 == ih && b.i0 == iw) acc += weighted(top, b.w0);
        if (a.i0 == ih && b.i1 == iw) acc += weighted(top, b.w1);
        if (a.i1 == ih && b.i0 == iw) acc += weighted(bottom, b.w0);
        if (a.i1 == ih && b.i1 == iw) acc += weighted(bottom, b.w1);
      }
    }
    return acc;
  }
};

}  // namespace detail

/// See cpu::resize_bilinear_forward.
template <class T> void resize_bilinear_forward(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                                                std::int64_t out_h, std::int64_t out_w, bool align_corners, const T* x,
                                                T* y) {
  if (n * c * out_h * out_w == 0) return;
  const detail::DeviceTaps<T> th(h, out_h, align_corners), tw(w, out_w, align_corners);
  thrust::counting_iterator<std::int64_t> first(0);
  thrust::transform(thrust::device, first, first + n * c * out_h * out_w, thrust::device_ptr<T>(y),
                    detail::ResizeForwardFn<T>{th.view(), tw.view(), h, w, out_h, out_w, x});
}

/// See cpu::resize_bilinear_backward.
template <class T> void resize_bilinear_backward(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                                                 std::int64_t out_h, std::int64_t out_w, bool align_corners,
                                                 const T* gy, T* gx) {
  if (n * c * h * w == 0) return;
  const detail::DeviceTaps<T> th(h, out_h, align_corners), tw(w, out_w, align_corners);
  thrust::counting_iterator<std::int64_t> first(0);
  thrust::transform(thrust::device, first, first + n * c * h * w, thrust::device_ptr<T>(gx),
                    detail::ResizeBackwardFn<T>{th.view(), tw.view(), h, w, out_h, out_w, gy});
}

}  // namespace xgrad::thrust_backend
