// xgrad CPU backend: a convolution whose output goes through ReLU and max pooling, forward and
// backward. The forward pools each image's convolution while it is in cache, so the full-size
// output never reaches memory. The gradient reaching the convolution is
// max_pool2d_put(argmax, gp): zero except at each window's argmax. The backward kernels take
// the argmax and the pooled gradient gp instead, and sum over the pooled elements only: for
// 2 x 2 pooling a quarter of the dense kernels' work, and no put. A graph makes all three
// (passes/fuse.hpp).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "xgrad/backend/cpu/conv.hpp"
#include "xgrad/backend/cpu/elementwise.hpp"
#include "xgrad/backend/cpu/pool.hpp"
#include "xgrad/backend/math.hpp"
#include "xgrad/core/dtype.hpp"

namespace xgrad::cpu {

namespace detail {

/// Whether the sparse kernels below serve the convolution: conv_is_shifted with a 3 x 3 or 5 x 5
/// window (the window's rows are the kernels' register rows). Any other geometry goes through
/// the put and the dense kernels.
inline bool conv_pooled_suits(const Conv2dGeometry& g) {
  return conv_is_shifted(g) && g.kh == g.kw && (g.kh == 3 || g.kh == 5);
}

/// Whether conv2d_relu_max_pool pools each image in cache: a convolution the direct or the
/// shifted kernel computes, pooled 2 x 2 / 2.
inline bool conv_relu_max_pool_suits(const Conv2dGeometry& g, const Pool2dGeometry& p) {
  return conv_is_shifted(g) && pool_is_2x2(p) && p.n == g.n && p.c == g.c_out && p.h == g.out_h && p.w == g.out_w;
}

/// The layout the sparse kernels read windows in: an image channels-last, [h * w][c_in], so that
/// one window row (kw positions of c_in channels) is kw * c_in consecutive elements, read in
/// `chunks` vectors. A window is found from the argmax, a plane offset in the convolution's
/// output, through `at`: the offset of output position q's window in a channels-last image.
struct PooledWindows {
  int64_t row_elements;  // kw * c_in
  int64_t chunks;        // vectors per window row
  int64_t row_step;      // w * c_in: from one window row to the next
  const int32_t* at;

  /// Vectors V per window row of g.
  template <class V> static int64_t chunks_of(const Conv2dGeometry& g) {
    constexpr int64_t L = static_cast<int64_t>(V::size);
    return (g.kw * g.c_in + L - 1) / L;
  }

