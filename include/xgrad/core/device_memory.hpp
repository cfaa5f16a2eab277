// The memory of the device a build has beside the host: whether there is one, allocation and
// copies, through Thrust (cudaMalloc / cudaMemcpy under CUDA, host memory under Thrust's OpenMP
// or CPP system). Storage needs it, so it sits in core/, the lowest layer; it is the one place
// there that knows which device a build has (CMake option XGRAD_THRUST_SYSTEM).
#pragma once

#include <cstddef>

#include "xgrad/core/config.hpp"

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
XGRAD_API void* allocate(std::size_t bytes);

XGRAD_API void free(void* p);

/// Copies `bytes` from src to dst, each on the device or the host as said; not both on the host.
XGRAD_API void copy(void* dst, bool dst_on_device, const void* src, bool src_on_device, std::size_t bytes);

}  // namespace xgrad::device_memory

#if !defined(XGRAD_COMPILED)
#include "xgrad/core/device_memory-inl.hpp"
#endif
