// xgrad CPU backend: cache-blocked, packed, SIMD micro-kernel GEMM (C = alpha*A*B + beta*C).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#include <xsimd/xsimd.hpp>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "xgrad/backend/cpu/elementwise.hpp"
#include "xgrad/backend/cpu/thread_pool.hpp"
#include "xgrad/core/dtype.hpp"
#include "xgrad/core/host_memory.hpp"

namespace xgrad::cpu {

/// The multiply-adds up to which a product runs on one thread: at about 2^17 (two halves of
/// ~0.7 us each) a region's cost and the re-packing eat the gain (64 x 64 x 32: 1.3 us on one
/// thread or two; LeNet5's 32 x 84 x 120, 2.6 times as much: 4.3 us on one, 3.2 us on two).
inline constexpr std::int64_t kGemmParallelWork = std::int64_t{1} << 17;

/// The bytes of a depth block of B (kc x nc) up to which a product whose B has contiguous rows
/// reads B where it is, however many rows A has, rather than copying it into panels first.
inline constexpr std::int64_t kGemmInPlaceBlockB = 128 * 1024;
/// The bytes of A (k within one depth block) up to which a product reads A in place.
inline constexpr std::int64_t kGemmSmallA = 16 * 1024;
/// The bytes of a depth block of packed A up to which a product of several column blocks packs it
/// once for all of them (2048 rows of float).
inline constexpr std::int64_t kGemmKeptA = 4 * 1024 * 1024;

/// The steps of k before a micro-kernel's end at which it fetches its tile of C for writing:
/// on a Zen 4, 24 cycles a step (6 x 4 vectors on two 256-bit FMA pipes), about 100 ns, an L3
/// hit's time.
inline constexpr std::int64_t kGemmPrefetchSteps = 16;

/// The steps of k between two lines of the next tile's C that a micro-kernel fetches as it runs
/// (a whole tile, 24 lines on AVX-512, over 192 steps): fetched only near its own end, a tile's
/// lines still came late from L3 (on a Zen 4, medians of alternations in one process: 1024^3
/// 2.3-3.1% faster on one thread, 2.9% on two; 2048^3 2%; the LeNet5 step the same).
inline constexpr std::int64_t kGemmNextCSteps = 8;

/// Told that rows [row, row + rows) and columns [col, col + cols) of C are final.
using GemmBlockDone = std::function<void(int64_t row, int64_t rows, int64_t col, int64_t cols)>;

/// Told that elements [begin, end) of a row-major output are final.
using RangeDone = std::function<void(int64_t begin, int64_t end)>;

/// A GemmBlockDone that reports a block of C (row-major with `row_length` columns, starting
/// `offset` elements into the output) to `done` as ranges of elements: one when the block
/// spans whole rows, else one per row. It points at its arguments, which must outlive it.
struct GemmBlockRanges {
  const RangeDone* done;
  int64_t offset, row_length;
  void operator()(int64_t row, int64_t rows, int64_t col, int64_t cols) const {
    const int64_t start = offset + row * row_length + col;
    if (col == 0 && cols == row_length) {
      (*done)(start, start + rows * row_length);
      return;
    }
    for (int64_t r = 0; r < rows; ++r) (*done)(start + r * row_length, start + r * row_length + cols);
  }
};

namespace detail {

/// Register and cache blocking for T on the default xsimd arch.
template <class T> struct GemmConfig {
  using batch = xsimd::batch<T>;
  static constexpr int64_t lanes = static_cast<int64_t>(batch::size);
#if defined(__aarch64__)
  static constexpr int vector_regs = 32;
#else
  // AVX-512 doubles the register file along with the width.
  static constexpr int vector_regs = sizeof(batch) >= 64 ? 32 : 16;
#endif
  // Micro-tile: MR rows x NB vectors. MR*NB accumulators + NB loads of B + one broadcast of A.
  // With 32 registers 6 x 4 (10 loads per 24 multiply-adds) beats 14 x 2 (16 per 28).
  static constexpr int nb = vector_regs >= 32 ? 4 : 2;
  static constexpr int mr = (vector_regs - nb - 1) / nb;
  static constexpr int64_t nr = nb * lanes;
  // Cache blocking. The MR x kc packed A micro-panel stays in L1 while the kc x nc packed B
  // block streams from L2; both are sized in bytes so double gets half the depth of float.
  static constexpr int64_t kc = 1024 / static_cast<int64_t>(sizeof(T));
  static constexpr int64_t nc = (512 * 1024) / (kc * static_cast<int64_t>(sizeof(T))) / nr * nr;
  // Rows of A packed per block: small enough that packed A and B share L2.
  static constexpr int64_t mc = mr * 16;
  // Packed A rows are kc apart plus one cache line, so the MR rows a micro-kernel reads do
  // not all map to the same L1 sets.
  static constexpr int64_t a_row_stride = kc + 64 / static_cast<int64_t>(sizeof(T));
};

/// Scratch from host_allocate that only grows; one per thread and dtype, reused across calls.
template <class T> class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  ~ScratchBuffer() { release(); }

  T* get(int64_t count) {
    if (count > m_capacity) {
      release();
      m_data = static_cast<T*>(
          xgrad::detail::host_allocate(xgrad::detail::host_capacity(static_cast<size_t>(count) * sizeof(T))));
      if (!m_data) throw std::bad_alloc();
      m_capacity = count;
    }
    return m_data;
  }

 private:
  void release() {
    std::free(m_data);
    m_data = nullptr;
    m_capacity = 0;
  }
  T* m_data = nullptr;
  int64_t m_capacity = 0;
};

/// A counter that the threads of one product share, on a cache line of its own.
struct alignas(64) SharedCounter {
  std::atomic<int64_t> value{0};
};

/// Counters that only grow in number, like ScratchBuffer; get() hands them out at zero.
class SharedCounters {
 public:
  SharedCounter* get(int64_t count) {
    if (count > m_capacity) {
      m_counters = std::make_unique<SharedCounter[]>(static_cast<size_t>(count));
      m_capacity = count;
    }
    for (int64_t i = 0; i < count; ++i) m_counters[static_cast<size_t>(i)].value.store(0, std::memory_order_relaxed);
    return m_counters.get();
  }

 private:
  std::unique_ptr<SharedCounter[]> m_counters;
  int64_t m_capacity = 0;
};

template <class T> struct GemmWorkspace {
  ScratchBuffer<T> m_a;
  ScratchBuffer<T> m_b;
  ScratchBuffer<T> m_c_transposed;  // see gemm_transposed
  ScratchBuffer<T> m_second_half;   // see gemm_k_halves
  ScratchBuffer<T> m_homes_b;       // see gemm_column_homes
  SharedCounters m_homes_counters;
};

template <class T> GemmWorkspace<T>& gemm_workspace() {
  static thread_local GemmWorkspace<T> ws;
  return ws;
}

/// Copies n contiguous elements; a plain SIMD loop beats a memmove call at these lengths.
template <class T> inline void copy_contiguous(const T* src, int64_t n, T* dst) {
  using batch = xsimd::batch<T>;
  constexpr int64_t L = static_cast<int64_t>(batch::size);
  int64_t i = 0;
  for (; i + L <= n; i += L) batch::load_unaligned(src + i).store_unaligned(dst + i);
  for (; i < n; ++i) dst[i] = src[i];
}

#if defined(__AVX512F__)
// Full-width interleave needs a two-source permute, which xsimd 8 does not expose: AVX-512 and
// AVX get in-register transposes (AVX only at 256 bits, the width xsimd picks there), other
// targets pack transposed operands with scalar code.
template <class T> inline constexpr bool has_simd_transpose = sizeof(xsimd::batch<T>) == 64;

/// dst[r * ldd + c] = src[c * lds + r] for one lanes x lanes block. log2(lanes) rounds of
/// "row i and row i + lanes/2 -> interleaved low and high halves" each rotate the bits of the
/// (row, column) index by one, so together they transpose.
inline void transpose_block(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m512 r[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
#pragma GCC unroll 16
  for (int round = 0; round < 4; ++round) {
    __m512 t[16];
#pragma GCC unroll 16
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_permutex2var_ps(r[i], lo, r[i + 8]);
      t[2 * i + 1] = _mm512_permutex2var_ps(r[i], hi, r[i + 8]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) r[i] = t[i];
  }
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + i * ldd, r[i]);
}

inline void transpose_block(const double* src, int64_t lds, double* dst, int64_t ldd) {
  __m512d r[8];
#pragma GCC unroll 16
  for (int i = 0; i < 8; ++i) r[i] = _mm512_loadu_pd(src + i * lds);
  const __m512i lo = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11);
  const __m512i hi = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
#pragma GCC unroll 16
  for (int round = 0; round < 3; ++round) {
    __m512d t[8];
#pragma GCC unroll 16
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm512_permutex2var_pd(r[i], lo, r[i + 4]);
      t[2 * i + 1] = _mm512_permutex2var_pd(r[i], hi, r[i + 4]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 8; ++i) r[i] = t[i];
  }
#pragma GCC unroll 16
  for (int i = 0; i < 8; ++i) _mm512_storeu_pd(dst + i * ldd, r[i]);
}
#elif defined(__AVX__)
// AVX's in-lane unpacks and shuffles, then 128-bit halves swapped across registers.
template <class T> inline constexpr bool has_simd_transpose = sizeof(xsimd::batch<T>) == 32;