  /// The windows of g in vectors V, `at` written into `storage`.
  template <class V> static PooledWindows of(const Conv2dGeometry& g, std::vector<int32_t>& storage) {
    storage.resize(static_cast<std::size_t>(g.out_h * g.out_w));
    for (int64_t q = 0; q < g.out_h * g.out_w; ++q)
      storage[static_cast<std::size_t>(q)] = static_cast<int32_t>((q / g.out_w * g.w + q % g.out_w) * g.c_in);
    return {g.kw * g.c_in, chunks_of<V>(g), g.w * g.c_in, storage.data()};
  }
};

/// What one thread works in during a call of the sparse kernels, kept between calls (a train
/// step's calls then allocate nothing): the window offsets; for the input gradient, its store
/// order and its weights laid out by window rows (`win`, `order` and `wt` laid out for the call
/// `stamp`), and the pooled elements listed per output position.
template <class T> struct PooledScratch {
  std::vector<int32_t> at, order, count, listed_co;
  std::vector<T> listed_g;
  ScratchBuffer<T> wt;
  PooledWindows win{};
  std::uint64_t stamp = 0;
};
template <class T> PooledScratch<T>& pooled_scratch() {
  static thread_local PooledScratch<T> scratch;
  return scratch;
}

/// dst [count][plane][c] from src [count][c][plane] (dst holds a vector more: the transposes
/// write whole vectors); false when an element is not finite.
template <class T> bool channels_last(const T* src, int64_t count, int64_t c, int64_t plane, T* dst) {
  if (c == 1) {
    std::copy(src, src + count * plane, dst);
  } else if (c <= static_cast<int64_t>(xsimd::batch<T>::size)) {
    // Each position's vector spills past its c lanes into the next ones, written after it.
    gy_by_position(src, count, c, plane, dst, c);
  } else {
    for (int64_t i = 0; i < count; ++i)
      for (int64_t p = 0; p < plane; ++p)
        for (int64_t ch = 0; ch < c; ++ch) dst[(i * plane + p) * c + ch] = src[(i * c + ch) * plane + p];
  }
  return all_finite(src, count * c * plane);
}

/// Vectors per sum set in the sparse kernels' register blocks: column blocks of two vectors when
/// a window row takes two or more.
inline constexpr int64_t k_pooled_block = 2;

/// acc[s][a][j] (+)= gp[o] times window row a's vectors [cb, cb + CB) at o's argmax, over the
/// pooled elements o of one plane, alternating between S sets of sums so that consecutive
/// elements' multiply-adds do not wait on each other. A dropped window (-1) adds 0.
template <class V, int KH, int CB, int S, class T = typename V::value_type>
[[gnu::always_inline]] inline void weight_sums_of_plane(const int32_t* idx, const T* gp, int64_t pooled,
                                                        const int32_t* at, const T* image, int64_t row_step,
                                                        std::array<std::array<std::array<V, CB>, KH>, S>& acc) {
  constexpr int64_t L = static_cast<int64_t>(V::size);
  auto step = [&](std::array<std::array<V, CB>, KH>& sums, int64_t o) {
    const int32_t i = idx[o];
    const V g(i < 0 ? T(0) : gp[o]);
    const T* base = image + at[i < 0 ? 0 : i];
#pragma GCC unroll 8
    for (int a = 0; a < KH; ++a)
#pragma GCC unroll 4
      for (int j = 0; j < CB; ++j)
        sums[a][j] = xsimd::fma(g, V::load_unaligned(base + a * row_step + j * L), sums[a][j]);
  };
  int64_t o = 0;
  for (; o + S <= pooled; o += S)
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s) step(acc[s], o + s);
  for (; o < pooled; ++o) step(acc[0], o);
}

/// The weight gradient of images [first, last) for column block [cb, cb + CB) of every output
/// channel's window rows, added into part [c_out][KH][chunks * L]; xt holds the images
/// channels-last.
template <class V, int KH, int CB, class T = typename V::value_type>
void weight_block_pooled(const Conv2dGeometry& g, const Pool2dGeometry& p, const PooledWindows& win, const T* xt,
                         int64_t count, const int32_t* idx, const T* gp, int64_t cb, T* part) {
  constexpr int64_t L = static_cast<int64_t>(V::size);
  constexpr int S = GemmConfig<T>::vector_regs >= 32 ? 2 : 1;
  const int64_t pooled = p.out_h * p.out_w;
  const int64_t image = g.h * g.w * g.c_in;
  for (int64_t co = 0; co < g.c_out; ++co) {
    T* sums = part + (co * KH * win.chunks + cb) * L;
    std::array<std::array<std::array<V, CB>, KH>, S> acc;
    for (int s = 0; s < S; ++s)
      for (int a = 0; a < KH; ++a)
        for (int j = 0; j < CB; ++j) acc[s][a][j] = s == 0 ? V::load_aligned(sums + (a * win.chunks + j) * L) : V(T(0));
    for (int64_t i = 0; i < count; ++i) {
      const int64_t plane = i * g.c_out + co;
      weight_sums_of_plane<V, KH, CB, S>(idx + plane * pooled, gp + plane * pooled, pooled, win.at,
                                         xt + i * image + cb * L, win.row_step, acc);
    }
    for (int a = 0; a < KH; ++a)
      for (int j = 0; j < CB; ++j) {
        V total = acc[0][a][j];
        for (int s = 1; s < S; ++s) total += acc[s][a][j];
        total.store_aligned(sums + (a * win.chunks + j) * L);
      }
  }
}

template <class V, int KH, class T = typename V::value_type>
void weight_block_pooled(const Conv2dGeometry& g, const Pool2dGeometry& p, const PooledWindows& win, const T* xt,
                         int64_t count, const int32_t* idx, const T* gp, T* part) {
  for (int64_t cb = 0; cb < win.chunks; cb += k_pooled_block) {
    if (win.chunks - cb >= k_pooled_block)
      weight_block_pooled<V, KH, k_pooled_block>(g, p, win, xt, count, idx, gp, cb, part);
    else
      weight_block_pooled<V, KH, 1>(g, p, win, xt, count, idx, gp, cb, part);
  }
}

// Channels-last images one pass of the weight gradient keeps in L1 (bytes), read once per
// output channel.
inline constexpr int64_t k_pooled_images_bytes = int64_t{24} << 10;

/// The store order of the input gradient's windows: rows kh apart back to back, so that no
/// window overlaps the one before it (a load from a store still in flight stalls).
inline void pooled_store_order(const Conv2dGeometry& g, std::vector<int32_t>& order) {
  order.clear();
  for (int64_t y0 = 0; y0 < std::min(g.kh, g.out_h); ++y0)
    for (int64_t x = 0; x < g.out_w; ++x)
      for (int64_t y = y0; y < g.out_h; y += g.kh) order.push_back(static_cast<int32_t>(y * g.out_w + x));
}

/// One image's input gradient, channels-last into gxt (zeroed here): the pooled gradients are
/// listed per output position q (with their output channels), then each q with any adds
/// sum over them of gp times the channel's weights, one window, into gxt: one store per window
/// row vector per position, not per pooled element. wt is w as [c_out][KH][chunks * L], zero
/// past each row; a row's last vector adds only within the row (as 0 times an infinite gradient
/// is NaN).
template <class T, int KH, int CB> void input_windows_pooled(const PooledWindows& win,
                                                             const std::vector<int32_t>& order, const int32_t* count,
                                                             const int32_t* listed_co, const T* listed_g,
                                                             int64_t per_position, const T* wt, int64_t cb, T* gxt) {
  using V = xsimd::batch<T>;
  constexpr int64_t L = static_cast<int64_t>(V::size);
  const int64_t wrow = win.chunks * L;
  std::array<xsimd::batch_bool<T>, CB> in_row;
  for (int j = 0; j < CB; ++j)
    in_row[static_cast<std::size_t>(j)] =
        lane_indices<V>() + V(static_cast<T>((cb + j) * L)) < V(static_cast<T>(win.row_elements));
  for (const int32_t q : order) {
    const int32_t n = count[q];
    if (n == 0) continue;
    const int32_t* cos = listed_co + q * per_position;
    const T* gs = listed_g + q * per_position;
    std::array<std::array<V, CB>, KH> u;
    {
      const V g(gs[0]);
      const T* w = wt + cos[0] * KH * wrow + cb * L;
#pragma GCC unroll 8
      for (int a = 0; a < KH; ++a)
#pragma GCC unroll 4
        for (int j = 0; j < CB; ++j) u[a][j] = g * V::load_aligned(w + a * wrow + j * L);
    }
    for (int32_t k = 1; k < n; ++k) {
      const V g(gs[k]);
      const T* w = wt + cos[k] * KH * wrow + cb * L;
#pragma GCC unroll 8
      for (int a = 0; a < KH; ++a)
#pragma GCC unroll 4
        for (int j = 0; j < CB; ++j) u[a][j] = xsimd::fma(g, V::load_aligned(w + a * wrow + j * L), u[a][j]);
    }
    T* base = gxt + win.at[q] + cb * L;
#pragma GCC unroll 8
    for (int a = 0; a < KH; ++a)
#pragma GCC unroll 4
      for (int j = 0; j < CB; ++j) {
        T* at = base + a * win.row_step + j * L;
        (V::load_unaligned(at) + xsimd::select(in_row[static_cast<std::size_t>(j)], u[a][j], V(T(0))))
            .store_unaligned(at);
      }
  }
}

template <class T, int KH> void input_windows_pooled(const PooledWindows& win, const std::vector<int32_t>& order,
                                                     const int32_t* count, const int32_t* listed_co, const T* listed_g,
                                                     int64_t per_position, const T* wt, T* gxt) {
  for (int64_t cb = 0; cb < win.chunks; cb += k_pooled_block) {
    if (win.chunks - cb >= k_pooled_block)
      input_windows_pooled<T, KH, k_pooled_block>(win, order, count, listed_co, listed_g, per_position, wt, cb, gxt);
    else
      input_windows_pooled<T, KH, 1>(win, order, count, listed_co, listed_g, per_position, wt, cb, gxt);
  }
}

/// The dense route: the put into a buffer of its own, then the dense kernel.
template <class T, class Dense>
void through_put(const Pool2dGeometry& p, const int32_t* idx, const T* gp, Dense&& dense) {
  auto gy = conv_scratch<T>(p.n * p.c * p.h * p.w);
  max_pool2d_put(p, idx, gp, gy.get());
  dense(gy.get());
}

}  // namespace detail

