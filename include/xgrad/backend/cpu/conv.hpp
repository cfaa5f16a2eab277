// xgrad CPU backend: 2-D convolution kernels (im2col / col2im + GEMM) on contiguous NCHW data.
#pragma once

#include <algorithm>
#include <array>
#include <cassert>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "xgrad/backend/cpu/gemm.hpp"
#include "xgrad/backend/cpu/thread_pool.hpp"
#include "xgrad/core/dtype.hpp"

namespace xgrad::cpu {

/// Geometry of one 2-D convolution. x is [n, c_in, h, w], w is [c_out, c_in, kh, kw] and
/// y is [n, c_out, out_h, out_w]. Bottom/right padding is implied by out_h/out_w, which the
/// caller computes.
struct Conv2dGeometry {
  int64_t n, c_in, h, w, c_out, kh, kw, stride_h, stride_w, pad_top, pad_left, dil_h, dil_w, out_h, out_w;
  bool operator==(const Conv2dGeometry&) const = default;
};

namespace detail {

/// Half-open range [lo, hi) of output indices o in [0, out) whose input index
/// o * stride + offset falls inside [0, in).
struct IndexRange {
  int64_t lo, hi;
};

inline IndexRange valid_range(int64_t offset, int64_t stride, int64_t in, int64_t out) {
  int64_t lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  int64_t hi = in - offset > 0 ? (in - offset + stride - 1) / stride : 0;
  lo = std::min(lo, out);
  hi = std::clamp(hi, lo, out);
  return {lo, hi};
}

// Rough multiply-add count below which splitting work across threads costs more than it saves.
inline constexpr int64_t k_conv_min_parallel_work = int64_t{1} << 16;

// Per-image GEMMs at least this large parallelize well on their own (matches gemm's threshold).
inline constexpr int64_t k_conv_gemm_parallel_work = int64_t{1} << 18;

// Upper bound on the per-block partial weight gradients kept by conv2d_backward_weight (elements).
inline constexpr int64_t k_conv_partial_budget = int64_t{1} << 22;
inline constexpr int64_t k_conv_max_weight_blocks = 16;

/// Images per parallel chunk so that a chunk holds at least k_conv_min_parallel_work.
inline int64_t conv_batch_grain(int64_t work_per_image) {
  work_per_image = std::max<int64_t>(work_per_image, 1);
  return std::max<int64_t>(1, (k_conv_min_parallel_work + work_per_image - 1) / work_per_image);
}

/// Whether to hand `items` equal work items to the threads (each item's GEMM then runs serially)
/// rather than run the items in turn and let each GEMM use every thread. Splitting wins when the
/// GEMMs are too small to parallelize or when the items keep at least 80% of the threads busy.
inline bool conv_split_batch(int64_t items, int64_t work_per_item) {
  if (work_per_item < k_conv_gemm_parallel_work) return true;
  const int64_t nt = std::max(1, num_threads());
  const int64_t rounds = (items + nt - 1) / nt;
  return items * 5 >= rounds * nt * 4;
}

/// Runs body(lo, hi) over the batch [0, n), split across threads when conv_split_batch says so.
template <class F> void conv_for_batch(int64_t n, int64_t work_per_image, F&& body) {
  if (conv_split_batch(n, work_per_image))
    parallel_for(0, n, conv_batch_grain(work_per_image), body);
  else
    body(int64_t{0}, n);
}

/// True when the column matrix equals the input itself (1x1 kernel, stride 1, no padding).
inline bool conv_is_pointwise(const Conv2dGeometry& g) {
  assert(g.stride_h > 0 && g.stride_w > 0 && g.dil_h > 0 && g.dil_w > 0);
  return g.kh == 1 && g.kw == 1 && g.stride_h == 1 && g.stride_w == 1 && g.pad_top == 0 && g.pad_left == 0 &&
         g.out_h == g.h && g.out_w == g.w;
}

/// True for a stride-1, undilated, unpadded convolution: counted on the input's grid (outputs w
/// apart per row, not out_w), its taps read x at fixed offsets, the form gemm_shifted takes.
inline bool conv_is_shifted(const Conv2dGeometry& g) {
  return g.stride_h == 1 && g.stride_w == 1 && g.dil_h == 1 && g.dil_w == 1 && g.pad_top == 0 && g.pad_left == 0 &&
         g.out_h == g.h - g.kh + 1 && g.out_w == g.w - g.kw + 1 && g.out_h > 0 && g.out_w > 0;
}

/// The offset in an image of x of each tap (c, ki, kj), in the column matrix's row order.
inline std::vector<int64_t> conv_tap_offsets(const Conv2dGeometry& g) {
  std::vector<int64_t> offsets;
  offsets.reserve(static_cast<std::size_t>(g.c_in * g.kh * g.kw));
  for (int64_t c = 0; c < g.c_in; ++c)
    for (int64_t ki = 0; ki < g.kh; ++ki)
      for (int64_t kj = 0; kj < g.kw; ++kj) offsets.push_back((c * g.h + ki) * g.w + kj);
  return offsets;
}

template <class T> std::unique_ptr<T[]> conv_scratch(int64_t size) {
  return std::make_unique_for_overwrite<T[]>(static_cast<std::size_t>(std::max<int64_t>(size, 1)));
}

// Elements of column (or gathered gradient) matrix one batched GEMM may use. Several small
// images share one GEMM so its packing and edge tiles are amortized; the cap keeps the buffer
// well inside L2 (larger blocks measured no faster at LeNet shapes).
inline constexpr int64_t k_conv_col_budget = int64_t{1} << 16;

/// Per-thread column and gathered-gradient buffers, reused across calls like gemm's packing space.
template <class T> struct ConvWorkspace {
  ScratchBuffer<T> m_col;
  ScratchBuffer<T> m_mat;
};

template <class T> ConvWorkspace<T>& conv_workspace() {
  static thread_local ConvWorkspace<T> ws;
  return ws;
}

/// Most images whose columns fit k_conv_col_budget together (at least one).
inline int64_t conv_images_per_gemm(int64_t col_per_image) {
  return std::max<int64_t>(1, k_conv_col_budget / std::max<int64_t>(col_per_image, 1));
}

/// Calls body(first, count) over [lo, hi) in near-equal chunks of at most `cap` images. The
/// chunks depend only on lo, hi and cap, which keeps reductions over them reproducible.
template <class F> void for_each_image_chunk(int64_t lo, int64_t hi, int64_t cap, F&& body) {
  const int64_t count = hi - lo;
  if (count <= 0) return;
  const int64_t chunks = (count + cap - 1) / cap;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t first = lo + c * count / chunks;
    const int64_t last = lo + (c + 1) * count / chunks;
    body(first, last - first);
  }
}

/// A weight gradient summed over the batch in `blocks` blocks of images chosen from the geometry
/// alone (never from the thread count), so repeated calls give the same bits:
/// body(first, last, out) overwrites out with the gradient of images [first, last); block 0
/// writes gw, the others partial buffers added to it in block order. The thread count only
/// decides whether the blocks run in parallel or the work inside each does.
template <class T, class Body>
void sum_over_image_blocks(int64_t n, int64_t blocks, int64_t gw_size, int64_t work_per_image, T* gw, Body&& body) {
  auto partials = blocks > 1 ? conv_scratch<T>((blocks - 1) * gw_size) : nullptr;
  auto run_blocks = [&](int64_t block_lo, int64_t block_hi) {
    for (int64_t blk = block_lo; blk < block_hi; ++blk)
      body(blk * n / blocks, (blk + 1) * n / blocks, blk == 0 ? gw : partials.get() + (blk - 1) * gw_size);
  };
  if (blocks > 1 && conv_split_batch(blocks, work_per_image))
    parallel_for(0, blocks, 1, run_blocks);
  else
    run_blocks(0, blocks);
  if (blocks <= 1) return;
  parallel_for(0, gw_size, k_conv_min_parallel_work, [&](int64_t lo, int64_t hi) {
    for (int64_t blk = 1; blk < blocks; ++blk) {
      const T* part = partials.get() + (blk - 1) * gw_size;
      for (int64_t j = lo; j < hi; ++j) gw[j] += part[j];
    }
  });
}

/// Blocks for the direct weight gradients: at least 8 images each, since a block keeps its
/// sums in registers or lanes over its images and stores and adds its partial gradient once.
inline int64_t direct_weight_blocks(int64_t n, int64_t work_per_image) {
  return std::clamp<int64_t>(std::min(k_conv_max_weight_blocks, (n + 7) / 8), 1,
                             std::max<int64_t>(1, n * work_per_image / k_conv_min_parallel_work));
}

#if defined(__AVX512F__)
// Masked AVX-512 moves: convolution rows are often shorter than one vector, and a masked tail
// beats both a scalar loop and a memmove call there.
template <class T> struct MaskedOps;
template <> struct MaskedOps<float> {
  using mask = __mmask16;
  static constexpr int64_t lanes = 16;
  static __m512 load(mask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  static void store(mask m, float* p, __m512 v) { _mm512_mask_storeu_ps(p, m, v); }
};
template <> struct MaskedOps<double> {
  using mask = __mmask8;
  static constexpr int64_t lanes = 8;
  static __m512d load(mask m, const double* p) { return _mm512_maskz_loadu_pd(m, p); }
  static void store(mask m, double* p, __m512d v) { _mm512_mask_storeu_pd(p, m, v); }
};
#endif

/// For each of `rows` rows: dst[0, span) = src[0, span) (Add = false) or dst[0, span) +=
/// src[0, span) (Add = true); row r starts at src + r * src_step and dst + r * dst_step.
template <bool Add, class T>
void row_spans(const T* src, int64_t src_step, T* dst, int64_t dst_step, int64_t rows, int64_t span) {
#if defined(__AVX512F__)
  // Not for Add: a masked load stalls behind an earlier masked store within a vector's width
  // of it, which is exactly how col2im's neighbouring rows sit.
  if constexpr (!Add && (std::is_same_v<T, float> || std::is_same_v<T, double>)) {
    using ops = MaskedOps<T>;
    using mask = typename ops::mask;
    const auto full = static_cast<mask>(~0u);
    const int64_t body = span / ops::lanes * ops::lanes;
    const auto tail = static_cast<mask>((1u << (span - body)) - 1);
    for (int64_t r = 0; r < rows; ++r, src += src_step, dst += dst_step) {
      for (int64_t j = 0; j < body; j += ops::lanes) ops::store(full, dst + j, ops::load(full, src + j));
      if (body < span) ops::store(tail, dst + body, ops::load(tail, src + body));
    }
    return;
  }
#endif
  for (int64_t r = 0; r < rows; ++r, src += src_step, dst += dst_step) {
    if constexpr (Add) {
      for (int64_t j = 0; j < span; ++j) dst[j] += src[j];
    } else {
      copy_contiguous(src, span, dst);
    }
  }
}

/// im2col for `count` consecutive images of x into one column matrix whose rows are `ld`
/// elements apart: image i fills columns [i * ohw, (i + 1) * ohw). Row bounds are worked out
/// once per kernel tap, not per image, since their divisions cost more than a short row copy.
template <class T> void im2col_images(const Conv2dGeometry& g, const T* x, int64_t count, T* col, int64_t ld) {
  const int64_t ohw = g.out_h * g.out_w;
  const int64_t x_img = g.c_in * g.h * g.w;
  const int64_t x_step = g.out_h > 1 ? g.stride_h * g.w : 0;  // a stride past the input when one row is made
  T* dst = col;
  for (int64_t c = 0; c < g.c_in; ++c) {
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      const int64_t off_h = ki * g.dil_h - g.pad_top;
      const auto rh = valid_range(off_h, g.stride_h, g.h, g.out_h);
      for (int64_t kj = 0; kj < g.kw; ++kj, dst += ld) {
        const int64_t off_w = kj * g.dil_w - g.pad_left;
        const auto rw = valid_range(off_w, g.stride_w, g.w, g.out_w);
        const int64_t span = rw.hi - rw.lo;
        if (span <= 0 || rh.hi <= rh.lo) {
          std::fill(dst, dst + count * ohw, T(0));
          continue;
        }
        const int64_t x_first = (c * g.h + rh.lo * g.stride_h + off_h) * g.w + off_w + rw.lo * g.stride_w;
        for (int64_t i = 0; i < count; ++i) {
          T* di = dst + i * ohw;
          std::fill(di, di + rh.lo * g.out_w, T(0));
          std::fill(di + rh.hi * g.out_w, di + ohw, T(0));
          if (span != g.out_w) {
            for (int64_t oh = rh.lo; oh < rh.hi; ++oh) {
              T* drow = di + oh * g.out_w;
              std::fill(drow, drow + rw.lo, T(0));
              std::fill(drow + rw.hi, drow + g.out_w, T(0));
            }
          }
          const T* xrow = x + i * x_img + x_first;
          T* drow = di + rh.lo * g.out_w + rw.lo;
          if (g.stride_w == 1) {
            row_spans<false>(xrow, x_step, drow, g.out_w, rh.hi - rh.lo, span);
          } else {
            for (int64_t oh = rh.lo; oh < rh.hi; ++oh, xrow += x_step, drow += g.out_w)
              for (int64_t j = 0; j < span; ++j) drow[j] = xrow[j * g.stride_w];
          }
        }
      }
    }
  }
}

/// The adjoint of im2col_images: adds each column-matrix entry into the x element it came from.
template <class T> void col2im_images(const Conv2dGeometry& g, const T* col, int64_t ld, int64_t count, T* x) {
  const int64_t ohw = g.out_h * g.out_w;
  const int64_t x_img = g.c_in * g.h * g.w;
  const int64_t x_step = g.out_h > 1 ? g.stride_h * g.w : 0;  // a stride past the input when one row is made
  const T* src = col;
  for (int64_t c = 0; c < g.c_in; ++c) {
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      const int64_t off_h = ki * g.dil_h - g.pad_top;
      const auto rh = valid_range(off_h, g.stride_h, g.h, g.out_h);
      for (int64_t kj = 0; kj < g.kw; ++kj, src += ld) {
        const int64_t off_w = kj * g.dil_w - g.pad_left;
        const auto rw = valid_range(off_w, g.stride_w, g.w, g.out_w);
        const int64_t span = rw.hi - rw.lo;
        if (span <= 0 || rh.hi <= rh.lo) continue;
        const int64_t x_first = (c * g.h + rh.lo * g.stride_h + off_h) * g.w + off_w + rw.lo * g.stride_w;
        for (int64_t i = 0; i < count; ++i) {
          const T* srow = src + i * ohw + rh.lo * g.out_w + rw.lo;
          T* xrow = x + i * x_img + x_first;
          if (g.stride_w == 1) {
            row_spans<true>(srow, g.out_w, xrow, x_step, rh.hi - rh.lo, span);
          } else {
            for (int64_t oh = rh.lo; oh < rh.hi; ++oh, xrow += x_step, srow += g.out_w)
              for (int64_t j = 0; j < span; ++j) xrow[j * g.stride_w] += srow[j];
          }
        }
      }
    }
  }
}

