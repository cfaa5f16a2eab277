// Storage: a tensor's aligned element buffer and the version counter autodiff checks.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "xgrad/core/config.hpp"
#include "xgrad/core/device.hpp"
#include "xgrad/core/error.hpp"

namespace xgrad {

/// Frees the large buffers xgrad keeps for reuse (at most 512 MiB are kept).
XGRAD_API void release_cached_memory();
/// Bytes held in freed buffers kept for reuse.
XGRAD_API std::size_t cached_memory_bytes();

namespace detail {

/// Copies `bytes` from src (on `from`) to dst (on `to`).
XGRAD_API void copy_bytes(void* dst, Device to, const void* src, Device from, std::size_t bytes);

}  // namespace detail

/// Owns a tensor's bytes; buffers of 64 KiB and more are aligned to a cache line, from 2 MiB on
/// to a huge page (detail::host_allocate; kernels never rely on it: they use unaligned loads).
/// Views (reshape) share one Storage, so an in-place write through any of them bumps the one
/// version counter they all see.
class Storage {
 public:
  /// The most bytes one buffer may have: 2^47 (128 TiB), the user address space of x86-64 and
  /// ARM64 with 4-level page tables. Larger requests fail before asking the allocator.
  static constexpr std::size_t kMaxBytes = std::size_t{1} << 47;

  XGRAD_API explicit Storage(std::size_t bytes, Device device = Device::cpu);
  /// Memory owned elsewhere (a compiled graph's arena); this Storage never frees it.
  struct Borrowed {};
  Storage(Borrowed, void* data, std::size_t bytes, Device device = Device::cpu)
      : m_data(data), m_bytes(bytes), m_device(device), m_serial(next_serial()), m_borrowed(true) {}

  XGRAD_API ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() { return m_data; }
  const void* data() const { return m_data; }
  std::size_t bytes() const { return m_bytes; }
  Device device() const { return m_device; }
  bool borrowed() const { return m_borrowed; }

  std::uint64_t version() const { return m_version; }
  void bump_version() { ++m_version; }

  /// Storages are numbered in creation order; the tracer tells a tensor made while tracing
  /// (a constant of the graph) from one that existed before (an input read by reference).
  std::uint64_t serial() const { return m_serial; }
  static std::uint64_t next_serial() {
    static std::atomic<std::uint64_t> counter{0};
    return counter.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  [[noreturn]] XGRAD_API static void throw_out_of_memory(std::size_t bytes, Device device);

  void* m_data = nullptr;
  std::size_t m_bytes = 0;
  std::size_t m_capacity = 0;
  Device m_device = Device::cpu;
  std::uint64_t m_version = 0;
  std::uint64_t m_serial = 0;
  bool m_borrowed = false;
};

}  // namespace xgrad

#if !defined(XGRAD_COMPILED)
#include "xgrad/core/storage-inl.hpp"
#endif