/// dst[r * ldd + c] = src[c * lds + r] for one 8 x 8 block: rows paired into 2 x 2 blocks
/// (unpack), pairs into 4 x 4 blocks within each half (shuffle), then the halves exchanged.
inline void transpose_block(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m256 r[8], t[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
#pragma GCC unroll 4
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
#pragma GCC unroll 2
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
    t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
  }
  // Rows stored in order: a caller may lay them out closer than a vector (ldd < 8), each row
  // then written over by the next (channels_last).
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) _mm256_storeu_ps(dst + i * ldd, t[i]);
}

inline void transpose_block(const double* src, int64_t lds, double* dst, int64_t ldd) {
  __m256d r[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) r[i] = _mm256_loadu_pd(src + i * lds);
  const __m256d t0 = _mm256_unpacklo_pd(r[0], r[1]), t1 = _mm256_unpackhi_pd(r[0], r[1]);
  const __m256d t2 = _mm256_unpacklo_pd(r[2], r[3]), t3 = _mm256_unpackhi_pd(r[2], r[3]);
  _mm256_storeu_pd(dst, _mm256_permute2f128_pd(t0, t2, 0x20));
  _mm256_storeu_pd(dst + ldd, _mm256_permute2f128_pd(t1, t3, 0x20));
  _mm256_storeu_pd(dst + 2 * ldd, _mm256_permute2f128_pd(t0, t2, 0x31));
  _mm256_storeu_pd(dst + 3 * ldd, _mm256_permute2f128_pd(t1, t3, 0x31));
}
#else
template <class T> inline constexpr bool has_simd_transpose = false;

template <class T> inline void transpose_block(const T*, int64_t, T*, int64_t) {}
#endif

/// Packs rows [0, mc) x cols [0, kc) of A row-major with row stride AS = a_row_stride, so
/// every MR rows form one micro-panel. Rows up to the next multiple of MR are zero.
template <class T> void pack_a(int64_t mc, int64_t kc, const T* a, int64_t rs, int64_t cs, T* dst) {
  using cfg = GemmConfig<T>;
  constexpr int64_t AS = cfg::a_row_stride;
  constexpr int64_t L = cfg::lanes;
  if (cs == 1) {
    for (int64_t i = 0; i < mc; ++i) copy_contiguous(a + i * rs, kc, dst + i * AS);
  } else if (rs == 1) {
    // Transposed A: columns are contiguous, so transpose lanes x lanes blocks.
    int64_t i0 = 0;
    if constexpr (has_simd_transpose<T>) {
      for (; i0 + L <= mc; i0 += L) {
        int64_t p0 = 0;
        for (; p0 + L <= kc; p0 += L) transpose_block(a + p0 * cs + i0, cs, dst + i0 * AS + p0, AS);
        for (int64_t p = p0; p < kc; ++p)
          for (int64_t i = i0; i < i0 + L; ++i) dst[i * AS + p] = a[p * cs + i];
      }
    }
    for (int64_t p = 0; p < kc; ++p)
      for (int64_t i = i0; i < mc; ++i) dst[i * AS + p] = a[p * cs + i];
  } else {
    for (int64_t i = 0; i < mc; ++i)
      for (int64_t p = 0; p < kc; ++p) dst[i * AS + p] = a[i * rs + p * cs];
  }
  const int64_t padded = (mc + cfg::mr - 1) / cfg::mr * cfg::mr;
  for (int64_t i = mc; i < padded; ++i) std::fill_n(dst + i * AS, kc, T(0));
}

/// Fetches the cache line at p for reading. Through asm on x86: GCC deletes a loop whose only
/// statements are __builtin_prefetch as one without effects.
inline void prefetch_line(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 0, 3);
#endif
}

/// Fetches part `part` of `parts` of a block of A, rows [0, mc) x columns [0, kc) at a with
/// strides rs and cs, into the cache, in runs of contiguous elements: pack_a then copies it
/// from there rather than waiting on each of its lines (a 1024^3 product at 1 thread on a Zen 4
/// spent 6-8% of its time packing A, whose 1 KiB rows 4 KiB apart are too short for the
/// hardware's prefetcher to stream from L3). Blocks with neither stride 1 are left alone.
template <class T>
void prefetch_block(const T* a, int64_t rs, int64_t cs, int64_t mc, int64_t kc, int64_t part, int64_t parts) {
  if (cs != 1 && rs != 1) return;
  const bool by_rows = cs == 1;
  const int64_t runs = by_rows ? mc : kc, length = by_rows ? kc : mc, stride = by_rows ? rs : cs;
  constexpr int64_t line = 64 / static_cast<int64_t>(sizeof(T));
  for (int64_t r = runs * part / parts; r < runs * (part + 1) / parts; ++r)
    for (int64_t e = 0; e < length; e += line) prefetch_line(a + r * stride + e);
}

/// The row length of B's packed panel of `cols` columns (see pack_b): NR for a whole panel, a
/// last, partial one only its whole vectors. Padded to NR, a 32-column panel's rows would be
/// 256 bytes apart with half of each unread, its 200-row depth block spread over twice the
/// cache sets it needs (LeNet5's fc1, x^T).
template <class T, int64_t NR> constexpr int64_t packed_b_width(int64_t cols) {
  constexpr int64_t L = GemmConfig<T>::lanes;
  return cols >= NR ? NR : (cols + L - 1) / L * L;
}

/// Packs rows [0, kc) x cols [0, nc) of B into NR-column panels: panel-major, then p, then
/// column, each panel's rows packed_b_width apart; columns past nc are zero.
template <class T, int64_t NR> void pack_b(int64_t kc, int64_t nc, const T* b, int64_t rs, int64_t cs, T* dst) {
  using batch = xsimd::batch<T>;
  constexpr int64_t L = static_cast<int64_t>(batch::size);
  // Whole panels of contiguous rows are packed a group at a time, so that B is read in runs of
  // 256 bytes rather than one cache line of each row a panel, runs the hardware prefetcher
  // follows: all of a 1024 x 1024 B in 16-column panels (AVX2) packed in 315 us instead of
  // 500 on a Zen 3, and 1024^3 at 1 thread 1% faster (paired medians of 150 alternations).
  constexpr int64_t group = std::max<int64_t>(1, 256 / (NR * static_cast<int64_t>(sizeof(T))));
  for (int64_t j0 = 0; j0 < nc;) {
    const int64_t cols = std::min<int64_t>(NR, nc - j0);
    const int64_t width = packed_b_width<T, NR>(cols);
    const T* src = b + j0 * cs;
    if (cols == NR && cs == 1) {
      const int64_t panels = std::min(group, (nc - j0) / NR);
      for (int64_t p = 0; p < kc; ++p) {
        const T* s = src + p * rs;
#pragma GCC unroll 4
        for (int64_t q = 0; q < panels; ++q)
#pragma GCC unroll 4
          for (int64_t j = 0; j < NR; j += L)
            batch::load_unaligned(s + q * NR + j).store_aligned(dst + (q * kc + p) * NR + j);
      }
      j0 += panels * NR;
      dst += panels * NR * kc;
      continue;
    }
    if (rs == 1) {
      // Transposed B: columns are contiguous, so transpose lanes x lanes blocks; a partial
      // panel (a conv's weight gradient has 25 or 150 columns) too, then zeros past its end.
      int64_t p0 = 0;
      int64_t blocked = 0;  // columns whose rows below p0 the transposes wrote
      if constexpr (has_simd_transpose<T>) {
        blocked = cols / L * L;
        for (; p0 + L <= kc; p0 += L) {
          for (int64_t jb = 0; jb < blocked; jb += L) {
            transpose_block(src + jb * cs + p0, cs, dst + p0 * width + jb, width);
          }
        }
      }
      for (int64_t j = 0; j < cols; ++j) {
        const T* s = src + j * cs;
        for (int64_t p = j < blocked ? p0 : 0; p < kc; ++p) dst[p * width + j] = s[p];
      }
      if (cols < width)
        for (int64_t p = 0; p < kc; ++p) std::fill(dst + p * width + cols, dst + (p + 1) * width, T(0));
    } else {
      for (int64_t p = 0; p < kc; ++p) {
        int64_t j = 0;
        for (; j < cols; ++j) dst[p * width + j] = src[p * rs + j * cs];
        for (; j < width; ++j) dst[p * width + j] = T(0);
      }
    }
    j0 += NR;
    dst += NR * kc;
  }
}