/// Copies `count` images of a [n, rows, ohw] tensor into a [rows, count * ohw] matrix.
template <class T> void gather_images(const T* src, int64_t count, int64_t rows, int64_t ohw, T* dst) {
  const int64_t ld = count * ohw;
  for (int64_t i = 0; i < count; ++i) row_spans<false>(src + i * rows * ohw, ohw, dst + i * ohw, ld, rows, ohw);
}

/// The inverse of gather_images: a [rows, count * ohw] matrix back into [count, rows, ohw].
template <class T> void scatter_images(const T* src, int64_t count, int64_t rows, int64_t ohw, T* dst) {
  const int64_t ld = count * ohw;
  for (int64_t i = 0; i < count; ++i) row_spans<false>(src + i * ohw, ld, dst + i * rows * ohw, ohw, rows, ohw);
}

/// The outputs of a conv_is_shifted convolution on x's grid: (out_h - 1) * w + out_w positions
/// per channel, output (oh, ow) at oh * w + ow. Positions with ow >= out_w belong to no output.
inline int64_t conv_grid(const Conv2dGeometry& g) { return (g.out_h - 1) * g.w + g.out_w; }

/// Each image of gy [count, c_out, ohw] position-major: dst[(i * ohw + p) * ld + co], with
/// zeros in lanes [c_out, ld). Lanes x lanes blocks go through the in-register transpose.
template <class T> void gy_by_position(const T* gy, int64_t count, int64_t c_out, int64_t ohw, T* dst, int64_t ld) {
  constexpr auto L = static_cast<int64_t>(xsimd::batch<T>::size);
  alignas(64) std::array<T, L * L> block;
  for (int64_t cb = 0; cb < ld; cb += L) {
    const int64_t rows = std::clamp<int64_t>(c_out - cb, 0, L);
    std::fill(block.begin() + rows * L, block.end(), T(0));
    for (int64_t i = 0; i < count; ++i) {
      const T* src = gy + (i * c_out + cb) * ohw;
      T* img = dst + i * ohw * ld + cb;
      int64_t p = 0;
      if constexpr (has_simd_transpose<T>) {
        // A whole vector of channels transposes from gy itself; fewer through a zero-padded block.
        for (; p + L <= ohw; p += L) {
          if (rows == L) {
            transpose_block(src + p, ohw, img + p * ld, ld);
            continue;
          }
          for (int64_t r = 0; r < rows; ++r)
            xsimd::batch<T>::load_unaligned(src + r * ohw + p).store_aligned(block.data() + r * L);
          transpose_block(block.data(), L, img + p * ld, ld);
        }
      }
      for (; p < ohw; ++p)
        for (int64_t r = 0; r < L; ++r) img[p * ld + r] = r < rows ? src[r * ohw + p] : T(0);
    }
  }
}

