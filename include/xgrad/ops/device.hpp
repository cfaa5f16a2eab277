// Moving tensors between devices. Declarations only: the definition is in ops/device-inl.hpp.
#pragma once

#include "xgrad/core/device.hpp"
#include "xgrad/core/dtype.hpp"
#include "xgrad/core/source_loc.hpp"
#include "xgrad/core/tensor.hpp"

namespace xgrad {

/// x on `device` (Tensor::to): x itself when it is there already, else a copy whose gradient
/// flows back to x's device.
template <Element T> Tensor<T> to_device(const Tensor<T>& x, Device device, SourceLoc loc);

// The instances xgrad::compiled holds (core/config.hpp).
#define XGRAD_DEVICE_INSTANCE(T, X) X Tensor<T> to_device<T>(const Tensor<T>&, Device, SourceLoc);
#define XGRAD_DEVICE_INSTANCES(X) XGRAD_FOR_EACH_Element(XGRAD_DEVICE_INSTANCE, X)
#if defined(XGRAD_COMPILED) && !defined(XGRAD_INSTANTIATE_DEVICE)
XGRAD_DEVICE_INSTANCES(extern template)
#endif

}  // namespace xgrad

#if !defined(XGRAD_COMPILED)
#include "xgrad/ops/device-inl.hpp"
#endif