/// Register-blocked tile: C[rows x cols] = alpha * A_panel * B_panel + beta * C, computing MK
/// rows x NK vectors (MK >= rows, NK * lanes >= cols). A(i,p) is at pa[i * lda + p]: lda is
/// a_row_stride in a packed panel (see pack_a), or A's own row stride when it is read in place
/// (MK rows must be readable). B row p at pb + p * ldb: NB * lanes in a packed panel (see
/// pack_b), or B's own row stride when it is read in place; with Shifted, at pb + b_rows[p]
/// instead (B's rows are windows of one array, see gemm_shifted). Full tiles go straight to C,
/// edge tiles through an aligned temporary. beta == 0 never reads C. next_c, when given, is the
/// whole tile of C (ldc apart) that the next call writes: its lines are fetched one every
/// kGemmNextCSteps steps of k.
template <class T, int MK, int NK, int NB, bool Shifted = false>
void micro_kernel(int64_t kc, const T* __restrict pa, int64_t lda, const T* __restrict pb, int64_t ldb, T alpha, T beta,
                  T* __restrict c, int64_t ldc, int64_t rows, int64_t cols, const int64_t* b_rows = nullptr,
                  const T* next_c = nullptr) {
  using batch = xsimd::batch<T>;
  constexpr int64_t L = static_cast<int64_t>(batch::size);

  batch acc[MK][NK];
#pragma GCC unroll 32
  for (int i = 0; i < MK; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NK; ++j) acc[i][j] = batch(T(0));

  auto multiply_add = [&](int64_t p_begin, int64_t p_end) {
#pragma GCC unroll 2
    for (int64_t p = p_begin; p < p_end; ++p) {
      const T* brow = Shifted ? pb + b_rows[p] : pb;
      batch bv[NK];
#pragma GCC unroll 4
      for (int j = 0; j < NK; ++j) bv[j] = batch::load_unaligned(brow + j * L);
#pragma GCC unroll 32
      for (int i = 0; i < MK; ++i) {
        const batch av(pa[i * lda]);
#pragma GCC unroll 4
        for (int j = 0; j < NK; ++j) acc[i][j] = xsimd::fma(av, bv[j], acc[i][j]);
      }
      ++pa;
      pb += ldb;
    }
  };
  const bool whole_tile = rows == MK && cols == NK * L;
  // A whole tile's C is fetched for writing a few steps of k before the end, so that its
  // lines (in L3 when C is large: 1024^2 is read and written once per depth block) arrive while
  // the last multiply-adds run instead of stalling the stores (1024^3 at 1 thread on a Zen 4,
  // the kernel's loop over C alone: 105-112 -> 113-114 GFLOP/s).
  const int64_t k_prefetch = whole_tile ? std::max<int64_t>(0, kc - kGemmPrefetchSteps) : kc;
  if (next_c) {
    for (int64_t p = 0; p < k_prefetch; p += kGemmNextCSteps) {
      if (const int64_t line = p / kGemmNextCSteps; line < MK * NK)
        prefetch_line(next_c + line / NK * ldc + line % NK * L);
      multiply_add(p, std::min(p + kGemmNextCSteps, k_prefetch));
    }
  } else {
    multiply_add(0, k_prefetch);
  }
  if (whole_tile) {
#pragma GCC unroll 32
    for (int i = 0; i < MK; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NK; ++j) __builtin_prefetch(c + i * ldc + j * L, 1, 3);
  }
  multiply_add(k_prefetch, kc);

  const batch va(alpha);
  if (whole_tile) {
    if (beta == T(0)) {
#pragma GCC unroll 32
      for (int i = 0; i < MK; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < NK; ++j) (va * acc[i][j]).store_unaligned(c + i * ldc + j * L);
    } else if (beta == T(1)) {
#pragma GCC unroll 32
      for (int i = 0; i < MK; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < NK; ++j) {
          T* cp = c + i * ldc + j * L;
          xsimd::fma(va, acc[i][j], batch::load_unaligned(cp)).store_unaligned(cp);
        }
    } else {
      const batch vb(beta);
#pragma GCC unroll 32
      for (int i = 0; i < MK; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < NK; ++j) {
          T* cp = c + i * ldc + j * L;
          xsimd::fma(va, acc[i][j], vb * batch::load_unaligned(cp)).store_unaligned(cp);
        }
    }
    return;
  }

  alignas(64) T tmp[MK * NK * L];
#pragma GCC unroll 32
  for (int i = 0; i < MK; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NK; ++j) (va * acc[i][j]).store_aligned(tmp + (i * NK + j) * L);
  for (int64_t i = 0; i < rows; ++i) {
    T* crow = c + i * ldc;
    const T* trow = tmp + i * NK * L;
    if (beta == T(0)) {
      for (int64_t j = 0; j < cols; ++j) crow[j] = trow[j];
    } else {
      for (int64_t j = 0; j < cols; ++j) crow[j] = trow[j] + beta * crow[j];
    }
  }
}

template <class T> using MicroKernelFn = void (*)(int64_t, const T*, int64_t, const T*, int64_t, T, T, T*, int64_t,
                                                  int64_t, int64_t, const int64_t*, const T*);

/// Kernels for edge tiles, indexed by [rows - 1][vectors - 1]. Row counts round up to even so
/// the table stays small; a short tile then wastes at most one row of work.
template <class T, int NB, int MR, bool Shifted, int... Is>
constexpr auto make_kernel_table(std::integer_sequence<int, Is...>) {
  std::array<std::array<MicroKernelFn<T>, NB>, MR> table{};
  auto fill_row = [&]<int I, int... Js>(std::integer_sequence<int, Js...>) {
    constexpr int mk = std::min(MR, (I + 2) / 2 * 2);
    ((table[I][Js] = &micro_kernel<T, mk, Js + 1, NB, Shifted>), ...);
  };
  (fill_row.template operator()<Is>(std::make_integer_sequence<int, NB>{}), ...);
  return table;
}

template <class T, int NB, int MR, bool Shifted = false>
inline constexpr auto k_kernel_table = make_kernel_table<T, NB, MR, Shifted>(std::make_integer_sequence<int, MR>{});

/// Splits `total` into ceil(total / max_block) near-equal blocks, each rounded up to `unit`;
/// avoids a thin last block (e.g. k = 257 as 256 + 1).
inline int64_t balanced_block(int64_t total, int64_t max_block, int64_t unit) {
  const int64_t nblocks = (total + max_block - 1) / max_block;
  const int64_t per = (total + nblocks - 1) / nblocks;
  return std::min(max_block, (per + unit - 1) / unit * unit);
}

/// C = beta * C over an m x n block; beta == 0 writes zeros without reading C.
template <class T> void scale_c(int64_t m, int64_t n, T beta, T* c, int64_t ldc) {
  if (beta == T(1)) return;
  for (int64_t i = 0; i < m; ++i) {
    T* row = c + i * ldc;
    if (beta == T(0)) {
      std::fill(row, row + n, T(0));
    } else {
      for (int64_t j = 0; j < n; ++j) row[j] *= beta;
    }
  }
}