/// The inverse of gy_by_position for one image: src [ohw][ld] (lanes [0, c) used) into dst [c][ohw].
template <class T> void positions_to_channels(const T* src, int64_t ohw, int64_t c, int64_t ld, T* dst) {
  constexpr auto L = static_cast<int64_t>(xsimd::batch<T>::size);
  alignas(64) std::array<T, L * L> block;
  for (int64_t cb = 0; cb < c; cb += L) {
    const int64_t rows = std::min(L, c - cb);
    int64_t p = 0;
    if constexpr (has_simd_transpose<T>) {
      for (; p + L <= ohw; p += L) {
        if (rows == L) {
          transpose_block(src + p * ld + cb, ld, dst + cb * ohw + p, ohw);
          continue;
        }
        transpose_block(src + p * ld + cb, ld, block.data(), L);
        for (int64_t r = 0; r < rows; ++r)
          xsimd::batch<T>::load_aligned(block.data() + r * L).store_unaligned(dst + (cb + r) * ohw + p);
      }
    }
    for (; p < ohw; ++p)
      for (int64_t r = 0; r < rows; ++r) dst[(cb + r) * ohw + p] = src[p * ld + cb + r];
  }
}

/// acc[(ki - KI0) * KW + kj] += sum over J outputs j of one output row x_row[ki][j + kj] * g[j],
/// for the taps of window rows [KI0, KI1): the outputs' gy vectors (lanes = output channels)
/// loaded once, each x element broadcast once and used by every tap that reads it.
template <class V, int KI0, int KI1, int KW, int J, class T>
[[gnu::always_inline]] inline void weight_taps(const T* x_row, int64_t w, const T* g, int64_t g_step,
                                               std::array<V, (KI1 - KI0) * KW>& acc) {
  std::array<V, J> gv;
#pragma GCC unroll 8
  for (int j = 0; j < J; ++j) gv[j] = V::load_aligned(g + j * g_step);
#pragma GCC unroll 8
  for (int ki = KI0; ki < KI1; ++ki)
#pragma GCC unroll 16
    for (int d = 0; d < J + KW - 1; ++d) {
      const V b(x_row[ki * w + d]);
#pragma GCC unroll 8
      for (int kj = 0; kj < KW; ++kj)
        if (d - kj >= 0 && d - kj < J) acc[(ki - KI0) * KW + kj] = xsimd::fma(b, gv[d - kj], acc[(ki - KI0) * KW + kj]);
    }
}

