// Storage: a tensor's aligned element buffer and the version counter autodiff checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "xgrad/core/device.hpp"

namespace xgrad {

/// Owns a tensor's bytes; large buffers are aligned to a cache line (kernels never rely on
/// it: they use unaligned loads). Views (reshape) share one Storage, so an
/// in-place write through any of them bumps the one version counter they all see.
class Storage {
 public:
  static constexpr std::size_t kAlignment = 64;

  /// Buffers up to this size come from plain malloc: its per-thread cache makes small
  /// tensors cheap, while glibc's aligned_alloc takes a slow path on every call.
  static constexpr std::size_t kSmallBytes = 1024;

  explicit Storage(std::size_t bytes, Device device = Device::cpu) : m_bytes(bytes), m_device(device) {
    if (bytes <= kSmallBytes) {
      m_data = std::malloc(bytes ? bytes : 1);
    } else {
      // aligned_alloc wants a multiple of the alignment.
      m_data = std::aligned_alloc(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
    }
    if (!m_data) throw std::bad_alloc();
  }
  ~Storage() { std::free(m_data); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() { return m_data; }
  const void* data() const { return m_data; }
  std::size_t bytes() const { return m_bytes; }
  Device device() const { return m_device; }

  std::uint64_t version() const { return m_version; }
  void bump_version() { ++m_version; }

 private:
  void* m_data = nullptr;
  std::size_t m_bytes = 0;
  Device m_device = Device::cpu;
  std::uint64_t m_version = 0;
};

}  // namespace xgrad
