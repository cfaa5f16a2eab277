// xgrad CPU backend: 2-D convolution kernels (im2col / col2im + GEMM) on contiguous NCHW data.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <memory>

#include "xgrad/backend/cpu/gemm.hpp"
#include "xgrad/backend/cpu/thread_pool.hpp"

namespace xgrad::cpu {

/// Geometry of one 2-D convolution. x is [n, c_in, h, w], w is [c_out, c_in, kh, kw] and
/// y is [n, c_out, out_h, out_w]. Bottom/right padding is implied by out_h/out_w, which the
/// caller computes.
struct Conv2dGeometry {
  int64_t n, c_in, h, w, c_out, kh, kw, stride_h, stride_w, pad_top, pad_left, dil_h, dil_w, out_h, out_w;
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

template <class T> std::unique_ptr<T[]> conv_scratch(int64_t size) {
  return std::make_unique_for_overwrite<T[]>(static_cast<std::size_t>(std::max<int64_t>(size, 1)));
}

}  // namespace detail

/// Unfolds one image x [c_in, h, w] into col [c_in * kh * kw, out_h * out_w] (g.n is ignored).
/// Positions that fall into the padding are written as zero.
template <class T> void im2col(const Conv2dGeometry& g, const T* x, T* col) {
  const int64_t ohw = g.out_h * g.out_w;
  T* dst = col;
  for (int64_t c = 0; c < g.c_in; ++c) {
    const T* xc = x + c * g.h * g.w;
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      const int64_t off_h = ki * g.dil_h - g.pad_top;
      const auto rh = detail::valid_range(off_h, g.stride_h, g.h, g.out_h);
      for (int64_t kj = 0; kj < g.kw; ++kj, dst += ohw) {
        const int64_t off_w = kj * g.dil_w - g.pad_left;
        const auto rw = detail::valid_range(off_w, g.stride_w, g.w, g.out_w);
        std::fill(dst, dst + rh.lo * g.out_w, T(0));
        for (int64_t oh = rh.lo; oh < rh.hi; ++oh) {
          T* drow = dst + oh * g.out_w;
          const T* xrow = xc + (oh * g.stride_h + off_h) * g.w;
          std::fill(drow, drow + rw.lo, T(0));
          if (g.stride_w == 1) {
            std::copy(xrow + rw.lo + off_w, xrow + rw.hi + off_w, drow + rw.lo);
          } else {
            for (int64_t ow = rw.lo; ow < rw.hi; ++ow) drow[ow] = xrow[ow * g.stride_w + off_w];
          }
          std::fill(drow + rw.hi, drow + g.out_w, T(0));
        }
        std::fill(dst + rh.hi * g.out_w, dst + ohw, T(0));
      }
    }
  }
}

/// Folds col [c_in * kh * kw, out_h * out_w] back into one image x [c_in, h, w], adding to
/// what x holds (overlapping windows accumulate; padding entries are dropped). The adjoint of im2col.
template <class T> void col2im(const Conv2dGeometry& g, const T* col, T* x) {
  const int64_t ohw = g.out_h * g.out_w;
  const T* src = col;
  for (int64_t c = 0; c < g.c_in; ++c) {
    T* xc = x + c * g.h * g.w;
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      const int64_t off_h = ki * g.dil_h - g.pad_top;
      const auto rh = detail::valid_range(off_h, g.stride_h, g.h, g.out_h);
      for (int64_t kj = 0; kj < g.kw; ++kj, src += ohw) {
        const int64_t off_w = kj * g.dil_w - g.pad_left;
        const auto rw = detail::valid_range(off_w, g.stride_w, g.w, g.out_w);
        for (int64_t oh = rh.lo; oh < rh.hi; ++oh) {
          const T* srow = src + oh * g.out_w;
          T* xrow = xc + (oh * g.stride_h + off_h) * g.w;
          if (g.stride_w == 1) {
            T* xo = xrow + rw.lo + off_w;
            const T* so = srow + rw.lo;
            for (int64_t j = 0; j < rw.hi - rw.lo; ++j) xo[j] += so[j];
          } else {
            for (int64_t ow = rw.lo; ow < rw.hi; ++ow) xrow[ow * g.stride_w + off_w] += srow[ow];
          }
        }
      }
    }
  }
}