/// Window rows [KI0, KI1) of the weight gradient of input channel c for one vector of output
/// channels, summed over `count` images into out[(ki - KI0) * KW + kj] (lanes are output
/// channels). Outputs go J = 4 to a step, then 1; rows split so the sums fit the registers.
template <class V, int KI0, int KI1, int KW, class T>
void weight_window(const Conv2dGeometry& g, const T* x, const T* gy_pos, int64_t ld, int64_t count, int64_t c, V* out) {
  const int64_t ohw = g.out_h * g.out_w;
  const int64_t x_img = g.c_in * g.h * g.w;
  std::array<V, (KI1 - KI0) * KW> acc;
  acc.fill(V(0));
  for (int64_t i = 0; i < count; ++i)
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      const T* x_row = x + i * x_img + (c * g.h + oh) * g.w;
      const T* g_row = gy_pos + (i * ohw + oh * g.out_w) * ld;
      int64_t ow = 0;
      for (; ow + 4 <= g.out_w; ow += 4) weight_taps<V, KI0, KI1, KW, 4>(x_row + ow, g.w, g_row + ow * ld, ld, acc);
      for (; ow < g.out_w; ++ow) weight_taps<V, KI0, KI1, KW, 1>(x_row + ow, g.w, g_row + ow * ld, ld, acc);
    }
  std::copy(acc.begin(), acc.end(), out + KI0 * KW);
}

/// Whether the direct kernels (conv2d_forward_direct, conv2d_backward_weight_direct) serve the
/// geometry: conv_is_shifted with a 3 x 3 or 5 x 5 window, and output channels, their vectors'
/// lanes, filling at least half of them. With 16 vector registers the forward kernel keeps half
/// the sums of 32, and runs only where its lanes are fuller than gemm_shifted's tiles (LeNet5's
/// conv2 on AVX2: 16 of 16 lanes against 16 of 18 rows times 100 of 136 columns on x's grid; its
/// conv1: 6 of 8 lanes against 6 of 6 rows times 784 of 892 columns).
template <class T> bool conv_direct_suits(const Conv2dGeometry& g) {
  using cfg = GemmConfig<T>;
  constexpr int64_t L = cfg::lanes;
  const int64_t ld = (g.c_out + L - 1) / L * L;
  if (!conv_is_shifted(g) || g.kh != g.kw || (g.kw != 3 && g.kw != 5) || 2 * g.c_out < ld) return false;
  if (cfg::vector_regs >= 32) return true;
  const int64_t tile_rows = (g.c_out + cfg::mr - 1) / cfg::mr * cfg::mr;
  // c_out / ld >= (c_out / tile_rows) * (out_h * out_w / grid), in integers.
  return tile_rows * conv_grid(g) >= ld * g.out_h * g.out_w;
}

/// Whether conv2d_backward_weight_direct serves the geometry: conv_direct_suits, with the 32
/// vector registers that the window's 9 or 25 sums need.
template <class T> bool conv_direct_weight_suits(const Conv2dGeometry& g) {
  return GemmConfig<T>::vector_regs >= 32 && conv_direct_suits<T>(g);
}

/// conv2d_backward_weight for conv_direct_weight_suits: for each input channel and vector of
/// output channels the kh x kw taps' sums stay in registers over a block's images, each gy
/// vector (position-major) feeding every tap and each x element broadcast once per tap row: no
/// column matrix, and no multiply on a position that is not an output. The batch is cut into
/// blocks fixed by the geometry (reproducible sums), whose partials add in block order.
template <class T> void conv2d_backward_weight_direct(const Conv2dGeometry& g, const T* x, const T* gy, T* gw) {
  using V = xsimd::batch<T>;
  constexpr int64_t L = static_cast<int64_t>(V::size);
  const int64_t window = g.kh * g.kw;
  const int64_t k = g.c_in * window;
  const int64_t ohw = g.out_h * g.out_w;
  const int64_t x_img = g.c_in * g.h * g.w;
  const int64_t y_img = g.c_out * ohw;
  const int64_t gw_size = g.c_out * k;
  const int64_t ld = (g.c_out + L - 1) / L * L;
  const int64_t work_per_image = gw_size * ohw;
  sum_over_image_blocks(g.n, direct_weight_blocks(g.n, work_per_image), gw_size, work_per_image, gw,
                        [&](int64_t first, int64_t last, T* out) {
                          const int64_t count = last - first;
                          T* gy_pos = conv_workspace<T>().m_mat.get(count * ohw * ld);
                          gy_by_position(gy + first * y_img, count, g.c_out, ohw, gy_pos, ld);
                          for (int64_t cv = 0; cv < ld; cv += L)
                            for (int64_t c = 0; c < g.c_in; ++c) {
                              std::array<V, 25> acc;
                              const T* xb = x + first * x_img;
                              if (g.kw == 5) {
                                weight_window<V, 0, 3, 5>(g, xb, gy_pos + cv, ld, count, c, acc.data());
                                weight_window<V, 3, 5, 5>(g, xb, gy_pos + cv, ld, count, c, acc.data());
                              } else {
                                weight_window<V, 0, 3, 3>(g, xb, gy_pos + cv, ld, count, c, acc.data());
                              }
                              alignas(64) std::array<T, L> lanes;
                              for (int64_t tap = 0; tap < window; ++tap) {
                                acc[static_cast<std::size_t>(tap)].store_aligned(lanes.data());
                                for (int64_t co = cv; co < std::min(cv + L, g.c_out); ++co)
                                  out[co * k + c * window + tap] = lanes[co - cv];
                              }
                            }
                        });
}

/// One vector of outputs for row_dot_tile: acc[r * RN + c] += gy_rows[r][at] * x_taps[c][at],
/// the lanes outside `tail` zeroed in both when Masked.
template <bool Masked, class V, int RM, int RN, class T>
[[gnu::always_inline]] inline void row_dot_step(const std::array<const T*, RM>& gy_rows,
                                                const std::array<const T*, RN>& x_taps, int64_t at,
                                                const typename V::batch_bool_type& tail, std::array<V, RM * RN>& acc) {
  std::array<V, RN> xv;
#pragma GCC unroll 8
  for (int c = 0; c < RN; ++c) {
    xv[c] = V::load_unaligned(x_taps[c] + at);
    if constexpr (Masked) xv[c] = xsimd::select(tail, xv[c], V(0));
  }
#pragma GCC unroll 8
  for (int r = 0; r < RM; ++r) {
    V gv = V::load_unaligned(gy_rows[r] + at);
    if constexpr (Masked) gv = xsimd::select(tail, gv, V(0));
#pragma GCC unroll 8
    for (int c = 0; c < RN; ++c) acc[r * RN + c] = xsimd::fma(gv, xv[c], acc[r * RN + c]);
  }
}

