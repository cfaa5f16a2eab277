// Device: where a tensor's storage lives, and the device new tensors go to.
#pragma once

#include <atomic>
#include <string_view>

#include "xgrad/core/device_memory.hpp"
#include "xgrad/core/error.hpp"

/// Marks a function that Thrust kernels call: host and device code under nvcc (the CUDA
/// build), a plain function everywhere else.
#if defined(__CUDACC__)
#define XGRAD_HD __host__ __device__
#else
#define XGRAD_HD
#endif

namespace xgrad {

/// cpu runs on the xsimd backend; thrust on the Thrust backend (CUDA under nvcc, else OpenMP
/// or serial on the host), present when xgrad is built with XGRAD_WITH_THRUST (CMake option
/// XGRAD_THRUST_SYSTEM).
enum class Device { cpu, thrust };

constexpr std::string_view device_name(Device d) { return d == Device::cpu ? "cpu" : "thrust"; }

/// True when this build has the Thrust backend.
constexpr bool thrust_available() { return device_memory::has_device; }

namespace detail {

inline std::atomic<Device>& default_device_slot() {
  static std::atomic<Device> device{Device::cpu};
  return device;
}

/// Throws when `device` is not built in; `what` names the caller.
inline void check_available(Device device, std::string_view what) {
  if (device == Device::thrust && !thrust_available())
    throw ValueError(concat(what, ": Device::thrust is not built in; configure xgrad with -DXGRAD_THRUST_SYSTEM=OMP ",
                            "(or CPP) to get the Thrust backend"));
}

}  // namespace detail

/// The device the factories (zeros, randn, tensor, ...) put new tensors on; cpu at start.
inline Device default_device() { return detail::default_device_slot().load(std::memory_order_relaxed); }

/// Sets the device the factories put new tensors on, for every thread.
inline void set_default_device(Device device) {
  detail::check_available(device, "set_default_device");
  detail::default_device_slot().store(device, std::memory_order_relaxed);
}

}  // namespace xgrad
