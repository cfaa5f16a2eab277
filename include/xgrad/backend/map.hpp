// Elementwise maps on the device the data lives on: the cpu backend's xsimd loops, or with
// XGRAD_WITH_THRUST the Thrust backend's functor for Device::thrust.
#pragma once

#include "xgrad/backend/cpu/elementwise.hpp"
#include "xgrad/core/tensor.hpp"
#if defined(XGRAD_WITH_THRUST)
#include "xgrad/backend/thrust/elementwise.hpp"
#endif

namespace xgrad::kernels {

/// out = Op::apply(inputs...) for one to three inputs, each broadcast to out's shape (NumPy
/// rules; the caller has checked that they broadcast).
template <class Op, class R, class... T> void map(Device device, Tensor<R>& out, const Tensor<T>&... inputs) {
  static_assert(sizeof...(T) >= 1 && sizeof...(T) <= 3);
#if defined(XGRAD_WITH_THRUST)
  if (device == Device::thrust) return thrust_backend::map<Op>(out, inputs...);
#else
  (void)device;
#endif
  constexpr int arity = sizeof...(T);
  if constexpr (arity == 1) {
    cpu::map_unary<Op>(inputs.data()..., out.data(), out.numel());
  } else {
    const cpu::BroadcastPlan<arity> plan(out.shape(), {&inputs.shape()...});
    if constexpr (arity == 2)
      cpu::map_binary<Op>(plan, inputs.data()..., out.data());
    else
      cpu::map_ternary<Op>(plan, inputs.data()..., out.data());
  }
}

}  // namespace xgrad::kernels