/// Vector (r, c) at part + (r * ld + c) * lanes (RM x RN, aligned) += the lane-wise products, over one image's
/// output rows, of gy's rows r (output channels, rows of out_w) with x from tap c's offset: the
/// weight gradient's dot products for few output channels. A row's last vector zeroes its lanes
/// past out_w in both operands, so nothing outside the outputs is read into a sum. The RM + RN
/// row pointers advance a row at a time and each vector is read at one offset from them: no
/// address arithmetic of their own, which would outgrow the registers (spilled, 69 us against
/// 56 for LeNet5's first layer).
template <class T, int RM, int RN> void row_dot_tile(const Conv2dGeometry& g, const T* gy, const T* x,
                                                     const int64_t* taps, T* part, int64_t ld,
                                                     xsimd::batch_bool<T> tail) {
  using V = xsimd::batch<T>;
  constexpr auto L = static_cast<int64_t>(V::size);
  const int64_t ohw = g.out_h * g.out_w;
  const int64_t full = g.out_w / L * L;
  std::array<V, RM * RN> acc;
#pragma GCC unroll 8
  for (int r = 0; r < RM; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < RN; ++c) acc[r * RN + c] = V::load_aligned(part + (r * ld + c) * L);
  std::array<const T*, RM> gy_rows;
  std::array<const T*, RN> x_taps;
  for (int r = 0; r < RM; ++r) gy_rows[r] = gy + r * ohw;
  for (int c = 0; c < RN; ++c) x_taps[c] = x + taps[c];
  for (int64_t oh = 0; oh < g.out_h; ++oh) {
    for (int64_t ow = 0; ow < full; ow += L) row_dot_step<false, V, RM, RN>(gy_rows, x_taps, ow, tail, acc);
    if (full < g.out_w) row_dot_step<true, V, RM, RN>(gy_rows, x_taps, full, tail, acc);
    for (int r = 0; r < RM; ++r) gy_rows[r] += g.out_w;
    for (int c = 0; c < RN; ++c) x_taps[c] += g.w;
  }
#pragma GCC unroll 8
  for (int r = 0; r < RM; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < RN; ++c) acc[r * RN + c].store_aligned(part + (r * ld + c) * L);
}

/// row_dot_tile for at most RM rows and RN taps, chosen at run time (the edges).
template <class T, int RM, int RN> void row_dot_tile_upto(int rm, int rn, const Conv2dGeometry& g, const T* gy,
                                                          const T* x, const int64_t* taps, T* part, int64_t ld,
                                                          xsimd::batch_bool<T> tail) {
  if constexpr (RM > 1) {
    if (rm < RM) return row_dot_tile_upto<T, RM - 1, RN>(rm, rn, g, gy, x, taps, part, ld, tail);
  }
  if constexpr (RN > 1) {
    if (rn < RN) return row_dot_tile_upto<T, RM, RN - 1>(rm, rn, g, gy, x, taps, part, ld, tail);
  }
  row_dot_tile<T, RM, RN>(g, gy, x, taps, part, ld, tail);
}

/// conv2d_backward_weight for conv_is_shifted geometry with few output channels: each weight's
/// gradient is a dot product along the output rows of gy and of x from the tap's offset, both
/// read in place (no column matrix), kept lane-wise in memory over a block's images so each
/// image is read while it sits in L1. Blocks are fixed by the geometry (reproducible sums) and
/// their partials add in block order.
template <class T> void conv2d_backward_weight_rows(const Conv2dGeometry& g, const T* x, const T* gy, T* gw) {
  using V = xsimd::batch<T>;
  constexpr auto L = static_cast<int64_t>(V::size);
  // RM x RN sums, RN vectors of x and one of gy in registers: 6 x 4 with 32 of them, 3 x 3 with
  // 16 (where 6 x 4 spills: LeNet5's conv2 weight gradient took 740 us against 487 on a Zen 3).
  constexpr bool wide = GemmConfig<T>::vector_regs >= 32;
  constexpr int RM = wide ? 6 : 3, RN = wide ? 4 : 3;
  const int64_t k = g.c_in * g.kh * g.kw;
  const int64_t ohw = g.out_h * g.out_w;
  const int64_t x_img = g.c_in * g.h * g.w;
  const int64_t y_img = g.c_out * ohw;
  const int64_t gw_size = g.c_out * k;
  const std::vector<int64_t> taps = conv_tap_offsets(g);
  const auto tail = lane_indices<V>() < V(static_cast<T>(g.out_w % L));
  // A row's last vector reads up to L - 1 elements past the row: past gy and x for the images
  // within L elements of their ends, which are read from zero-padded copies instead.
  struct Padded {
    std::vector<T> copy;
    int64_t first;  // the first image read from the copy
  };
  auto padded = [&](const T* t, int64_t image) {
    Padded p{{}, std::max<int64_t>(0, g.n - (L + image - 1) / image)};
    p.copy.assign(static_cast<std::size_t>((g.n - p.first) * image + L), T(0));
    std::copy(t + p.first * image, t + g.n * image, p.copy.begin());
    return p;
  };
  const Padded gy_tail = padded(gy, y_img), x_tail = padded(x, x_img);
  const int64_t work_per_image = gw_size * ohw;
  sum_over_image_blocks(
      g.n, direct_weight_blocks(g.n, work_per_image), gw_size, work_per_image, gw,
      [&](int64_t first, int64_t last, T* out) {
        T* part = conv_workspace<T>().m_col.get(gw_size * L);  // a vector of lane-wise sums per weight
        std::fill(part, part + gw_size * L, T(0));
        for (int64_t i = first; i < last; ++i) {
          const T* gy_i = i < gy_tail.first ? gy + i * y_img : gy_tail.copy.data() + (i - gy_tail.first) * y_img;
          const T* x_i = i < x_tail.first ? x + i * x_img : x_tail.copy.data() + (i - x_tail.first) * x_img;
          for (int64_t co = 0; co < g.c_out; co += RM)
            for (int64_t t = 0; t < k; t += RN)
              row_dot_tile_upto<T, RM, RN>(static_cast<int>(std::min<int64_t>(RM, g.c_out - co)),
                                           static_cast<int>(std::min<int64_t>(RN, k - t)), g, gy_i + co * ohw, x_i,
                                           taps.data() + t, part + (co * k + t) * L, k, tail);
        }
        for (int64_t j = 0; j < gw_size; ++j) out[j] = xsimd::hadd(V::load_aligned(part + j * L));
      });
}

/// acc[r * J + j] += sum over taps (ki, kj) of x[(r + ki) * w + j + kj] * wt[(ki * KW + kj) * ld]
/// for R output rows of J outputs: each tap row's KW weight vectors (lanes = output channels)
/// loaded once, each x element broadcast once and used by every output that reads it.
template <class V, int KW, int R, int J, class T>
[[gnu::always_inline]] inline void forward_taps(int64_t kh, const T* x, int64_t w, const T* wt, int64_t ld,
                                                std::array<V, R * J>& acc) {
  for (int64_t ki = 0; ki < kh; ++ki, x += w, wt += KW * ld) {
    std::array<V, KW> wv;
#pragma GCC unroll 8
    for (int kj = 0; kj < KW; ++kj) wv[kj] = V::load_aligned(wt + kj * ld);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 24
      for (int d = 0; d < J + KW - 1; ++d) {
        const V b(x[r * w + d]);
#pragma GCC unroll 8
        for (int kj = 0; kj < KW; ++kj)
          if (d - kj >= 0 && d - kj < J) acc[r * J + d - kj] = xsimd::fma(b, wv[kj], acc[r * J + d - kj]);
      }
  }
}

