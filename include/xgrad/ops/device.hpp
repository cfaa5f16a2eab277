// Moving tensors between devices.
#pragma once

#include "xgrad/ops/dispatch.hpp"

namespace xgrad {

/// x on `device` (Tensor::to): x itself when it is there already, else a copy whose gradient
/// flows back to x's device.
template <Element T> Tensor<T> to_device(const Tensor<T>& x, Device device, SourceLoc loc) {
  if (x.device() == device) return x;
  if (tracing::Tracer::active())
    throw_value_error("to", loc, "moving a tensor to ", device_name(device),
                      " inside jit is not supported; move the compiled function's inputs before calling it");
  detail::check_available(device, "to");
  Tensor<T> out = detail::copy_to(x, device);
  if constexpr (FloatingPoint<T>) {
    if (detail::should_record(x))
      detail::record(out, "To", loc, {x}, {}, false, [from = x.device(), loc](const TensorBase&, const TensorBase& g) {
        return autograd::Grads{to_device(Tensor<T>(g), from, loc)};
      });
  }
  return out;
}

// The instances xgrad::compiled holds (core/config.hpp).
#define XGRAD_DEVICE_INSTANCE(T, X) X Tensor<T> to_device<T>(const Tensor<T>&, Device, SourceLoc);
#define XGRAD_DEVICE_INSTANCES(X) XGRAD_FOR_EACH_Element(XGRAD_DEVICE_INSTANCE, X)
#if defined(XGRAD_COMPILED) && !defined(XGRAD_INSTANTIATE_DEVICE)
XGRAD_DEVICE_INSTANCES(extern template)
#endif

}  // namespace xgrad