/// Whether gemm_blocked reads B where it is (rows brs apart) for depth blocks of kc x nc rather
/// than copying it into panels first: when each of its elements is used at most twice, by one or
/// two micro-panels of A rows (LeNet5's conv GEMMs), or when a depth block of it is small enough
/// for each micro-panel of A to read it from L2: attention's 64 x 32 blocks, whose packing cost
/// as much as their product, and a dense layer's W or x (in LeNet5's step on two threads, copying
/// half of fc1's W for its input gradient took 3-4 us a thread and x for its weight gradient 2;
/// read in place, the step is 3-5% faster).
template <class T> bool b_read_in_place(int64_t m, int64_t kc, int64_t nc, int64_t bcs) {
  return bcs == 1 && (m <= 2 * GemmConfig<T>::mr || kc * nc * static_cast<int64_t>(sizeof(T)) <= kGemmInPlaceBlockB);
}

/// Whether gemm_blocked reads A, with contiguous rows, where it is: when it is small (its
/// packing cost a tenth of a 64 x 64 x 64 product) or when one panel of B covers C's columns, so
/// that each row of A is read once anyway (a dense layer's W in W x^T, see gemm_transposed: fc1
/// of LeNet5 27 -> 20 us).
template <class T> bool a_read_in_place(int64_t m, int64_t n, int64_t k, int64_t acs) {
  return acs == 1 && (m * k * static_cast<int64_t>(sizeof(T)) <= kGemmSmallA || n <= GemmConfig<T>::nr);
}

/// A block of A, rows x cols at a with strides rs and cs, that the next product will pack.
template <class T> struct NextABlock {
  const T* a = nullptr;
  int64_t rs = 0, cs = 0, rows = 0, cols = 0;
};

/// The blocked GEMM of gemm_serial; with packed_a, A is read from there as pack_a lays it out
/// (rows a_row_stride apart, k at most kc) instead of from a, ars, acs; with packed_b, B is read
/// from there as pack_b lays it out (n at most nc, k at most kc) instead of from b, brs, bcs.
/// Given a packed A of one row block, it fetches `after` into the cache as it runs.
template <class T> void gemm_blocked(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t ars, int64_t acs,
                                     const T* packed_a, const T* b, int64_t brs, int64_t bcs, const T* packed_b, T beta,
                                     T* c, int64_t ldc, const GemmBlockDone* done, int64_t row0, int64_t col0,
                                     const NextABlock<T>& after = {}) {
  using cfg = GemmConfig<T>;
  constexpr int MR = cfg::mr;
  constexpr int NB = cfg::nb;
  constexpr int64_t NR = cfg::nr;
  constexpr int64_t L = cfg::lanes;
  constexpr int64_t a_panel = MR * cfg::a_row_stride;  // elements per packed A micro-panel

  const int64_t kc_max = packed_a || packed_b ? k : balanced_block(k, cfg::kc, 1);
  const int64_t mc_max = balanced_block(m, cfg::mc, MR);
  const int64_t nc_max = packed_b ? n : balanced_block(n, cfg::nc, NR);

  auto& ws = gemm_workspace<T>();
  T* pb_buf = packed_b ? nullptr : ws.m_b.get((nc_max + NR - 1) / NR * NR * kc_max);
  // A last, partial panel of B read in place is packed unless its rows are whole vectors: else
  // they would be read past their end. Of A read in place, only a last micro-panel of an odd
  // number of rows is packed, since the edge kernels read rows up to an even count.
  const bool b_in_place = !packed_b && b_read_in_place<T>(m, kc_max, nc_max, bcs);
  const bool b_whole_vectors = n % L == 0;
  const bool a_in_place = !packed_a && a_read_in_place<T>(m, n, k, acs);

  // With more than one column block, each depth block of A is packed once, in the first, into a
  // buffer for all its rows that the others read: up to kGemmKeptA bytes, which a core's share
  // of L3 holds between the blocks (on one thread, medians of alternations: 1024^3 0.6-1.2%
  // faster, 2048^3 3%).
  const bool keep_a = !packed_a && !a_in_place && n > nc_max &&
                      (m + MR - 1) / MR * a_panel * static_cast<int64_t>(sizeof(T)) <= kGemmKeptA;
  T* pa_buf = packed_a ? nullptr : ws.m_a.get(((keep_a ? m : mc_max) + MR - 1) / MR * a_panel);

  for (int64_t pc = 0; pc < k; pc += kc_max) {
    const int64_t kc = std::min(kc_max, k - pc);
    // Only the first k-block applies the caller's beta; later ones accumulate.
    const T beta_eff = pc == 0 ? beta : T(1);
    for (int64_t jc = 0; jc < n; jc += nc_max) {
      const int64_t nc = std::min(nc_max, n - jc);
      const T* b_block = b + pc * brs + jc * bcs;
      const int64_t whole = !b_in_place ? 0 : b_whole_vectors && n < NR ? nc : nc / NR * NR;  // read in place
      if (!packed_b) pack_b<T, NR>(kc, nc - whole, b_block + whole * bcs, brs, bcs, pb_buf);
      const T* b_panels = packed_b ? packed_b : pb_buf;
      for (int64_t ic = 0; ic < m; ic += mc_max) {
        const int64_t mc = std::min(mc_max, m - ic);
        T* a_slot = keep_a ? pa_buf + ic / MR * a_panel : pa_buf;
        const T* a_panels = packed_a ? packed_a + ic * cfg::a_row_stride : a_slot;
        if (!packed_a && !a_in_place && (!keep_a || jc == 0))
          pack_a<T>(mc, kc, a + ic * ars + pc * acs, ars, acs, a_slot);
        // The block of A read next: the next rows, else the next column block's first, else the
        // next depth block's. It is fetched a part at a time, one part beside each product of
        // this block: from A, to be packed, or from the packed rows kept.
        const int64_t next_ic = ic + mc < m ? ic + mc : 0;
        const int64_t next_jc = ic + mc < m ? jc : jc + nc < n ? jc + nc : 0;
        const int64_t next_pc = ic + mc < m || jc + nc < n ? pc : pc + kc;
        const bool next_kept = keep_a && next_jc > 0;
        NextABlock<T> next = after;
        if (!packed_a && !a_in_place && next_pc < k)
          next = {next_kept ? pa_buf + next_ic / MR * a_panel : a + next_ic * ars + next_pc * acs,
                  next_kept ? cfg::a_row_stride : ars, next_kept ? 1 : acs, std::min(mc_max, m - next_ic),
                  std::min(kc_max, k - next_pc)};
        const int64_t micro_panels = (mc + MR - 1) / MR, tiles_across = (nc + NR - 1) / NR;
        // Each A micro-panel stays in L1 while the packed B block streams past it.
        for (int64_t ir = 0; ir < mc; ir += MR) {
          const int64_t rows = std::min<int64_t>(MR, mc - ir);
          const T* pa = a_panels + ir / MR * a_panel;
          int64_t lda = cfg::a_row_stride;
          if (a_in_place) {
            pa = a + (ic + ir) * ars + pc;
            lda = ars;
            if (rows % 2 != 0 && rows < MR) {
              pack_a<T>(rows, kc, pa, ars, acs, pa_buf);
              pa = pa_buf;
              lda = cfg::a_row_stride;
            }
          }
          T* c_row = c + (ic + ir) * ldc + jc;
          for (int64_t jr = 0; jr < nc; jr += NR) {
            if (next.a)
              prefetch_block(next.a, next.rs, next.cs, next.rows, next.cols, ir / MR * tiles_across + jr / NR,
                             micro_panels * tiles_across);
            const int64_t cols = std::min(NR, nc - jr);
            const bool in_place = jr < whole;
            const T* pb = in_place ? b_block + jr : b_panels + (jr - whole) * kc;
            const int64_t ldb = in_place ? brs : packed_b_width<T, NR>(cols);
            if (rows == MR && cols == NR) {
              // The next whole tile: the next along this row of tiles, else the next row's first.
              const T* next_c = jr + 2 * NR <= nc               ? c_row + jr + NR
                                : ir + 2 * MR <= mc && NR <= nc ? c_row + MR * ldc
                                                                : nullptr;
              micro_kernel<T, MR, NB, NB>(kc, pa, lda, pb, ldb, alpha, beta_eff, c_row + jr, ldc, rows, cols, nullptr,
                                          next_c);
            } else {
              const auto fn = k_kernel_table<T, NB, MR>[rows - 1][(cols + L - 1) / L - 1];
              fn(kc, pa, lda, pb, ldb, alpha, beta_eff, c_row + jr, ldc, rows, cols, nullptr, nullptr);
            }
          }
        }
        if (done && pc + kc == k) (*done)(row0 + ic, mc, col0 + jc, nc);
      }
    }
  }
}