/// Outputs (oh + r, ow + j), r < R, j < J, of one vector of output channels, summed over the
/// input channels, stored position-major into the image's out (rows ld apart).
template <class V, int KW, int R, int J, class T>
void forward_outputs(const Conv2dGeometry& g, const T* x, const T* wt, int64_t ld, int64_t oh, int64_t ow, T* out) {
  std::array<V, R * J> acc;
  acc.fill(V(T(0)));
  const int64_t window = g.kh * KW;
  for (int64_t c = 0; c < g.c_in; ++c)
    forward_taps<V, KW, R, J>(g.kh, x + (c * g.h + oh) * g.w + ow, g.w, wt + c * window * ld, ld, acc);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int j = 0; j < J; ++j) acc[r * J + j].store_aligned(out + ((oh + r) * g.out_w + ow + j) * ld);
}

/// Columns [ow, ow + J) of every output row: rows R at a time (R * J sums in registers, enough
/// to hide the FMAs' latency), then one at a time.
template <class V, int KW, int R, int J, class T>
void forward_columns(const Conv2dGeometry& g, const T* x, const T* wt, int64_t ld, int64_t ow, T* out) {
  int64_t oh = 0;
  for (; oh + R <= g.out_h; oh += R) forward_outputs<V, KW, R, J>(g, x, wt, ld, oh, ow, out);
  for (; oh < g.out_h; ++oh) forward_outputs<V, KW, 1, J>(g, x, wt, ld, oh, ow, out);
}

/// The outputs of one image for one vector of output channels, position-major into out. The
/// sums in registers sit beside a window row's KW weights and a broadcast: 16 of them with 32
/// vector registers, 8 with 16 (still enough for two FMA units of latency 4).
template <class V, int KW, class T>
void forward_image(const Conv2dGeometry& g, const T* x, const T* wt, int64_t ld, T* out) {
  constexpr int R = GemmConfig<T>::vector_regs >= 32 ? 2 : 1;
  int64_t ow = 0;
  for (; ow + 8 <= g.out_w; ow += 8) forward_columns<V, KW, R, 8>(g, x, wt, ld, ow, out);
  for (; ow + 2 <= g.out_w; ow += 2) forward_columns<V, KW, 4, 2>(g, x, wt, ld, ow, out);
  for (; ow < g.out_w; ++ow) forward_columns<V, KW, 8, 1>(g, x, wt, ld, ow, out);
}

/// The direct kernels' weights: w [c_out, k] laid tap-major, a vector of output channels per
/// tap (ld lanes, zero past c_out); each thread's own, laid out for the call `stamp`.
template <class T> struct DirectWeights {
  int64_t ld = 0;
  std::vector<T, xsimd::aligned_allocator<T>> taps;
  std::uint64_t stamp = 0;
};

/// The calling thread's DirectWeights of w for the call `stamp` (new_call_stamp), laid out on
/// the thread's first use in that call.
template <class T> const DirectWeights<T>& direct_weights(const Conv2dGeometry& g, const T* w, std::uint64_t stamp) {
  static thread_local DirectWeights<T> wt;
  if (wt.stamp == stamp) return wt;
  constexpr auto L = static_cast<int64_t>(xsimd::batch<T>::size);
  const int64_t k = g.c_in * g.kh * g.kw;
  wt.ld = (g.c_out + L - 1) / L * L;
  wt.taps.assign(static_cast<std::size_t>(k * wt.ld), T(0));
  for (int64_t co = 0; co < g.c_out; ++co)
    for (int64_t t = 0; t < k; ++t) wt.taps[static_cast<std::size_t>(t * wt.ld + co)] = w[co * k + t];
  wt.stamp = stamp;
  return wt;
}

/// One image's outputs for conv_direct_suits, position-major into out [ohw][wt.ld]: each
/// output accumulates in a register over every tap with x's elements broadcast.
template <class T> void forward_direct_image(const Conv2dGeometry& g, const T* x, const DirectWeights<T>& wt, T* out) {
  using V = xsimd::batch<T>;
  constexpr auto L = static_cast<int64_t>(V::size);
  for (int64_t cv = 0; cv < wt.ld; cv += L) {
    if (g.kw == 5)
      forward_image<V, 5>(g, x, wt.taps.data() + cv, wt.ld, out + cv);
    else
      forward_image<V, 3>(g, x, wt.taps.data() + cv, wt.ld, out + cv);
  }
}

/// conv2d_forward for conv_direct_suits: forward_direct_image, each image's result transposed
/// into y. No column matrix, and no multiply on a position that is not an output.
template <class T>
void conv2d_forward_direct(const Conv2dGeometry& g, const T* x, const T* w, T* y, const RangeDone* done) {
  const int64_t k = g.c_in * g.kh * g.kw;
  const int64_t ohw = g.out_h * g.out_w;
  const int64_t x_img = g.c_in * g.h * g.w;
  const int64_t y_img = g.c_out * ohw;
  const std::uint64_t stamp = new_call_stamp();
  conv_for_batch(g.n, g.c_out * k * ohw, [&](int64_t lo, int64_t hi) {
    const DirectWeights<T>& wt = direct_weights(g, w, stamp);
    T* out = conv_workspace<T>().m_mat.get(ohw * wt.ld);
    for (int64_t i = lo; i < hi; ++i) {
      forward_direct_image(g, x + i * x_img, wt, out);
      positions_to_channels(out, ohw, g.c_out, wt.ld, y + i * y_img);
      if (done) (*done)(i * y_img, (i + 1) * y_img);
    }
  });
}

