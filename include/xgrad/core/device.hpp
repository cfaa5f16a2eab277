// Device: where a tensor's storage lives.
#pragma once

#include <string_view>

namespace xgrad {

/// cpu runs on the xsimd backend; thrust on the Thrust backend (CUDA under nvcc, else OpenMP).
enum class Device { cpu, thrust };

constexpr std::string_view device_name(Device d) { return d == Device::cpu ? "cpu" : "thrust"; }

}  // namespace xgrad