/// Single-threaded blocked GEMM on the calling thread (m, n, k > 0). `done`, when given, is
/// called on each block of C once its last k-block is added, with C's rows and columns
/// counted from (row0, col0).
template <class T> void gemm_serial(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t ars, int64_t acs,
                                    const T* b, int64_t brs, int64_t bcs, T beta, T* c, int64_t ldc,
                                    const GemmBlockDone* done = nullptr, int64_t row0 = 0, int64_t col0 = 0) {
  gemm_blocked(m, n, k, alpha, a, ars, acs, static_cast<const T*>(nullptr), b, brs, bcs, static_cast<const T*>(nullptr),
               beta, c, ldc, done, row0, col0);
}

/// C = alpha A B + beta C on the calling thread (k <= GemmConfig<T>::kc) for an A already in
/// pack_a's layout: row i at packed_a + i * GemmConfig<T>::a_row_stride, rows up to the next
/// multiple of GemmConfig<T>::mr readable (zeros). A producer that writes A there (attention's
/// blocks of probabilities) saves the copy.
template <class T> void gemm_packed_a(int64_t m, int64_t n, int64_t k, T alpha, const T* packed_a, const T* b,
                                      int64_t brs, int64_t bcs, T beta, T* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) return scale_c(m, n, beta, c, ldc);
  gemm_blocked(m, n, k, alpha, static_cast<const T*>(nullptr), 0, 0, packed_a, b, brs, bcs,
               static_cast<const T*>(nullptr), beta, c, ldc, nullptr, 0, 0);
}

/// C[m x n] = A B on the calling thread, where B(p, j) = b[b_rows[p] + j]: B's rows are windows
/// of one array at the given offsets, read in place. A stride-1 convolution is such a product
/// when its outputs are counted on the input's grid (row stride w, not out_w): tap (c, ki, kj)
/// reads x from offset (c * h + ki) * w + kj on, so no column matrix is built. b need only hold
/// b_rows[p] + j for j < n: a last, partial panel of columns is copied out before it is read.
template <class T> void gemm_shifted(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b,
                                     const int64_t* b_rows, T* c, int64_t ldc) {
  using cfg = GemmConfig<T>;
  // Convolutions have few output channels (LeNet5: 6 and 16), so tiles are short and wide: with
  // 32 registers 8 rows x 3 vectors (24 accumulators, 12 loads per 24 FMAs); else the default.
  constexpr int MR = cfg::vector_regs >= 32 ? 8 : cfg::mr;
  constexpr int NB = cfg::vector_regs >= 32 ? 3 : cfg::nb;
  constexpr int64_t L = cfg::lanes;
  constexpr int64_t NR = NB * L;
  constexpr int64_t AS = cfg::a_row_stride;
  if (m <= 0 || n <= 0) return;
  if (k <= 0) return scale_c(m, n, T(0), c, ldc);
  const int64_t kc_max = balanced_block(k, cfg::kc, 1);
  const int64_t mc_max = balanced_block(m, cfg::mc, MR);
  auto& ws = gemm_workspace<T>();
  // pack_a pads to its own micro-panel height; rows are AS apart whatever the tile.
  T* pa_buf = ws.m_a.get((mc_max + cfg::mr - 1) / cfg::mr * cfg::mr * AS);
  T* pb_buf = ws.m_b.get(NR * kc_max);
  const int64_t whole = n / NR * NR;
  for (int64_t pc = 0; pc < k; pc += kc_max) {
    const int64_t kc = std::min(kc_max, k - pc);
    const T beta = pc == 0 ? T(0) : T(1);
    const int64_t* rows_pc = b_rows + pc;
    if (whole < n) {
      for (int64_t p = 0; p < kc; ++p) {
        const T* src = b + rows_pc[p] + whole;
        T* dst = pb_buf + p * NR;
        std::copy(src, src + (n - whole), dst);
        std::fill(dst + (n - whole), dst + NR, T(0));
      }
    }
    for (int64_t ic = 0; ic < m; ic += mc_max) {
      const int64_t mc = std::min(mc_max, m - ic);
      pack_a<T>(mc, kc, a + ic * lda + pc, lda, 1, pa_buf);
      for (int64_t ir = 0; ir < mc; ir += MR) {
        const T* pa = pa_buf + ir * AS;
        const int64_t rows = std::min<int64_t>(MR, mc - ir);
        T* c_row = c + (ic + ir) * ldc;
        const auto shifted = k_kernel_table<T, NB, MR, true>[rows - 1][NB - 1];
        for (int64_t jr = 0; jr < whole; jr += NR)
          shifted(kc, pa, AS, b + jr, 0, T(1), beta, c_row + jr, ldc, rows, NR, rows_pc, nullptr);
        if (whole < n) {
          const int64_t cols = n - whole;
          k_kernel_table<T, NB, MR>[rows - 1][(cols + L - 1) / L - 1](kc, pa, AS, pb_buf, NR, T(1), beta, c_row + whole,
                                                                      ldc, rows, cols, nullptr, nullptr);
        }
      }
    }
  }
}

/// C's rows [0, RM) x columns [0, RN) of the dot-product form below: RM x RN vector accumulators
/// running along k, the operands' rows read once per tile.
template <class T, int RM, int RN>
void dot_tile(int64_t k, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  using B = xsimd::batch<T>;
  constexpr auto lanes = static_cast<int64_t>(B::size);
  std::array<B, RM * RN> acc;
  acc.fill(B(T(0)));
  int64_t p = 0;
  for (; p + lanes <= k; p += lanes) {
    std::array<B, RN> bs;
    for (int j = 0; j < RN; ++j) bs[j] = B::load_unaligned(b + j * ldb + p);
    for (int i = 0; i < RM; ++i) {
      const B ai = B::load_unaligned(a + i * lda + p);
      for (int j = 0; j < RN; ++j) acc[i * RN + j] = xsimd::fma(ai, bs[j], acc[i * RN + j]);
    }
  }
  for (int i = 0; i < RM; ++i)
    for (int j = 0; j < RN; ++j) {
      T dot = xsimd::hadd(acc[i * RN + j]);
      for (int64_t q = p; q < k; ++q) dot += a[i * lda + q] * b[j * ldb + q];
      T& out = c[i * ldc + j];
      out = beta == T(0) ? alpha * dot : alpha * dot + beta * out;
    }
}

/// Rows and columns of C in gemm_dots' square tiles: their sums, a row of A and RN rows of B
/// in registers (4 x 4 in 32 of them, 3 x 3 in 16).
template <class T> inline constexpr int k_dot_tile = GemmConfig<T>::vector_regs >= 32 ? 4 : 3;

