// Definitions of core/tensor.hpp: included by it when header-only, compiled once into the
// library (src/core.cpp) otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "xgrad/core/tensor.hpp"

namespace xgrad {

XGRAD_API std::shared_ptr<TensorImpl> TensorImpl::allocate(const Shape& shape, DType dtype, Device device) {
  std::int64_t count = 0;
  try {
    count = shape.numel();
  } catch (const ValueError& e) {
    throw AllocationError(e.what());
  }
  const auto elements = static_cast<std::size_t>(count);
  if (elements > Storage::kMaxBytes / dtype_size(dtype)) {
    const bool fits = elements <= SIZE_MAX / dtype_size(dtype);
    throw AllocationError(
        detail::concat("cannot allocate a ", dtype_name(dtype), shape, " tensor on ", device_name(device), ": ",
                       elements, " elements of ", dtype_size(dtype), " bytes (",
                       fits ? std::to_string(elements * dtype_size(dtype)) : "2^64 or more", " bytes) exceed the ",
                       Storage::kMaxBytes, " bytes (128 TiB) xgrad allocates at once"));
  }
  auto bytes = elements * dtype_size(dtype);
  return std::make_shared<TensorImpl>(shape, dtype, std::make_shared<Storage>(bytes, device));
}

namespace detail {

XGRAD_API TensorBase copy_to(const TensorBase& t, Device device) {
  TensorBase out(TensorImpl::allocate(t.shape(), t.dtype(), device));
  copy_bytes(out.impl()->storage->data(), device, t.impl()->storage->data(), t.device(),
             static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype()));
  return out;
}

}  // namespace detail
}  // namespace xgrad
