// Definitions of core/device_memory.hpp: included by it when header-only, compiled once into the
// library (src/core.cpp) otherwise.
#pragma once

#include <cstddef>
#include <new>

#if defined(XGRAD_WITH_THRUST)
#include <thrust/copy.h>
#include <thrust/device_free.h>
#include <thrust/device_malloc.h>
#include <thrust/device_ptr.h>
#endif

#include "xgrad/core/device_memory.hpp"

namespace xgrad::device_memory {

XGRAD_API void* allocate(std::size_t bytes) {
#if defined(XGRAD_WITH_THRUST)
  // Never a zero-byte request: every tensor, even an empty one, gets a distinct buffer.
  thrust::device_ptr<std::byte> p = thrust::device_malloc<std::byte>(bytes ? bytes : 1);
  if (!p.get()) throw std::bad_alloc();
  return p.get();
#else
  (void)bytes;
  throw std::bad_alloc();
#endif
}

XGRAD_API void free(void* p) {
#if defined(XGRAD_WITH_THRUST)
  thrust::device_free(thrust::device_ptr<std::byte>(static_cast<std::byte*>(p)));
#else
  (void)p;
#endif
}

XGRAD_API void copy(void* dst, bool dst_on_device, const void* src, bool src_on_device, std::size_t bytes) {
#if defined(XGRAD_WITH_THRUST)
  const auto* from = static_cast<const std::byte*>(src);
  auto* to = static_cast<std::byte*>(dst);
  if (!src_on_device)
    thrust::copy(from, from + bytes, thrust::device_ptr<std::byte>(to));
  else if (!dst_on_device)
    thrust::copy(thrust::device_ptr<const std::byte>(from), thrust::device_ptr<const std::byte>(from + bytes), to);
  else
    thrust::copy(thrust::device_ptr<const std::byte>(from), thrust::device_ptr<const std::byte>(from + bytes),
                 thrust::device_ptr<std::byte>(to));
#else
  (void)dst, (void)dst_on_device, (void)src, (void)src_on_device, (void)bytes;
#endif
}

}  // namespace xgrad::device_memory
