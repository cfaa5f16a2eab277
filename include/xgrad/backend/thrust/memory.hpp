// Device::thrust memory: allocation and host <-> device copies through Thrust, so the same
// code uses cudaMalloc / cudaMemcpy under CUDA and host memory under THRUST_DEVICE_SYSTEM=OMP
// or CPP. Only compiled in with XGRAD_WITH_THRUST (CMake: -DXGRAD_THRUST_SYSTEM=OMP|CPP).
#pragma once

#include <cstddef>
#include <new>

#include <thrust/copy.h>
#include <thrust/device_free.h>
#include <thrust/device_malloc.h>
#include <thrust/device_ptr.h>

namespace xgrad::thrust_backend {

inline void* allocate(std::size_t bytes) {
  // Never a zero-byte request: every tensor, even an empty one, gets a distinct buffer.
  thrust::device_ptr<std::byte> p = thrust::device_malloc<std::byte>(bytes ? bytes : 1);
  if (!p.get()) throw std::bad_alloc();
  return p.get();
}

inline void free(void* p) { thrust::device_free(thrust::device_ptr<std::byte>(static_cast<std::byte*>(p))); }

/// An uninitialized device array for a kernel's intermediate values, freed when it goes.
template <class T> class Scratch {
 public:
  explicit Scratch(std::size_t count) : m_data(static_cast<T*>(allocate(count * sizeof(T)))) {}
  ~Scratch() { free(m_data); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* data() const { return m_data; }

 private:
  T* m_data;
};

inline void copy_to_device(void* device_dst, const void* host_src, std::size_t bytes) {
  const auto* src = static_cast<const std::byte*>(host_src);
  thrust::copy(src, src + bytes, thrust::device_ptr<std::byte>(static_cast<std::byte*>(device_dst)));
}

inline void copy_to_host(void* host_dst, const void* device_src, std::size_t bytes) {
  thrust::device_ptr<const std::byte> src(static_cast<const std::byte*>(device_src));
  thrust::copy(src, src + bytes, static_cast<std::byte*>(host_dst));
}

inline void copy_on_device(void* device_dst, const void* device_src, std::size_t bytes) {
  thrust::device_ptr<const std::byte> src(static_cast<const std::byte*>(device_src));
  thrust::copy(src, src + bytes, thrust::device_ptr<std::byte>(static_cast<std::byte*>(device_dst)));
}

}  // namespace xgrad::thrust_backend
