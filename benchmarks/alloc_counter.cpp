// The global operator new / delete of xgrad_bench, replaced so that benchmarks can count heap
// allocations: every new and new[] overload (plain, nothrow, aligned, aligned nothrow) adds one
// to a process-wide counter, read through xgrad::bench::operator_new_calls() (bench_support.hpp)
// and reported as "allocs/call" by AllocationCounter. Memory comes from std::malloc (or
// std::aligned_alloc for over-aligned types) and goes back through std::free, so the only cost
// over the library's operators is one relaxed atomic increment per allocation.
//
// This replaces the operators of the whole executable, Google Benchmark and LibTorch included;
// the counter is read around benchmark loops only. xgrad's tensor buffers (xgrad::Storage) use
// std::malloc / std::aligned_alloc directly and are not counted here (see "buffers/call").
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "bench_support.hpp"

namespace {

std::atomic<std::uint64_t> g_operator_new_calls{0};

void count_one() noexcept { g_operator_new_calls.fetch_add(1, std::memory_order_relaxed); }

/// What the standard asks of the throwing forms: retry through the new-handler while there is
/// one, else throw std::bad_alloc.
void* allocate(std::size_t bytes) {
  count_one();
  if (bytes == 0) bytes = 1;
  for (;;) {
    if (void* p = std::malloc(bytes)) return p;
    std::new_handler handler = std::get_new_handler();
    if (!handler) throw std::bad_alloc();
    handler();
  }
}

void* allocate_aligned(std::size_t bytes, std::align_val_t align) {
  count_one();
  std::size_t alignment = static_cast<std::size_t>(align);
  if (alignment < sizeof(void*)) alignment = sizeof(void*);
  // std::aligned_alloc wants a size that is a multiple of the alignment (and not zero).
  if (bytes > static_cast<std::size_t>(-1) - alignment) throw std::bad_alloc();
  const std::size_t rounded = bytes == 0 ? alignment : (bytes + alignment - 1) / alignment * alignment;
  for (;;) {
    if (void* p = std::aligned_alloc(alignment, rounded)) return p;
    std::new_handler handler = std::get_new_handler();
    if (!handler) throw std::bad_alloc();
    handler();
  }
}

void* allocate_nothrow(std::size_t bytes) noexcept {
  try {
    return allocate(bytes);
  } catch (...) {
    return nullptr;
  }
}

void* allocate_aligned_nothrow(std::size_t bytes, std::align_val_t align) noexcept {
  try {
    return allocate_aligned(bytes, align);
  } catch (...) {
    return nullptr;
  }
}

}  // namespace

namespace xgrad::bench {

std::uint64_t operator_new_calls() noexcept { return g_operator_new_calls.load(std::memory_order_relaxed); }

}  // namespace xgrad::bench

// ---- allocation ------------------------------------------------------------------------------

#if defined(__NVCC__)
// nvcc takes the global operator new for host-and-device; these replace the host one only.
#pragma nv_diagnostic push
#pragma nv_diag_suppress 20011
#endif

void* operator new(std::size_t bytes) { return allocate(bytes); }
void* operator new[](std::size_t bytes) { return allocate(bytes); }
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept { return allocate_nothrow(bytes); }
void* operator new[](std::size_t bytes, const std::nothrow_t&) noexcept { return allocate_nothrow(bytes); }
void* operator new(std::size_t bytes, std::align_val_t align) { return allocate_aligned(bytes, align); }
void* operator new[](std::size_t bytes, std::align_val_t align) { return allocate_aligned(bytes, align); }
void* operator new(std::size_t bytes, std::align_val_t align, const std::nothrow_t&) noexcept {
  return allocate_aligned_nothrow(bytes, align);
}
void* operator new[](std::size_t bytes, std::align_val_t align, const std::nothrow_t&) noexcept {
  return allocate_aligned_nothrow(bytes, align);
}

#if defined(__NVCC__)
#pragma nv_diagnostic pop
#endif

// ---- deallocation: malloc and aligned_alloc memory both go back through std::free ------------

void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