/// dot_tile for RM and RN of at most k_dot_tile, chosen at run time (the edges of C).
template <class T, int RM = k_dot_tile<T>, int RN = k_dot_tile<T>>
void dot_tile_upto(int rm, int rn, int64_t k, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c,
                   int64_t ldc) {
  if constexpr (RM > 1) {
    if (rm < RM) return dot_tile_upto<T, RM - 1, RN>(rm, rn, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  if constexpr (RN > 1) {
    if (rn < RN) return dot_tile_upto<T, RM, RN - 1>(rm, rn, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  dot_tile<T, RM, RN>(k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/// C = alpha * A B + beta * C as m x n dot products of length k, for A's rows and B's columns
/// both contiguous along k: the form of a convolution's weight gradient (c_out x c_in * kh * kw
/// outputs, each summed over every image's positions), where C is too small for the packed
/// kernels' tiles to pay for their packing.
template <class T> void gemm_dots(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
                                  int64_t ldb, T beta, T* c, int64_t ldc) {
  constexpr int64_t tile = k_dot_tile<T>;
  for (int64_t i = 0; i < m; i += tile)
    for (int64_t j = 0; j < n; j += tile)
      dot_tile_upto<T>(static_cast<int>(std::min(tile, m - i)), static_cast<int>(std::min(tile, n - j)), k, alpha,
                       a + i * lda, lda, b + j * ldb, ldb, beta, c + i * ldc + j, ldc);
}

/// Whether gemm_dots suits the product: both operands contiguous along k, a long k, and a C of
/// few rows or columns, which the packed kernels' tiles (6 x 64 with AVX-512, 6 x 16 with AVX2)
/// would mostly waste.
inline bool dots_suit(int64_t m, int64_t n, int64_t k, int64_t a_col_stride, int64_t b_row_stride) {
  return a_col_stride == 1 && b_row_stride == 1 && k >= 1024 && std::min(m, n) <= 8 && m * n <= 512;
}

/// [0, extent) cut into near-equal blocks of whole tiles (at most max_blocks, within a tile of
/// each other): the share of each thread of a split product.
struct TileBlocks {
  int64_t extent, tile, tiles, blocks;
  TileBlocks(int64_t extent_, int64_t tile_, int64_t max_blocks)
      : extent(extent_),
        tile(tile_),
        tiles((extent_ + tile_ - 1) / tile_),
        blocks(std::clamp<int64_t>(max_blocks, 1, tiles)) {}
  int64_t begin(int64_t blk) const { return tiles * blk / blocks * tile; }
  int64_t end(int64_t blk) const { return std::min(extent, tiles * (blk + 1) / blocks * tile); }
};

/// Whether C = A op(B) is better computed as its transpose C^T = op(B)^T A^T (gemm_transposed):
/// a dense layer's x W^T, with W [n, k] stored row-major and x a batch of at most a panel of
/// rows. As the right operand W^T would be packed with a transpose of all of W (LeNet5's fc1:
/// 9.5 of 31 us); as the left, W's rows are read in place, and what is transposed instead, x
/// and C, must be smaller (attention's 64 queries by 128 keys over 64 dimensions are not:
/// 6% slower transposed).
template <class T> bool transposed_suits(int64_t m, int64_t n, int64_t k, int64_t a_col_stride, int64_t b_row_stride,
                                         int64_t b_col_stride) {
  return b_row_stride == 1 && b_col_stride != 1 && a_col_stride == 1 && m <= GemmConfig<T>::nr && n * k > m * (k + n);
}

/// Columns [lo, hi) of C = alpha A op(B) + beta C on the calling thread, as rows [lo, hi) of
/// C^T = alpha op(B)^T A^T (op(B)^T's rows are b's, bcs apart) transposed into C.
template <class T> void gemm_transposed_columns(int64_t m, int64_t lo, int64_t hi, int64_t k, T alpha, const T* a,
                                                int64_t ars, const T* b, int64_t bcs, T beta, T* c, int64_t ldc) {
  const int64_t rows = hi - lo;
  T* ct = gemm_workspace<T>().m_c_transposed.get(rows * m);
  gemm_serial(rows, m, k, alpha, b + lo * bcs, bcs, int64_t{1}, a, int64_t{1}, ars, T(0), ct, m);
  c += lo;
  auto put = [&](int64_t j0, int64_t j1, int64_t i0, int64_t i1) {  // C(j, i) = ct(i, j), one by one
    for (int64_t j = j0; j < j1; ++j)
      for (int64_t i = i0; i < i1; ++i)
        c[j * ldc + i] = beta == T(0) ? ct[i * m + j] : ct[i * m + j] + beta * c[j * ldc + i];
  };
  int64_t whole_rows = 0, whole_cols = 0;  // what whole lanes x lanes blocks of ct cover
  if constexpr (has_simd_transpose<T>) {
    using V = xsimd::batch<T>;
    constexpr int64_t L = GemmConfig<T>::lanes;
    whole_rows = rows / L * L;
    whole_cols = m / L * L;
    alignas(64) T block[L * L];
    for (int64_t i0 = 0; i0 < whole_rows; i0 += L)
      for (int64_t j0 = 0; j0 < whole_cols; j0 += L) {
        if (beta == T(0)) {
          transpose_block(ct + i0 * m + j0, m, c + j0 * ldc + i0, ldc);
          continue;
        }
        transpose_block(ct + i0 * m + j0, m, block, L);
        for (int64_t r = 0; r < L; ++r) {
          T* row = c + (j0 + r) * ldc + i0;
          xsimd::fma(V(beta), V::load_unaligned(row), V::load_aligned(block + r * L)).store_unaligned(row);
        }
      }
  }
  put(whole_cols, m, 0, whole_rows);
  put(0, m, whole_rows, rows);
}

/// Whether a product split among threads along C's columns tells `done` of C after the product,
/// in whole rows shared among the threads, instead of each block's rows one call each as the
/// block is finished (each call costs about as much as re-packing 256 elements): a C of at most
/// 64 KiB, still in cache when read again (a dense layer's output, [32, 120]).
template <class T> bool done_after_product(int64_t m, int64_t n) {
  return static_cast<double>(m) * static_cast<double>(n) * sizeof(T) <= 64.0 * 1024.0;
}

/// Tells `done` of C's rows [0, m) x columns [0, n), in whole rows shared among the threads; a C
/// of at most 16 KiB all at once on the calling thread. A region of its own cost more than such
/// an epilogue (LeNet5's fc1 forward on 2 threads, [32, 120]: 1.3 us alone against 2.5 shared),
/// and would leave half of the layer's output in the other core's cache, to be read from there
/// by the next layer's product if that runs on one thread (fc2's: 1 us more).
template <class T> void tell_rows_done(int64_t m, int64_t n, const GemmBlockDone& done) {
  if (static_cast<double>(m) * static_cast<double>(n) * sizeof(T) <= 16.0 * 1024.0) return done(0, m, 0, n);
  const int64_t nt = num_threads();
  parallel_for(0, m, (m + nt - 1) / nt, [&](int64_t lo, int64_t hi) { done(lo, hi - lo, 0, n); });
}

/// gemm for a product transposed_suits, on `threads` threads: each computes whole micro-tiles of
/// C^T's rows (W's rows, the partition a dense layer's weight gradient and update use too).
template <class T> void gemm_transposed(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t ars, const T* b,
                                        int64_t bcs, T beta, T* c, int64_t ldc, int threads,
                                        const GemmBlockDone* done) {
  const TileBlocks rows(n, GemmConfig<T>::mr, threads);
  if (rows.blocks == 1) {
    gemm_transposed_columns(m, 0, n, k, alpha, a, ars, b, bcs, beta, c, ldc);
    if (done) (*done)(0, m, 0, n);
    return;
  }
  const GemmBlockDone* block_done = done_after_product<T>(m, n) ? nullptr : done;
  parallel_for(0, rows.blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t blk = first; blk < last; ++blk) {
      const int64_t lo = rows.begin(blk), hi = rows.end(blk);
      gemm_transposed_columns(m, lo, hi, k, alpha, a, ars, b, bcs, beta, c, ldc);
      if (block_done) (*block_done)(0, m, lo, hi - lo);
    }
  });
  if (done && !block_done) tell_rows_done<T>(m, n, *done);
}

/// Where gemm_k_halves splits k (0: it does not apply): a dense layer's input gradient g W, with
/// W [k, n] stored row-major, at least three times C's size and within two depth blocks.
template <class T> int64_t k_halves_split(int64_t m, int64_t k, T alpha, int64_t b_col_stride) {
  constexpr int64_t tile = GemmConfig<T>::mr;
  const int64_t split = (k / 2 + tile - 1) / tile * tile;
  const bool suits = alpha == T(1) && b_col_stride == 1 && k >= 3 * m && split <= GemmConfig<T>::kc &&
                     k - split <= GemmConfig<T>::kc && split < k;
  return suits ? split : 0;
}

/// C = A B + beta C as two sums over k, [0, split) and [split, k), the second added to the
/// first: on one thread, as gemm_serial adds depth blocks; on several, the halves at once, the
/// second into a partial product added afterwards by rows. The same bits either way. Split
/// along k, each core reads only its half of W's rows, the partition the layer's forward
/// (gemm_transposed) and weight gradient (split along m) use as well: split along n, each core
/// read half of every row, and the update then took those lines back (LeNet5's fc1 on 2
/// threads: ~96 KiB of W between the cores a step). Each half goes in 2 x threads column
/// blocks, dealt in order (on two threads, each thread's share is one half): a worker that
/// comes late, still on a node in the background, leaves the caller the rest of its half
/// (LeNet5's fc1 after fc2's update on 2 threads: the caller's wait at the end 9.5 -> 0.7 us,
/// the product 23 -> 21 us, medians over noisy rounds).
template <class T> void gemm_k_halves(int64_t m, int64_t n, int64_t k, int64_t split, const T* a, int64_t ars,
                                      int64_t acs, const T* b, int64_t brs, T beta, T* c, int64_t ldc, int threads,
                                      const GemmBlockDone* done) {
  if (threads <= 1) {
    gemm_serial(m, n, split, T(1), a, ars, acs, b, brs, int64_t{1}, beta, c, ldc);
    gemm_serial(m, n, k - split, T(1), a + split * acs, ars, acs, b + split * brs, brs, int64_t{1}, T(1), c, ldc, done);
    return;
  }
  const TileBlocks cols(n, GemmConfig<T>::nr, 2 * threads);  // of each half
  T* second = gemm_workspace<T>().m_second_half.get(m * n);
  parallel_for(0, 2 * cols.blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t blk = first; blk < last; ++blk) {
      const bool first_half = blk < cols.blocks;
      const int64_t lo = cols.begin(blk % cols.blocks), hi = cols.end(blk % cols.blocks);
      const int64_t p0 = first_half ? 0 : split, depth = first_half ? split : k - split;
      gemm_serial(m, hi - lo, depth, T(1), a + p0 * acs, ars, acs, b + p0 * brs + lo, brs, int64_t{1},
                  first_half ? beta : T(0), first_half ? c + lo : second + lo, first_half ? ldc : n);
    }
  });
  parallel_for(0, m, (m + threads - 1) / threads, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      T* row = c + i * ldc;
      const T* add = second + i * n;
      for (int64_t j = 0; j < n; ++j) row[j] += add[j];
    }
    if (done) (*done)(lo, hi - lo, 0, n);
  });
}

