// Scratch memory for Thrust kernels, on the device core/device_memory.hpp allocates from. Only
// compiled in with XGRAD_WITH_THRUST (CMake: -DXGRAD_THRUST_SYSTEM=OMP|CPP|CUDA).
#pragma once

#include <cstddef>

#include "xgrad/core/device_memory.hpp"

namespace xgrad::thrust_backend {

/// An uninitialized device array for a kernel's intermediate values, freed when it goes.
template <class T> class Scratch {
 public:
  explicit Scratch(std::size_t count) : m_data(static_cast<T*>(device_memory::allocate(count * sizeof(T)))) {}
  ~Scratch() { device_memory::free(m_data); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* data() const { return m_data; }

 private:
  T* m_data;
};

}  // namespace xgrad::thrust_backend