namespace detail {

/// Whether N is a vector type of fewer lanes than xsimd::batch<T>.
template <class N, class T> constexpr bool narrower_than_batch() {
  if constexpr (std::is_void_v<N>)
    return false;
  else
    return N::size < xsimd::batch<T>::size;
}

/// conv2d_backward_weight_pooled in vectors V; false (gw unfinished) when x is not all finite.
template <class V, class T = typename V::value_type> bool weight_pooled(const Conv2dGeometry& g,
                                                                        const Pool2dGeometry& p, const T* x,
                                                                        const int32_t* idx, const T* gp, T* gw) {
  constexpr int64_t L = static_cast<int64_t>(V::size);
  const int64_t chunks = PooledWindows::chunks_of<V>(g);
  const int64_t image = g.c_in * g.h * g.w;
  const int64_t pooled_plane = p.out_h * p.out_w;
  const int64_t part_size = g.c_out * g.kh * chunks * L;
  const int64_t gw_size = g.c_out * g.c_in * g.kh * g.kw;
  const int64_t work_per_image = g.c_out * pooled_plane * g.kh * chunks * L;
  const int64_t per_pass = std::max<int64_t>(1, k_pooled_images_bytes / (image * static_cast<int64_t>(sizeof(T))));
  std::atomic<bool> finite{true};
  sum_over_image_blocks(g.n, direct_weight_blocks(g.n, work_per_image), gw_size, work_per_image, gw,
                        [&](int64_t first, int64_t last, T* out) {
                          const PooledWindows win = PooledWindows::of<V>(g, pooled_scratch<T>().at);
                          auto& ws = conv_workspace<T>();
                          T* part = ws.m_col.get(part_size);
                          std::fill(part, part + part_size, T(0));
                          for (int64_t i = first; i < last; i += per_pass) {
                            const int64_t count = std::min(per_pass, last - i);
                            // Window rows read up to a vector past the last image's end.
                            T* xt = ws.m_mat.get(count * image + L);
                            if (!channels_last(x + i * image, count, g.c_in, g.h * g.w, xt)) finite = false;
                            std::fill(xt + count * image, xt + count * image + L, T(0));
                            const int64_t planes = i * g.c_out * pooled_plane;
                            if (g.kh == 5)
                              weight_block_pooled<V, 5>(g, p, win, xt, count, idx + planes, gp + planes, part);
                            else
                              weight_block_pooled<V, 3>(g, p, win, xt, count, idx + planes, gp + planes, part);
                          }
                          for (int64_t co = 0; co < g.c_out; ++co)
                            for (int64_t c = 0; c < g.c_in; ++c)
                              for (int64_t a = 0; a < g.kh; ++a)
                                for (int64_t b = 0; b < g.kw; ++b)
                                  out[((co * g.c_in + c) * g.kh + a) * g.kw + b] =
                                      part[(co * g.kh + a) * win.chunks * L + b * g.c_in + c];
                        });
  return finite;
}

}  // namespace detail

