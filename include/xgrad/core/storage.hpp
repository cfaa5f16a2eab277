// Storage: a tensor's aligned element buffer and the version counter autodiff checks.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>

#include "xgrad/core/device.hpp"
#include "xgrad/core/device_memory.hpp"
#include "xgrad/core/error.hpp"

namespace xgrad {

namespace detail {

/// Keeps freed buffers of 64 KiB and more for reuse by the next tensor of the same (rounded)
/// size. A fresh multi-megabyte buffer is a fresh mapping whose first touch page-faults, which
/// costs more than the elementwise op that fills it, and glibc returns the freed top of its heap
/// to the system, so mid-sized buffers fault again too (a LeNet5 eager step: ~500 faults, 30% of
/// its time); eager training loops allocate the same sizes every step, so they hit this cache
/// from the second step on.
class BufferCache {
 public:
  static constexpr std::size_t kMinBytes = std::size_t{1} << 16;  // smaller: from malloc's free lists
  static constexpr std::size_t kGranule = std::size_t{1} << 16;   // sizes round up to this
  static constexpr std::size_t kMaxCachedBytes = std::size_t{512} << 20;

  /// Leaked on purpose: tensors in static storage may be freed after it would be destroyed.
  static BufferCache& instance() {
    static auto* cache = new BufferCache();
    return *cache;
  }

  void* take(std::size_t bytes) {
    std::lock_guard lock(m_mutex);
    auto it = m_free.find(bytes);
    if (it == m_free.end()) return nullptr;
    void* p = it->second;
    m_free.erase(it);
    m_cached -= bytes;
    return p;
  }
  /// False when the cache is full and the caller must free the buffer itself.
  bool give(void* p, std::size_t bytes) {
    std::lock_guard lock(m_mutex);
    if (m_cached + bytes > kMaxCachedBytes) return false;
    m_free.emplace(bytes, p);
    m_cached += bytes;
    return true;
  }
  void release() {
    std::lock_guard lock(m_mutex);
    for (auto& [bytes, p] : m_free) std::free(p);
    m_free.clear();
    m_cached = 0;
  }
  std::size_t cached_bytes() {
    std::lock_guard lock(m_mutex);
    return m_cached;
  }

 private:
  std::mutex m_mutex;
  std::unordered_multimap<std::size_t, void*> m_free;
  std::size_t m_cached = 0;
};

}  // namespace detail

/// Frees the large buffers xgrad keeps for reuse (at most 512 MiB are kept).
inline void release_cached_memory() { detail::BufferCache::instance().release(); }
/// Bytes held in freed buffers kept for reuse.
inline std::size_t cached_memory_bytes() { return detail::BufferCache::instance().cached_bytes(); }

namespace detail {

/// Copies `bytes` from src (on `from`) to dst (on `to`).
inline void copy_bytes(void* dst, Device to, const void* src, Device from, std::size_t bytes) {
  if (to == Device::cpu && from == Device::cpu) {
    if (bytes) std::memcpy(dst, src, bytes);
    return;
  }
  check_available(Device::thrust, "copy between devices");
  device_memory::copy(dst, to != Device::cpu, src, from != Device::cpu, bytes);
}

}  // namespace detail

/// Owns a tensor's bytes; large buffers are aligned to a cache line (kernels never rely on
/// it: they use unaligned loads). Views (reshape) share one Storage, so an
/// in-place write through any of them bumps the one version counter they all see.
class Storage {
 public:
  static constexpr std::size_t kAlignment = 64;

  /// The most bytes one buffer may have: 2^47 (128 TiB), the user address space of x86-64 and
  /// ARM64 with 4-level page tables. Larger requests fail before asking the allocator.
  static constexpr std::size_t kMaxBytes = std::size_t{1} << 47;

  explicit Storage(std::size_t bytes, Device device = Device::cpu)
      : m_bytes(bytes), m_device(device), m_serial(next_serial()) {
    using detail::BufferCache;
    if (bytes > kMaxBytes)
      throw AllocationError(detail::concat("cannot allocate ", bytes, " bytes on ", device_name(device),
                                           ": more than the ", kMaxBytes, " bytes (128 TiB) xgrad allocates at once"));
    if (device != Device::cpu) {
      detail::check_available(device, "Storage");
      m_capacity = bytes;
      try {
        m_data = device_memory::allocate(bytes);
      } catch (const std::bad_alloc&) {
        throw_out_of_memory(bytes, device);
      }
      return;
    }
    if (bytes < BufferCache::kMinBytes) {
      // malloc's per-thread caches make small tensors cheap; glibc's aligned_alloc would
      // take a slow path on every call.
      m_capacity = bytes ? bytes : 1;
      m_data = std::malloc(m_capacity);
    } else {
      m_capacity = (bytes + BufferCache::kGranule - 1) / BufferCache::kGranule * BufferCache::kGranule;
      m_data = BufferCache::instance().take(m_capacity);
      if (!m_data) m_data = std::aligned_alloc(kAlignment, m_capacity);
    }
    if (!m_data) throw_out_of_memory(bytes, device);
  }
  /// Memory owned elsewhere (a compiled graph's arena); this Storage never frees it.
  struct Borrowed {};
  Storage(Borrowed, void* data, std::size_t bytes, Device device = Device::cpu)
      : m_data(data), m_bytes(bytes), m_device(device), m_serial(next_serial()), m_borrowed(true) {}

  ~Storage() {
    if (m_borrowed) return;
    if (m_device != Device::cpu) {
      device_memory::free(m_data);
      return;
    }
    if (m_capacity < detail::BufferCache::kMinBytes || !detail::BufferCache::instance().give(m_data, m_capacity))
      std::free(m_data);
  }
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
  [[noreturn]] static void throw_out_of_memory(std::size_t bytes, Device device) {
    throw AllocationError(
        detail::concat("cannot allocate ", bytes, " bytes on ", device_name(device), ": out of memory"));
  }

  void* m_data = nullptr;
  std::size_t m_bytes = 0;
  std::size_t m_capacity = 0;
  Device m_device = Device::cpu;
  std::uint64_t m_version = 0;
  std::uint64_t m_serial = 0;
  bool m_borrowed = false;
};

}  // namespace xgrad
