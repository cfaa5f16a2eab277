// xgrad CPU backend: 2-D convolution kernels (im2col / col2im + GEMM) on contiguous NCHW data.
#pragma once

#include <algorithm>
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
  const int64_t x_step = g.stride_h * g.w;
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
  const int64_t x_step = g.stride_h * g.w;
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
  if (detail::conv_is_shifted(g)) {
    // Each image's outputs on x's grid (rows w apart), then the out_w valid ones of each row.
    const std::vector<int64_t> taps = detail::conv_tap_offsets(g);
    const int64_t grid = (g.out_h - 1) * g.w + g.out_w;
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

  // The batch is cut into blocks chosen from the geometry alone (never from the thread count),
  // each block sums its image chunks in order, and the block partials are added in block order.
  // The thread count only decides whether blocks or the GEMMs inside them run in parallel.
  const int64_t work_per_image = gw_size * ohw;
  int64_t blocks = std::min(g.n, detail::k_conv_max_weight_blocks);
  blocks = std::min(blocks, std::max<int64_t>(1, g.n * work_per_image / detail::k_conv_min_parallel_work));
  blocks = std::min(blocks, 1 + detail::k_conv_partial_budget / gw_size);
  blocks = std::max<int64_t>(blocks, 1);
  const int64_t cap = pointwise ? 1 : detail::conv_images_per_gemm(std::max(k, g.c_out) * ohw);

  // Block 0 accumulates straight into gw; the others into their own partial buffers.
  auto partials = blocks > 1 ? detail::conv_scratch<T>((blocks - 1) * gw_size) : nullptr;
  auto run_blocks = [&](int64_t block_lo, int64_t block_hi) {
    auto& ws = detail::conv_workspace<T>();
    for (int64_t blk = block_lo; blk < block_hi; ++blk) {
      T* acc = blk == 0 ? gw : partials.get() + (blk - 1) * gw_size;
      const int64_t block_first = blk * g.n / blocks;
      detail::for_each_image_chunk(block_first, (blk + 1) * g.n / blocks, cap, [&](int64_t first, int64_t count) {
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
    }
  };
  if (blocks > 1 && detail::conv_split_batch(blocks, work_per_image))
    parallel_for(0, blocks, 1, run_blocks);
  else
    run_blocks(0, blocks);

  if (blocks > 1) {
    parallel_for(0, gw_size, detail::k_conv_min_parallel_work, [&](int64_t lo, int64_t hi) {
      for (int64_t blk = 1; blk < blocks; ++blk) {
        const T* part = partials.get() + (blk - 1) * gw_size;
        for (int64_t j = lo; j < hi; ++j) gw[j] += part[j];
      }
    });
  }
}

}  // namespace xgrad::cpu