/// gw = conv2d_backward_weight(g, x, max_pool2d_put(p, idx, gp)): x [n, c_in, h, w], idx and gp
/// [n, c_out, p.out_h, p.out_w] with p's input the convolution's output; gw [c_out, c_in, kh, kw]
/// overwritten. Each pooled element adds gp times the x window at its argmax (the dense kernel
/// multiplies every other output position by 0). Window rows that fit half a vector are read in
/// half-width vectors: fewer of the unaligned loads cross a cache line. Where x holds an
/// infinity or NaN the dense kernel runs instead, so that the zeros times it give the NaNs they
/// give there. Blocks of images fixed by the geometry: repeated calls give the same bits.
template <class T> void conv2d_backward_weight_pooled(const Conv2dGeometry& g, const Pool2dGeometry& p, const T* x,
                                                      const int32_t* idx, const T* gp, T* gw) {
  auto dense = [&](const T* gy) { conv2d_backward_weight(g, x, gy, gw); };
  if (!detail::conv_pooled_suits(g) || g.n <= 0 || g.c_out * g.c_in == 0) return detail::through_put(p, idx, gp, dense);
  using Wide = xsimd::batch<T>;
  using Narrow = xsimd::make_sized_batch_t<T, 32 / sizeof(T)>;  // void without 256-bit vectors
  bool finite;
  if constexpr (detail::narrower_than_batch<Narrow, T>()) {
    finite = g.kw * g.c_in <= static_cast<int64_t>(Narrow::size) ? detail::weight_pooled<Narrow>(g, p, x, idx, gp, gw)
                                                                 : detail::weight_pooled<Wide>(g, p, x, idx, gp, gw);
  } else {
    finite = detail::weight_pooled<Wide>(g, p, x, idx, gp, gw);
  }
  if (!finite) detail::through_put(p, idx, gp, dense);
}