/// conv2d_backward_input for conv_is_shifted geometry. col [k, count * ohw] = w^T gy as one
/// product over a chunk of images; then each vector of a row of gx sums its window's taps, a
/// tap's vector being one unaligned load of col (row oh = ih - ki, shifted by kj) with the lanes
/// outside that output row zeroed. No column matrix is folded back element by element, and no
/// multiply falls on a position that is not an output.
template <class T> void conv2d_backward_input_shifted(const Conv2dGeometry& g, const T* gy, const T* w, T* gx) {
  using V = xsimd::batch<T>;
  constexpr auto L = static_cast<int64_t>(V::size);
  const int64_t ohw = g.out_h * g.out_w;
  const int64_t k = g.c_in * g.kh * g.kw;
  const int64_t x_img = g.c_in * g.h * g.w;
  const int64_t y_img = g.c_out * ohw;
  // reached + (b * kw + kj) * L: 1 in the lanes of gx's column block b that tap column kj
  // reaches, else 0 (as numbers: a vector of batch_bool is not a type CUDA's compiler takes).
  const int64_t col_blocks = (g.w + L - 1) / L;
  const auto reached = conv_scratch<T>(col_blocks * g.kw * L);
  for (int64_t b = 0; b < col_blocks; ++b)
    for (int64_t kj = 0; kj < g.kw; ++kj)
      for (int64_t l = 0; l < L; ++l) {
        const int64_t ow = b * L + l - kj;
        reached[static_cast<std::size_t>((b * g.kw + kj) * L + l)] = ow >= 0 && ow < g.out_w ? T(1) : T(0);
      }
  // A tap's load may start up to kw - 1 elements before col and end a row of x past it.
  const int64_t front = std::max<int64_t>(L, g.kw);
  const int64_t back = g.w + L;
  const int64_t cap = conv_images_per_gemm(std::max(k, g.c_out) * ohw);
  conv_for_batch(g.n, g.c_out * k * ohw, [&](int64_t lo, int64_t hi) {
    auto& ws = conv_workspace<T>();
    for_each_image_chunk(lo, hi, cap, [&](int64_t first, int64_t count) {
      const int64_t ld = count * ohw;
      const T* gy_block = gy + first * y_img;
      if (count > 1) {
        T* gathered = ws.m_mat.get(g.c_out * ld);
        gather_images(gy_block, count, g.c_out, ohw, gathered);
        gy_block = gathered;
      }
      T* col = ws.m_col.get(front + k * ld + back) + front;
      const T* gx_end = gx + (first + count) * x_img;
      std::fill(col - front, col, T(0));
      std::fill(col + k * ld, col + k * ld + back, T(0));
      // col [k, count * ohw] = w^T [k, c_out] * gy_block [c_out, count * ohw]
      gemm<T>(k, ld, g.c_out, T(1), w, 1, k, gy_block, ld, 1, T(0), col, ld);
      // Rows of gx in fours: four independent sums keep the adds' latency hidden.
      constexpr int64_t R = 4;
      for (int64_t i = 0; i < count; ++i)
        for (int64_t c = 0; c < g.c_in; ++c)
          for (int64_t ih0 = 0; ih0 < g.h; ih0 += R)
            for (int64_t b = 0; b < col_blocks; ++b) {
              std::array<V, R> acc;
              acc.fill(V(T(0)));
              const int64_t ki_lo = std::max<int64_t>(0, ih0 - g.out_h + 1);
              const int64_t ki_hi = std::min(g.kh, ih0 + R);
              for (int64_t ki = ki_lo; ki < ki_hi; ++ki) {
                const T* src = col + ((c * g.kh + ki) * g.kw) * ld + i * ohw + (ih0 - ki) * g.out_w + b * L;
                for (int64_t kj = 0; kj < g.kw; ++kj, src += ld) {
                  const auto mask = V::load_unaligned(reached.get() + (b * g.kw + kj) * L) != V(T(0));
                  for (int64_t r = 0; r < R; ++r) {
                    const int64_t oh = ih0 + r - ki;
                    if (oh >= 0 && oh < g.out_h)
                      acc[r] += xsimd::select(mask, V::load_unaligned(src + r * g.out_w - kj), V(T(0)));
                  }
                }
              }
              for (int64_t r = 0; r < R && ih0 + r < g.h; ++r) {
                T* gx_row = gx + (first + i) * x_img + (c * g.h + ih0 + r) * g.w + b * L;
                // A row of one vector or less is stored whole while that stays in this chunk: its
                // lanes past the row land on the next row, stored after it.
                if (b * L + L <= g.w || (col_blocks == 1 && gx_row + L <= gx_end)) {
                  acc[r].store_unaligned(gx_row);
                } else {
                  alignas(64) std::array<T, L> tail;
                  acc[r].store_aligned(tail.data());
                  std::copy_n(tail.data(), g.w - b * L, gx_row);
                }
              }
            }
    });
  });
}

}  // namespace detail

/// Unfolds one image x [c_in, h, w] into col [c_in * kh * kw, out_h * out_w] (g.n is ignored).
/// Positions that fall into the padding are written as zero.
template <class T> void im2col(const Conv2dGeometry& g, const T* x, T* col) {
  detail::im2col_images(g, x, 1, col, g.out_h * g.out_w);
}

/// Folds col [c_in * kh * kw, out_h * out_w] back into one image x [c_in, h, w], adding to
/// what x holds (overlapping windows accumulate; padding entries are dropped). The adjoint of im2col.
template <class T> void col2im(const Conv2dGeometry& g, const T* col, T* x) {
  detail::col2im_images(g, col, g.out_h * g.out_w, 1, x);
}

/// y = conv2d(x, w): x [n, c_in, h, w], w [c_out, c_in, kh, kw], y [n, c_out, out_h, out_w] (overwritten).
/// `done`, when given, is told each range of y as it is finished (see gemm).
template <class T>
void conv2d_forward(const Conv2dGeometry& g, const T* x, const T* w, T* y, const RangeDone* done = nullptr) {
  const int64_t ohw = g.out_h * g.out_w;
  const int64_t k = g.c_in * g.kh * g.kw;
  const int64_t x_img = g.c_in * g.h * g.w;
  const int64_t y_img = g.c_out * ohw;
  if (g.n <= 0 || y_img == 0) return;
  if (k == 0) {
    std::fill(y, y + g.n * y_img, T(0));
    if (done) (*done)(0, g.n * y_img);
    return;
  }
  // Image i's GEMM writes y from element i * y_img on: its blocks, as ranges of y. The
  // callback points at this frame, so std::function keeps it without the heap.
  auto image_gemm = [&](int64_t i, const T* cols, T* out) {
    const GemmBlockRanges ranges{done, i * y_img, ohw};
    const GemmBlockDone block_done = [r = &ranges](int64_t row, int64_t rows, int64_t col, int64_t count) {
      (*r)(row, rows, col, count);
    };
    gemm<T>(g.c_out, ohw, k, T(1), w, k, 1, cols, ohw, 1, T(0), out, ohw, done ? &block_done : nullptr);
  };
  if (detail::conv_is_pointwise(g)) {
    detail::conv_for_batch(g.n, g.c_out * k * ohw, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) image_gemm(i, x + i * x_img, y + i * y_img);
    });
    return;
  }
  if (detail::conv_direct_suits<T>(g)) return detail::conv2d_forward_direct(g, x, w, y, done);
  if (detail::conv_is_shifted(g)) {
    // Each image's outputs on x's grid (rows w apart), then the out_w valid ones of each row.
    const std::vector<int64_t> taps = detail::conv_tap_offsets(g);
    const int64_t grid = detail::conv_grid(g);
    detail::conv_for_batch(g.n, g.c_out * k * ohw, [&](int64_t lo, int64_t hi) {
      T* out = detail::conv_workspace<T>().m_mat.get(g.c_out * g.out_h * g.w);
      for (int64_t i = lo; i < hi; ++i) {
        detail::gemm_shifted(g.c_out, grid, k, w, k, x + i * x_img, taps.data(), out, g.out_h * g.w);
        detail::row_spans<false>(out, g.w, y + i * y_img, g.out_w, g.c_out * g.out_h, g.out_w);
        if (done) (*done)(i * y_img, (i + 1) * y_img);
      }
    });
    return;
  }
  const int64_t cap = detail::conv_images_per_gemm(std::max(k, g.c_out) * ohw);
  detail::conv_for_batch(g.n, g.c_out * k * ohw, [&](int64_t lo, int64_t hi) {
    auto& ws = detail::conv_workspace<T>();
    detail::for_each_image_chunk(lo, hi, cap, [&](int64_t first, int64_t count) {
      const int64_t ld = count * ohw;
      T* col = ws.m_col.get(k * ld);
      detail::im2col_images(g, x + first * x_img, count, col, ld);
      // A single image's result already has y's layout; several need a scatter, after which
      // the images are done.
      if (count == 1) {
        image_gemm(first, col, y + first * y_img);
        return;
      }
      T* out = ws.m_mat.get(g.c_out * ld);
      // out [c_out, count * ohw] = w [c_out, k] * col [k, count * ohw]
      gemm<T>(g.c_out, ld, k, T(1), w, k, 1, col, ld, 1, T(0), out, ld);
      detail::scatter_images(out, count, g.c_out, ohw, y + first * y_img);
      if (done) (*done)(first * y_img, (first + count) * y_img);
    });
  });
}