/// Whether gemm_column_homes suits a product split along n among `threads`: each thread's
/// share would pack both of its operands (gemm_serial), so packing them into buffers the threads
/// share costs nothing more.
template <class T>
bool homes_suit(int64_t m, int64_t n, int64_t k, int64_t a_col_stride, int64_t b_col_stride, int threads) {
  using cfg = GemmConfig<T>;
  const TileBlocks homes(n, cfg::nr, threads);
  const int64_t width = homes.end(0) - homes.begin(0);
  const int64_t kc = balanced_block(k, cfg::kc, 1), nc = balanced_block(width, cfg::nc, cfg::nr);
  return homes.blocks > 1 && !b_read_in_place<T>(m, kc, nc, b_col_stride) &&
         !a_read_in_place<T>(m, width, k, a_col_stride);
}

/// C = alpha A B + beta C on num_threads() threads, C's columns cut into one home per thread as
/// TileBlocks does. A home's work is a sequence of items, for each of its column blocks and
/// within it each depth block: packing one panel of that B block into the home's buffer, then
/// multiplying one row block of A (packed by whoever takes it) by the block. A thread works
/// through its own home's items and then takes what is left of the others', in order: an item
/// waits only for the items before it that it reads (a row block for its B block's panels; a
/// panel for the row blocks that read the last B block in the buffer), which are already taken
/// and running, so no thread waits for one that has not come. On a quiet machine each thread runs
/// just its own home, as a static split along n would; where another process takes a core for a
/// while (a 2-vCPU host with noisy neighbours) the other thread finishes its work for it (1024^3 on
/// 2 threads with a neighbour spinning 2 of every 10 ms on one core: 5-7% faster than the static
/// split, medians of 20 alternations; alone, the same within 0.5%).
template <class T> void gemm_column_homes(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t ars,
                                          int64_t acs, const T* b, int64_t brs, int64_t bcs, T beta, T* c, int64_t ldc,
                                          const GemmBlockDone* done) {
  using cfg = GemmConfig<T>;
  constexpr int64_t MR = cfg::mr;
  constexpr int64_t NR = cfg::nr;
  const TileBlocks homes(n, NR, num_threads());
  const int64_t kc_max = balanced_block(k, cfg::kc, 1);
  const int64_t mc_max = balanced_block(m, cfg::mc, MR);
  const int64_t nc_max = balanced_block(homes.end(0) - homes.begin(0), cfg::nc, NR);
  const int64_t depth_blocks = (k + kc_max - 1) / kc_max;
  const int64_t row_blocks = (m + mc_max - 1) / mc_max;
  const int64_t panels = (nc_max + NR - 1) / NR;  // packing items of every (column, depth) block
  const int64_t per_block = panels + row_blocks;
  // A home is at most one tile wider than the first (TileBlocks).
  const int64_t blocks_max = (homes.end(0) - homes.begin(0) + NR + nc_max - 1) / nc_max * depth_blocks;
  const int64_t b_size = panels * NR * kc_max;
  // Per home: the next item, and per block the panels packed and the row blocks multiplied.
  const int64_t counters_per_home = 1 + 2 * blocks_max;
  auto& ws = gemm_workspace<T>();
  T* b_bufs = ws.m_homes_b.get(homes.blocks * b_size);
  SharedCounter* counters = ws.m_homes_counters.get(homes.blocks * counters_per_home);
  auto wait_until = [](const SharedCounter& counter, int64_t value) {
    spin_until([&] { return counter.value.load(std::memory_order_acquire) >= value; });
  };
  auto work_in = [&](int64_t home) {
    SharedCounter& next = counters[home * counters_per_home];
    SharedCounter* packed = &next + 1;
    SharedCounter* multiplied = packed + blocks_max;
    const int64_t lo = homes.begin(home), hi = homes.end(home);
    const int64_t items = (hi - lo + nc_max - 1) / nc_max * depth_blocks * per_block;
    T* b_buf = b_bufs + home * b_size;
    for (;;) {
      if (next.value.load(std::memory_order_relaxed) >= items) return;
      const int64_t item = next.value.fetch_add(1, std::memory_order_relaxed);
      if (item >= items) return;
      const int64_t blk = item / per_block, part = item % per_block;
      const int64_t jc = lo + blk / depth_blocks * nc_max, pc = blk % depth_blocks * kc_max;
      const int64_t nc = std::min(nc_max, hi - jc), kc = std::min(kc_max, k - pc);
      if (part < panels) {
        if (blk > 0) wait_until(multiplied[blk - 1], row_blocks);
        const int64_t col = part * NR;
        if (col < nc)
          pack_b<T, NR>(kc, std::min(NR, nc - col), b + pc * brs + (jc + col) * bcs, brs, bcs, b_buf + col * kc);
        packed[blk].value.fetch_add(1, std::memory_order_release);
        continue;
      }
      const int64_t ic = (part - panels) * mc_max, mc = std::min(mc_max, m - ic);
      T* a_buf = gemm_workspace<T>().m_a.get((mc_max + MR - 1) / MR * MR * cfg::a_row_stride);
      pack_a<T>(mc, kc, a + ic * ars + pc * acs, ars, acs, a_buf);
      wait_until(packed[blk], panels);
      const bool last = pc + kc == k;
      // The block of A this home packs next, the next rows else the next depth block's first, is
      // fetched as this one is multiplied, as gemm_serial does (1024^3 on 2 threads 1.2-2.6% faster).
      const int64_t next_ic = ic + mc < m ? ic + mc : 0, next_pc = ic + mc < m ? pc : pc + kc;
      const NextABlock<T> after = next_pc < k
                                      ? NextABlock<T>{a + next_ic * ars + next_pc * acs, ars, acs,
                                                      std::min(mc_max, m - next_ic), std::min(kc_max, k - next_pc)}
                                      : NextABlock<T>{};
      gemm_blocked(mc, nc, kc, alpha, static_cast<const T*>(nullptr), 0, 0, a_buf, static_cast<const T*>(nullptr), 0, 0,
                   b_buf, pc == 0 ? beta : T(1), c + ic * ldc + jc, ldc, last ? done : nullptr, ic, jc, after);
      multiplied[blk].value.fetch_add(1, std::memory_order_release);
    }
  };
  parallel_for(0, homes.blocks, 1, [&](int64_t first, int64_t) {
    for (int64_t h = 0; h < homes.blocks; ++h) work_in((first + h) % homes.blocks);
  });
}

}  // namespace detail