/// gx = conv2d_backward_input(g, max_pool2d_put(p, idx, gp), w): shapes as for
/// conv2d_backward_weight_pooled, gx [n, c_in, h, w] overwritten. Each output position reached by
/// pooled elements adds their gradients times their channels' weights over its window. Where w
/// holds an infinity or NaN the dense kernel runs instead (its zeros times it make NaNs), and
/// where a window row (kw * c_in) is shorter than a vector.
template <class T> void conv2d_backward_input_pooled(const Conv2dGeometry& g, const Pool2dGeometry& p,
                                                     const int32_t* idx, const T* gp, const T* w, T* gx) {
  auto dense = [&](const T* gy) { conv2d_backward_input(g, gy, w, gx); };
  using V = xsimd::batch<T>;
  constexpr int64_t L = static_cast<int64_t>(V::size);
  // Window rows shorter than a vector: the adds of neighbouring positions' windows land on the
  // same vectors one after another (each waits for the last store), slower than the put.
  if (!detail::conv_pooled_suits(g) || g.kw * g.c_in < L || !detail::all_finite(w, g.c_out * g.c_in * g.kh * g.kw) ||
      g.n <= 0 || g.c_out == 0)
    return detail::through_put(p, idx, gp, dense);
  const int64_t wrow = detail::PooledWindows::chunks_of<V>(g) * L;
  const std::uint64_t stamp = detail::new_call_stamp();
  const int64_t positions = g.out_h * g.out_w;
  const int64_t pooled_plane = p.out_h * p.out_w;
  const int64_t image = g.c_in * g.h * g.w;
  // Pooled elements whose argmax can be one position: the windows holding it, per channel.
  const int64_t per_position =
      g.c_out * ((p.kh + p.stride_h - 1) / p.stride_h) * ((p.kw + p.stride_w - 1) / p.stride_w);
  detail::conv_for_batch(g.n, g.c_out * pooled_plane * g.kh * wrow, [&](int64_t lo, int64_t hi) {
    auto& own = detail::pooled_scratch<T>();
    if (own.stamp != stamp) {
      own.win = detail::PooledWindows::of<V>(g, own.at);
      // w as [c_out][kh][kw * c_in], each row padded to whole vectors with zeros (aligned).
      T* wt = own.wt.get(g.c_out * g.kh * wrow);
      std::fill(wt, wt + g.c_out * g.kh * wrow, T(0));
      for (int64_t co = 0; co < g.c_out; ++co)
        for (int64_t c = 0; c < g.c_in; ++c)
          for (int64_t a = 0; a < g.kh; ++a)
            for (int64_t b = 0; b < g.kw; ++b)
              wt[(co * g.kh + a) * wrow + b * g.c_in + c] = w[((co * g.c_in + c) * g.kh + a) * g.kw + b];
      detail::pooled_store_order(g, own.order);
      own.stamp = stamp;
    }
    const detail::PooledWindows& win = own.win;
    const std::vector<int32_t>& order = own.order;
    const T* wt = own.wt.get(g.c_out * g.kh * wrow);
    std::vector<int32_t>& count = own.count;
    count.resize(static_cast<std::size_t>(positions));
    own.listed_co.resize(static_cast<std::size_t>(positions * per_position));
    own.listed_g.resize(static_cast<std::size_t>(positions * per_position));
    int32_t* listed_co = own.listed_co.data();
    T* listed_g = own.listed_g.data();
    T* gxt = detail::conv_workspace<T>().m_mat.get(image + L);
    for (int64_t i = lo; i < hi; ++i) {
      std::fill(count.begin(), count.end(), 0);
      for (int64_t co = 0; co < g.c_out; ++co) {
        const int32_t* id = idx + (i * g.c_out + co) * pooled_plane;
        const T* gv = gp + (i * g.c_out + co) * pooled_plane;
        for (int64_t o = 0; o < pooled_plane; ++o) {
          const int32_t q = id[o];
          if (q < 0) continue;
          const int64_t k = q * per_position + count[static_cast<std::size_t>(q)]++;
          listed_co[k] = static_cast<int32_t>(co);
          listed_g[k] = gv[o];
        }
      }
      std::fill(gxt, gxt + image + L, T(0));
      if (g.kh == 5)
        detail::input_windows_pooled<T, 5>(win, order, count.data(), listed_co, listed_g, per_position, wt, gxt);
      else
        detail::input_windows_pooled<T, 3>(win, order, count.data(), listed_co, listed_g, per_position, wt, gxt);
      detail::positions_to_channels(gxt, g.h * g.w, g.c_in, g.c_in, gx + i * image);
    }
  });
}

