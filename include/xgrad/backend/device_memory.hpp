// The memory of the device a build has beside the host: whether there is one, allocation and
// copies. The one place that knows which backend provides it (Thrust: CUDA under nvcc, host
// memory under OpenMP or CPP); core/ asks here. A leaf: it includes nothing else of xgrad's
// outside backend/thrust.
#pragma once

#include <cstddef>
#include <new>

#if defined(XGRAD_WITH_THRUST)
#include "xgrad/backend/thrust/memory.hpp"
#endif

namespace xgrad::backend {

/// True when this build has a device beside the host (the Thrust backend; CMake option
/// XGRAD_THRUST_SYSTEM).
#if defined(XGRAD_WITH_THRUST)
inline constexpr bool has_device = true;
#else
inline constexpr bool has_device = false;
#endif

// Callers check has_device first (a build without a device refuses its tensors before they
// get here); without one these throw std::bad_alloc or do nothing.

/// A buffer of `bytes` (at least one byte) on the device; std::bad_alloc when there is none.
inline void* device_allocate(std::size_t bytes) {
#if defined(XGRAD_WITH_THRUST)
  return thrust_backend::allocate(bytes);
#else
  (void)bytes;
  throw std::bad_alloc();
#endif
}

inline void device_free(void* p) {
#if defined(XGRAD_WITH_THRUST)
  thrust_backend::free(p);
#else
  (void)p;
#endif
}

/// Copies `bytes` from src to dst, each on the device or the host as said; not both on the host.
inline void device_copy(void* dst, bool dst_on_device, const void* src, bool src_on_device, std::size_t bytes) {
#if defined(XGRAD_WITH_THRUST)
  if (!src_on_device)
    thrust_backend::copy_to_device(dst, src, bytes);
  else if (!dst_on_device)
    thrust_backend::copy_to_host(dst, src, bytes);
  else
    thrust_backend::copy_on_device(dst, src, bytes);
#else
  (void)dst, (void)dst_on_device, (void)src, (void)src_on_device, (void)bytes;
#endif
}

}  // namespace xgrad::backend
