// The memory of the device a build has beside the host: whether there is one, allocation and
// copies, through Thrust (cudaMalloc / cudaMemcpy under CUDA, host memory under Thrust's OpenMP
// or CPP system). Storage needs it, so it sits in core/, the lowest layer; it is the one place
// there that knows which device a build has (CMake option XGRAD_THRUST_SYSTEM).
#pragma once

#include <cstddef>
#include <new>

#if defined(XGRAD_WITH_THRUST)
#include <thrust/copy.h>
#include <thrust/device_free.h>
#include <thrust/device_malloc.h>
#include <thrust/device_ptr.h>
#endif

namespace xgrad::device_memory {

/// True when this build has a device beside the host (the Thrust backend).
#if defined(XGRAD_WITH_THRUST)
inline constexpr bool has_device = true;
#else
inline constexpr bool has_device = false;
#endif

// Callers check has_device first (a build without a device refuses its tensors before they
// get here); without one these throw std::bad_alloc or do nothing.

/// A buffer of `bytes` on the device; std::bad_alloc when there is none.
inline void* allocate(std::size_t bytes) {
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

inline void free(void* p) {
#if defined(XGRAD_WITH_THRUST)
  thrust::device_free(thrust::device_ptr<std::byte>(static_cast<std::byte*>(p)));
#else
  (void)p;
#endif
}

/// Copies `bytes` from src to dst, each on the device or the host as said; not both on the host.
inline void copy(void* dst, bool dst_on_device, const void* src, bool src_on_device, std::size_t bytes) {
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