namespace detail {

/// The block's pooling for one image held position-major, pos [ohw][ld] (lanes = output
/// channels), as the direct kernel leaves it: each window's four positions meet in row-major
/// order through pool_takes_later, so each lane keeps the first maximum (a NaN before any
/// number), as max_pool_argmax_2x2 does on planes. Into maxima and at, position-major
/// [pooled][ld]: the maximum, and its offset in the plane as a number (-1 where the maximum is
/// not above 0).
template <class T>
void max_pool_positions(const Conv2dGeometry& g, const Pool2dGeometry& p, const T* pos, int64_t ld, T* maxima, T* at) {
  using V = xsimd::batch<T>;
  constexpr auto L = static_cast<int64_t>(V::size);
  const V zero(T(0)), none(T(-1));
  for (int64_t ph = 0; ph < p.out_h; ++ph)
    for (int64_t pw = 0; pw < p.out_w; ++pw) {
      const int64_t q = 2 * ph * g.out_w + 2 * pw;
      const int64_t o = (ph * p.out_w + pw) * ld;
      for (int64_t cv = 0; cv < ld; cv += L) {
        V best = V::load_aligned(pos + q * ld + cv);
        V best_at(static_cast<T>(q));
        for (const int64_t d : {int64_t{1}, g.out_w, g.out_w + 1}) {
          const V v = V::load_aligned(pos + (q + d) * ld + cv);
          const auto take = pool_takes_later(v, best);
          best = xsimd::select(take, v, best);
          best_at = xsimd::select(take, V(static_cast<T>(q + d)), best_at);
        }
        xsimd::select(best > zero, best_at, none).store_aligned(at + o + cv);
        best.store_aligned(maxima + o + cv);
      }
    }
}

}  // namespace detail

