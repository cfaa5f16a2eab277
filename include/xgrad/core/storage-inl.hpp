// Definitions of core/storage.hpp: included by it when header-only, compiled once into the
// library (src/core.cpp) otherwise.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>

#include "xgrad/core/device_memory.hpp"
#include "xgrad/core/host_memory.hpp"
#include "xgrad/core/storage.hpp"

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

XGRAD_API void release_cached_memory() { detail::BufferCache::instance().release(); }

XGRAD_API std::size_t cached_memory_bytes() { return detail::BufferCache::instance().cached_bytes(); }

namespace detail {

XGRAD_API void copy_bytes(void* dst, Device to, const void* src, Device from, std::size_t bytes) {
  if (to == Device::cpu && from == Device::cpu) {
    if (bytes) std::memcpy(dst, src, bytes);
    return;
  }
  check_available(Device::thrust, "copy between devices");
  device_memory::copy(dst, to != Device::cpu, src, from != Device::cpu, bytes);
}

}  // namespace detail

XGRAD_API Storage::Storage(std::size_t bytes, Device device)
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
    m_capacity =
        detail::host_capacity((bytes + BufferCache::kGranule - 1) / BufferCache::kGranule * BufferCache::kGranule);
    m_data = BufferCache::instance().take(m_capacity);
    if (!m_data) m_data = detail::host_allocate(m_capacity);
  }
  if (!m_data) throw_out_of_memory(bytes, device);
}

XGRAD_API Storage::~Storage() {
  if (m_borrowed) return;
  if (m_device != Device::cpu) {
    device_memory::free(m_data);
    return;
  }
  if (m_capacity < detail::BufferCache::kMinBytes || !detail::BufferCache::instance().give(m_data, m_capacity))
    std::free(m_data);
}

[[noreturn]] XGRAD_API void Storage::throw_out_of_memory(std::size_t bytes, Device device) {
  throw AllocationError(
      detail::concat("cannot allocate ", bytes, " bytes on ", device_name(device), ": out of memory"));
}

}  // namespace xgrad
