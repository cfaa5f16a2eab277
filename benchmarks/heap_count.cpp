// Counts heap allocations: every call of glibc's allocation functions (malloc, calloc, realloc,
// aligned_alloc, posix_memalign, memalign, valloc, pvalloc) adds one to a process-wide counter,
// read through xgrad_heap_allocations(). The benchmark suite reports it per call ("allocs/call")
// for every side the same way:
// - xgrad_bench links this file, so its definitions interpose on glibc's for the whole process
//   (operator new, xgrad's buffers, Google Benchmark, LibTorch);
// - the Python peers run with it LD_PRELOADed as a shared library (benchmarks/run_suite.py builds
//   it with `c++ -O2 -shared -fPIC`) and read the counter through ctypes.
// Memory still comes from glibc (its __libc_* entry points), so the only cost is one relaxed
// atomic increment per allocation.
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>

#include <unistd.h>

// glibc's own entry points, which its malloc and friends are aliases of.
extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);
void __libc_free(void*);
}

namespace {

std::atomic<std::uint64_t> g_allocations{0};

inline void count_one() noexcept { g_allocations.fetch_add(1, std::memory_order_relaxed); }

std::size_t page_size() noexcept { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }

}  // namespace

#if defined(__NVCC__)
// The CUDA headers declare malloc and free for host and device; these definitions are host code.
#pragma nv_diagnostic push
#pragma nv_diag_suppress 20011
#pragma nv_diag_suppress 20014
#endif

extern "C" {

std::uint64_t xgrad_heap_allocations() noexcept { return g_allocations.load(std::memory_order_relaxed); }

void* malloc(std::size_t bytes) noexcept {
  count_one();
  return __libc_malloc(bytes);
}

void* calloc(std::size_t count, std::size_t bytes) noexcept {
  count_one();
  return __libc_calloc(count, bytes);
}

void* realloc(void* p, std::size_t bytes) noexcept {
  count_one();
  return __libc_realloc(p, bytes);
}

void free(void* p) noexcept { __libc_free(p); }

void* memalign(std::size_t alignment, std::size_t bytes) noexcept {
  count_one();
  return __libc_memalign(alignment, bytes);
}

void* aligned_alloc(std::size_t alignment, std::size_t bytes) noexcept {
  count_one();
  return __libc_memalign(alignment, bytes);
}

int posix_memalign(void** out, std::size_t alignment, std::size_t bytes) noexcept {
  // POSIX: a power of two that is a multiple of sizeof(void*), else EINVAL with *out untouched.
  if (alignment < sizeof(void*) || (alignment & (alignment - 1)) != 0) return EINVAL;
  count_one();
  void* p = __libc_memalign(alignment, bytes);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}

void* valloc(std::size_t bytes) noexcept {
  count_one();
  return __libc_memalign(page_size(), bytes);
}

void* pvalloc(std::size_t bytes) noexcept {
  count_one();
  const std::size_t page = page_size();
  return __libc_memalign(page, (bytes + page - 1) / page * page);
}

}  // extern "C"

#if defined(__NVCC__)
#pragma nv_diagnostic pop
#endif