/// values, idx = max_pool2d_argmax(p, relu(conv2d_forward(g, x, w) + bias), drop_nonpositive =
/// true): a convnet block's forward. x [n, c_in, h, w], w [c_out, c_in, kh, kw], bias [c_out]
/// added to each channel (none when null); values and idx [n, c_out, p.out_h, p.out_w]
/// overwritten, p's input the convolution's output. Where conv_relu_max_pool_suits, each
/// image's convolution is biased and pooled while it is in cache and never stored whole, and
/// the ReLU, which commutes with max, runs on the maxima only: the same bits as the kernels one
/// after another, which run otherwise.
template <class T> void conv2d_relu_max_pool(const Conv2dGeometry& g, const Pool2dGeometry& p, const T* x, const T* w,
                                             const T* bias, T* values, int32_t* idx) {
  using V = xsimd::batch<T>;
  constexpr auto L = static_cast<int64_t>(V::size);
  const int64_t pooled = p.out_h * p.out_w;
  const int64_t pooled_image = g.c_out * pooled;
  if (g.n <= 0 || pooled_image == 0) return;
  const int64_t k = g.c_in * g.kh * g.kw;
  const int64_t ohw = g.out_h * g.out_w;
  auto relu = [](T* v, int64_t count) {
    int64_t j = 0;
    if constexpr (detail::simd_type<T>)  // math::max is a device function too: no batch in nvcc's device pass
      for (; j + L <= count; j += L) math::max(V::load_unaligned(v + j), V(T(0))).store_unaligned(v + j);
    for (; j < count; ++j) v[j] = math::max(v[j], T(0));
  };
  if (!detail::conv_relu_max_pool_suits(g, p) || k == 0) {
    std::vector<T> y(static_cast<std::size_t>(g.n * g.c_out * ohw));
    conv2d_forward(g, x, w, y.data());
    if (bias)
      for (int64_t plane = 0; plane < g.n * g.c_out; ++plane)
        for (int64_t q = 0; q < ohw; ++q) y[static_cast<std::size_t>(plane * ohw + q)] += bias[plane % g.c_out];
    relu(y.data(), static_cast<int64_t>(y.size()));
    max_pool2d_argmax(p, y.data(), idx, values, true);
    return;
  }
  const int64_t x_img = g.c_in * g.h * g.w;
  const int64_t work_per_image = g.c_out * k * ohw;
  if (detail::conv_direct_suits<T>(g)) {
    // Position-major from the kernel to the pooled maxima; only those are transposed.
    const int64_t ld = (g.c_out + L - 1) / L * L;
    std::vector<T, xsimd::aligned_allocator<T>> lanes(static_cast<std::size_t>(ld), T(0));  // the bias by lane
    if (bias) std::copy(bias, bias + g.c_out, lanes.begin());
    const std::uint64_t stamp = detail::new_call_stamp();
    detail::conv_for_batch(g.n, work_per_image, [&](int64_t lo, int64_t hi) {
      const detail::DirectWeights<T>& wt = detail::direct_weights(g, w, stamp);
      auto& ws = detail::conv_workspace<T>();
      T* positions = ws.m_mat.get(ohw * wt.ld);
      T* maxima = ws.m_col.get(2 * pooled * wt.ld);
      T* at = maxima + pooled * wt.ld;
      for (int64_t i = lo; i < hi; ++i) {
        detail::forward_direct_image(g, x + i * x_img, wt, positions);
        if (bias)
          for (int64_t q = 0; q < ohw; ++q)
            for (int64_t cv = 0; cv < wt.ld; cv += L)
              (V::load_aligned(positions + q * wt.ld + cv) + V::load_aligned(lanes.data() + cv))
                  .store_aligned(positions + q * wt.ld + cv);
        detail::max_pool_positions(g, p, positions, wt.ld, maxima, at);
        detail::positions_to_channels(maxima, pooled, g.c_out, wt.ld, values + i * pooled_image);
        relu(values + i * pooled_image, pooled_image);
        detail::positions_to_channels(at, pooled, g.c_out, wt.ld, positions);
        for (int64_t j = 0; j < pooled_image; ++j) idx[i * pooled_image + j] = static_cast<int32_t>(positions[j]);
      }
    });
    return;
  }
  // The shifted product leaves each plane on x's grid, rows w apart; the pool's vectors may
  // read 2L past a row.
  const std::vector<int64_t> taps = detail::conv_tap_offsets(g);
  const int64_t plane = g.out_h * g.w;
  const int64_t planes_size = g.c_out * plane + 2 * L;
  const Pool2dGeometry image_pool{1,          p.c,        p.h,       p.w,        p.kh,    p.kw,
                                  p.stride_h, p.stride_w, p.pad_top, p.pad_left, p.out_h, p.out_w};
  detail::conv_for_batch(g.n, work_per_image, [&](int64_t lo, int64_t hi) {
    T* planes = detail::conv_workspace<T>().m_col.get(planes_size);
    // What no image writes is read by the pool's vectors past the rows: zeros, never a NaN
    // that would send its steps to the scalar rules.
    std::fill(planes + g.c_out * plane, planes + planes_size, T(0));
    for (int64_t c = 0; c < g.c_out; ++c)
      std::fill(planes + c * plane + detail::conv_grid(g), planes + (c + 1) * plane, T(0));
    const detail::PoolInput<T> in{planes, planes + planes_size, g.w, plane};
    for (int64_t i = lo; i < hi; ++i) {
      detail::gemm_shifted(g.c_out, detail::conv_grid(g), k, w, k, x + i * x_img, taps.data(), planes, plane);
      if (bias)
        for (int64_t c = 0; c < g.c_out; ++c) {
          const V b(bias[c]);
          T* row = planes + c * plane;
          int64_t q = 0;
          for (; q + L <= detail::conv_grid(g); q += L) (V::load_unaligned(row + q) + b).store_unaligned(row + q);
          for (; q < detail::conv_grid(g); ++q) row[q] += bias[c];
        }
      detail::max_pool_argmax_2x2(image_pool, in, 0, g.c_out, idx + i * pooled_image, values + i * pooled_image, true);
      relu(values + i * pooled_image, pooled_image);
    }
  });
}

// The instances xgrad::compiled holds (core/config.hpp), in src/kernels.cpp.
#define XGRAD_CONV_POOLED_INSTANCE(T, X)                                                                          \
  X void conv2d_relu_max_pool<T>(const Conv2dGeometry&, const Pool2dGeometry&, const T*, const T*, const T*, T*,  \
                                 int32_t*);                                                                       \
  X void conv2d_backward_input_pooled<T>(const Conv2dGeometry&, const Pool2dGeometry&, const int32_t*, const T*,  \
                                         const T*, T*);                                                           \
  X void conv2d_backward_weight_pooled<T>(const Conv2dGeometry&, const Pool2dGeometry&, const T*, const int32_t*, \
                                          const T*, T*);
#define XGRAD_CONV_POOLED_INSTANCES(X) XGRAD_FOR_EACH_FloatingPoint(XGRAD_CONV_POOLED_INSTANCE, X)
#if defined(XGRAD_COMPILED) && !defined(XGRAD_INSTANTIATE_CONV_POOLED)
XGRAD_CONV_POOLED_INSTANCES(extern template)
#endif

}  // namespace xgrad::cpu