/// C[m x n] = alpha * A[m x k] * B[k x n] + beta * C, with A(i,p) = a[i*a_row_stride +
/// p*a_col_stride], B(p,j) = b[p*b_row_stride + j*b_col_stride] and C row-major with leading
/// dimension ldc. beta == 0 overwrites C without reading it; alpha == 0 or k == 0 only scales C.
/// Large products are split across the thread pool. `done`, when given, is called on each
/// block of C as it is finished (from the thread that finished it), so a caller can work on
/// the block while it is in cache; together the blocks cover C once.
template <class T> void gemm(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t a_row_stride,
                             int64_t a_col_stride, const T* b, int64_t b_row_stride, int64_t b_col_stride, T beta, T* c,
                             int64_t ldc, const GemmBlockDone* done = nullptr) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "gemm supports float and double");
  if (m <= 0 || n <= 0) return;
  if (k <= 0 || alpha == T(0)) {
    detail::scale_c(m, n, beta, c, ldc);
    if (done) (*done)(0, m, 0, n);
    return;
  }

  if (k == 1) {  // an outer product: no sum to block for, and packing would only add traffic
    for (int64_t i = 0; i < m; ++i) {
      const T ai = alpha * a[i * a_row_stride];
      T* row = c + i * ldc;
      if (beta == T(0))
        for (int64_t j = 0; j < n; ++j) row[j] = ai * b[j * b_col_stride];
      else
        for (int64_t j = 0; j < n; ++j) row[j] = ai * b[j * b_col_stride] + beta * row[j];
    }
    if (done) (*done)(0, m, 0, n);
    return;
  }

  using cfg = detail::GemmConfig<T>;
  const double work = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const bool serial = num_threads() <= 1 || work <= static_cast<double>(kGemmParallelWork) || detail::t_in_parallel;
  if (serial && detail::dots_suit(m, n, k, a_col_stride, b_row_stride)) {
    detail::gemm_dots(m, n, k, alpha, a, a_row_stride, b, b_col_stride, beta, c, ldc);
    if (done) (*done)(0, m, 0, n);
    return;
  }
  if (detail::transposed_suits<T>(m, n, k, a_col_stride, b_row_stride, b_col_stride)) {
    // Each thread packs all of A here: split, LeNet5's fc2 (32 x 84 x 120) took 5.5 us against
    // 4.6 on one thread.
    const bool split = !serial && work > static_cast<double>(4 * kGemmParallelWork);
    detail::gemm_transposed(m, n, k, alpha, a, a_row_stride, b, b_col_stride, beta, c, ldc, split ? num_threads() : 1,
                            done);
    return;
  }
  if (const int64_t split = detail::k_halves_split(m, k, alpha, b_col_stride)) {
    detail::gemm_k_halves(m, n, k, split, a, a_row_stride, a_col_stride, b, b_row_stride, beta, c, ldc,
                          serial ? 1 : num_threads(), done);
    return;
  }
  if (serial) {
    detail::gemm_serial(m, n, k, alpha, a, a_row_stride, a_col_stride, b, b_row_stride, b_col_stride, beta, c, ldc,
                        done);
    return;
  }

  // One block of whole micro-tiles per thread, the blocks' sizes within a tile of each other.
  // Each block packs its own operands: split along m, every block packs all of B; along n,
  // every block packs A once per column block of its own. Split where less is re-packed
  // (1024^3 on 2 threads: along n, where each half packs A once as a single thread would).
  const int nt = num_threads();
  auto column_blocks = [&](int64_t cols) { return (cols + cfg::nc - 1) / cfg::nc; };
  const double repack_split_m = static_cast<double>(nt - 1) * static_cast<double>(k) * static_cast<double>(n);
  const double repack_split_n = static_cast<double>(nt * column_blocks((n + nt - 1) / nt) - column_blocks(n)) *
                                static_cast<double>(m) * static_cast<double>(k);
  // A caller told of finished blocks (a fused epilogue) is told each row of a block along n
  // on its own; along m, whole rows at once (a dense layer's weight gradient, [120, 400] from
  // 32 rows: along m). See done_after_product.
  const bool small_c = detail::done_after_product<T>(m, n);
  const double row_calls = done && !small_c ? static_cast<double>(nt) * static_cast<double>(m) * 256.0 : 0.0;
  const bool split_n = repack_split_n + row_calls <= repack_split_m || (m + cfg::mr - 1) / cfg::mr < nt;
  const GemmBlockDone* block_done = split_n && small_c ? nullptr : done;
  if (split_n && detail::homes_suit<T>(m, n, k, a_col_stride, b_col_stride, nt)) {
    detail::gemm_column_homes(m, n, k, alpha, a, a_row_stride, a_col_stride, b, b_row_stride, b_col_stride, beta, c,
                              ldc, block_done);
  } else {
    const detail::TileBlocks split(split_n ? n : m, split_n ? cfg::nr : cfg::mr, nt);
    parallel_for(0, split.blocks, 1, [&](int64_t first, int64_t last) {
      for (int64_t blk = first; blk < last; ++blk) {
        const int64_t lo = split.begin(blk), hi = split.end(blk);
        if (split_n) {
          detail::gemm_serial(m, hi - lo, k, alpha, a, a_row_stride, a_col_stride, b + lo * b_col_stride, b_row_stride,
                              b_col_stride, beta, c + lo, ldc, block_done, 0, lo);
        } else {
          detail::gemm_serial(hi - lo, n, k, alpha, a + lo * a_row_stride, a_row_stride, a_col_stride, b, b_row_stride,
                              b_col_stride, beta, c + lo * ldc, ldc, block_done, lo, 0);
        }
      }
    });
  }
  if (done && !block_done) detail::tell_rows_done<T>(m, n, *done);
}

/// `count` products C_i[m x n] = A_i B_i (C packed, one matrix after another), where `plan`
/// maps product i to its matrices of A and B (its strides count matrices: broadcast batch
/// axes) and each operand's element (r, c) is at r * row stride + c * column stride within
/// its matrix. `done`, when given, is told each finished range of C's elements.
template <class T> void batched_gemm(const BroadcastPlan<2>& plan, int64_t count, int64_t m, int64_t n, int64_t k,
                                     const T* a, int64_t a_rs, int64_t a_cs, const T* b, int64_t b_rs, int64_t b_cs,
                                     T* c, const RangeDone* done) {
  auto run = [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t ia = plan.row_offset(0, i / plan.inner()) + (i % plan.inner()) * plan.inner_stride(0);
      const int64_t ib = plan.row_offset(1, i / plan.inner()) + (i % plan.inner()) * plan.inner_stride(1);
      // Matrix i's blocks, as element ranges of the whole output. The callback points at this
      // frame, so std::function keeps it without the heap.
      const GemmBlockRanges ranges{done, i * m * n, n};
      const GemmBlockDone block_done = [r = &ranges](int64_t row, int64_t rows, int64_t col, int64_t cols) {
        (*r)(row, rows, col, cols);
      };
      gemm<T>(m, n, k, T(1), a + ia * m * k, a_rs, a_cs, b + ib * k * n, b_rs, b_cs, T(0), c + i * m * n, n,
              done ? &block_done : nullptr);
    }
  };
  // Many small products: one per thread. Few large ones: gemm spreads each over the threads.
  if (count > 1 && m * n * k < 64 * 64 * 64)
    parallel_for(0, count, 1, run);
  else
    run(0, count);
}

// The instances xgrad::compiled holds (core/config.hpp), in src/kernels.cpp.
#define XGRAD_GEMM_INSTANCE(T, X)                                                                                      \
  X void gemm<T>(int64_t, int64_t, int64_t, T, const T*, int64_t, int64_t, const T*, int64_t, int64_t, T, T*, int64_t, \
                 const GemmBlockDone*);                                                                                \
  X void batched_gemm<T>(const BroadcastPlan<2>&, int64_t, int64_t, int64_t, int64_t, const T*, int64_t, int64_t,      \
                         const T*, int64_t, int64_t, T*, const RangeDone*);
#define XGRAD_GEMM_INSTANCES(X) XGRAD_FOR_EACH_FloatingPoint(XGRAD_GEMM_INSTANCE, X)
#if defined(XGRAD_COMPILED) && !defined(XGRAD_INSTANTIATE_GEMM)
XGRAD_GEMM_INSTANCES(extern template)
#endif

}  // namespace xgrad::cpu