/// gx = the gradient of conv2d_forward with respect to x, given gy (a transposed convolution).
/// gy is [n, c_out, out_h, out_w]; gx [n, c_in, h, w] is overwritten.
template <class T> void conv2d_backward_input(const Conv2dGeometry& g, const T* gy, const T* w, T* gx) {
  const int64_t ohw = g.out_h * g.out_w;
  const int64_t k = g.c_in * g.kh * g.kw;
  const int64_t x_img = g.c_in * g.h * g.w;
  const int64_t y_img = g.c_out * ohw;
  if (g.n <= 0 || x_img == 0) return;
  if (y_img == 0 || k == 0) {
    std::fill(gx, gx + g.n * x_img, T(0));
    return;
  }
  if (detail::conv_is_pointwise(g)) {
    // col [k, ohw] = w^T [k, c_out] * gy_i [c_out, ohw] is gx_i itself.
    detail::conv_for_batch(g.n, g.c_out * k * ohw, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i)
        gemm<T>(k, ohw, g.c_out, T(1), w, 1, k, gy + i * y_img, ohw, 1, T(0), gx + i * x_img, ohw);
    });
    return;
  }
  if (detail::conv_is_shifted(g)) {
    detail::conv2d_backward_input_shifted(g, gy, w, gx);
    return;
  }
  const int64_t cap = detail::conv_images_per_gemm(std::max(k, g.c_out) * ohw);
  detail::conv_for_batch(g.n, g.c_out * k * ohw, [&](int64_t lo, int64_t hi) {
    auto& ws = detail::conv_workspace<T>();
    detail::for_each_image_chunk(lo, hi, cap, [&](int64_t first, int64_t count) {
      const int64_t ld = count * ohw;
      const T* gy_block = gy + first * y_img;
      if (count > 1) {
        T* gathered = ws.m_mat.get(g.c_out * ld);
        detail::gather_images(gy_block, count, g.c_out, ohw, gathered);
        gy_block = gathered;
      }
      // col [k, count * ohw] = w^T [k, c_out] * gy_block [c_out, count * ohw]
      T* col = ws.m_col.get(k * ld);
      gemm<T>(k, ld, g.c_out, T(1), w, 1, k, gy_block, ld, 1, T(0), col, ld);
      T* gx_block = gx + first * x_img;
      std::fill(gx_block, gx_block + count * x_img, T(0));
      detail::col2im_images(g, col, ld, count, gx_block);
    });
  });
}

/// gw = the gradient of conv2d_forward with respect to w, summed over the batch.
/// x is [n, c_in, h, w], gy [n, c_out, out_h, out_w]; gw [c_out, c_in, kh, kw] is overwritten.
/// Repeated calls give bit-identical results: the order of the batch reduction is fixed by the
/// geometry, not by thread scheduling.
template <class T> void conv2d_backward_weight(const Conv2dGeometry& g, const T* x, const T* gy, T* gw) {
  const int64_t ohw = g.out_h * g.out_w;
  const int64_t k = g.c_in * g.kh * g.kw;
  const int64_t x_img = g.c_in * g.h * g.w;
  const int64_t y_img = g.c_out * ohw;
  const int64_t gw_size = g.c_out * k;
  if (gw_size == 0) return;
  if (g.n <= 0 || ohw == 0) {
    std::fill(gw, gw + gw_size, T(0));
    return;
  }
  const bool pointwise = detail::conv_is_pointwise(g);
  if (detail::conv_direct_weight_suits<T>(g)) return detail::conv2d_backward_weight_direct(g, x, gy, gw);
  if (detail::conv_is_shifted(g)) return detail::conv2d_backward_weight_rows(g, x, gy, gw);

  // Each block (sum_over_image_blocks) sums its image chunks in order.
  const int64_t work_per_image = gw_size * ohw;
  int64_t blocks = std::min(g.n, detail::k_conv_max_weight_blocks);
  blocks = std::min(blocks, std::max<int64_t>(1, g.n * work_per_image / detail::k_conv_min_parallel_work));
  blocks = std::min(blocks, 1 + detail::k_conv_partial_budget / gw_size);
  blocks = std::max<int64_t>(blocks, 1);
  const int64_t cap = pointwise ? 1 : detail::conv_images_per_gemm(std::max(k, g.c_out) * ohw);

  detail::sum_over_image_blocks(
      g.n, blocks, gw_size, work_per_image, gw, [&](int64_t block_first, int64_t block_last, T* acc) {
        auto& ws = detail::conv_workspace<T>();
        detail::for_each_image_chunk(block_first, block_last, cap, [&](int64_t first, int64_t count) {
          const int64_t ld = count * ohw;
          const T* a = gy + first * y_img;
          const T* b = x + first * x_img;
          if (count > 1) {
            T* gathered = ws.m_mat.get(g.c_out * ld);
            detail::gather_images(a, count, g.c_out, ohw, gathered);
            a = gathered;
          }
          if (!pointwise) {
            T* col = ws.m_col.get(k * ld);
            detail::im2col_images(g, x + first * x_img, count, col, ld);
            b = col;
          }
          // acc [c_out, k] (+)= gy_block [c_out, count * ohw] * col^T [count * ohw, k]
          gemm<T>(g.c_out, k, ld, T(1), a, ld, 1, b, 1, ld, first == block_first ? T(0) : T(1), acc, k);
        });
      });
}

// The instances xgrad::compiled holds (core/config.hpp), in src/kernels.cpp.
#define XGRAD_CONV_INSTANCE(T, X)                                                            \
  X void conv2d_forward<T>(const Conv2dGeometry&, const T*, const T*, T*, const RangeDone*); \
  X void conv2d_backward_input<T>(const Conv2dGeometry&, const T*, const T*, T*);            \
  X void conv2d_backward_weight<T>(const Conv2dGeometry&, const T*, const T*, T*);
#define XGRAD_CONV_INSTANCES(X) XGRAD_FOR_EACH_FloatingPoint(XGRAD_CONV_INSTANCE, X)
#if defined(XGRAD_COMPILED) && !defined(XGRAD_INSTANTIATE_CONV)
XGRAD_CONV_INSTANCES(extern template)
#endif

}  // namespace xgrad::cpu
