// Definitions of ops/device.hpp: included by it when header-only, compiled once into the
// library (src/ops_shape.cpp) otherwise.
#pragma once

#include "xgrad/core/tape.hpp"
#include "xgrad/ir/tracer.hpp"
#include "xgrad/ops/device.hpp"
#include "xgrad/ops/record.hpp"

namespace xgrad {

template <Element T> Tensor<T> to_device(const Tensor<T>& x, Device device, SourceLoc loc) {
  if (x.device() == device) return x;
  if (tracing::Tracer::active())
    throw_value_error("to", loc, "moving a tensor to ", device_name(device),
                      " inside jit is not supported; move the compiled function's inputs before calling it");
  detail::check_available(device, "to");
  const std::uint64_t level = detail::batch_level_of("to", loc, {x});
  Tensor<T> out = level ? Tensor<T>(detail::batched(to_device(detail::batch_of(x, level), device, loc), level))
                        : detail::copy_to(x, device);
  if constexpr (FloatingPoint<T>) {
    if (detail::should_record(x))
      detail::record(out, "To", loc, {x}, {}, false, [from = x.device(), loc](const TensorBase&, const TensorBase& g) {
        return autograd::Grads{to_device(Tensor<T>(g), from, loc)};
      });
    detail::push_tangents(out, {x}, [device, loc](std::span<const TensorBase> t) {
      return TensorBase(to_device(Tensor<T>(t[0]), device, loc));
    });
  }
  return out;
}

}  // namespace xgrad