/// y = conv2d(x, w): x [n, c_in, h, w], w [c_out, c_in, kh, kw], y [n, c_out, out_h, out_w] (overwritten).
template <class T> void conv2d_forward(const Conv2dGeometry& g, const T* x, const T* w, T* y) {
  const int64_t ohw = g.out_h * g.out_w;
  const int64_t k = g.c_in * g.kh * g.kw;
  const int64_t x_img = g.c_in * g.h * g.w;
  const int64_t y_img = g.c_out * ohw;
  if (g.n <= 0 || y_img == 0) return;
  if (k == 0) {
    std::fill(y, y + g.n * y_img, T(0));
    return;
  }
  const bool pointwise = detail::conv_is_pointwise(g);
  detail::conv_for_batch(g.n, g.c_out * k * ohw, [&](int64_t lo, int64_t hi) {
    auto col = pointwise ? nullptr : detail::conv_scratch<T>(k * ohw);
    for (int64_t i = lo; i < hi; ++i) {
      const T* b = x + i * x_img;
      if (!pointwise) {
        im2col(g, b, col.get());
        b = col.get();
      }
      // y_i [c_out, ohw] = w [c_out, k] * col [k, ohw]
      gemm<T>(g.c_out, ohw, k, T(1), w, k, 1, b, ohw, 1, T(0), y + i * y_img, ohw);
    }
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
  const bool pointwise = detail::conv_is_pointwise(g);
  detail::conv_for_batch(g.n, g.c_out * k * ohw, [&](int64_t lo, int64_t hi) {
    auto col = pointwise ? nullptr : detail::conv_scratch<T>(k * ohw);
    for (int64_t i = lo; i < hi; ++i) {
      T* gx_i = gx + i * x_img;
      // col [k, ohw] = w^T [k, c_out] * gy_i [c_out, ohw]; for pointwise convs col is gx_i itself.
      T* dst = pointwise ? gx_i : col.get();
      gemm<T>(k, ohw, g.c_out, T(1), w, 1, k, gy + i * y_img, ohw, 1, T(0), dst, ohw);
      if (!pointwise) {
        std::fill(gx_i, gx_i + x_img, T(0));
        col2im(g, col.get(), gx_i);
      }
    }
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
  // each block sums its images in order, and the block partials are added in block order. The
  // thread count only decides whether blocks or the GEMMs inside them run in parallel.
  const int64_t work_per_image = gw_size * ohw;
  int64_t blocks = std::min(g.n, detail::k_conv_max_weight_blocks);
  blocks = std::min(blocks, std::max<int64_t>(1, g.n * work_per_image / detail::k_conv_min_parallel_work));
  blocks = std::min(blocks, 1 + detail::k_conv_partial_budget / gw_size);
  blocks = std::max<int64_t>(blocks, 1);

  // Block 0 accumulates straight into gw; the others into their own partial buffers.
  auto partials = blocks > 1 ? detail::conv_scratch<T>((blocks - 1) * gw_size) : nullptr;
  auto run_blocks = [&](int64_t block_lo, int64_t block_hi) {
    auto col = pointwise ? nullptr : detail::conv_scratch<T>(k * ohw);
    for (int64_t blk = block_lo; blk < block_hi; ++blk) {
      T* acc = blk == 0 ? gw : partials.get() + (blk - 1) * gw_size;
      const int64_t first = blk * g.n / blocks;
      const int64_t last = (blk + 1) * g.n / blocks;
      for (int64_t i = first; i < last; ++i) {
        const T* b = x + i * x_img;
        if (!pointwise) {
          im2col(g, b, col.get());
          b = col.get();
        }
        // acc [c_out, k] (+)= gy_i [c_out, ohw] * col^T [ohw, k]
        gemm<T>(g.c_out, k, ohw, T(1), gy + i * y_img, ohw, 1, b, 1, ohw, i == first ? T(0) : T(1), acc, k);
      }
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
