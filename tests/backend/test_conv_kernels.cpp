// Tests for the CPU conv, pooling and bilinear-resize kernels against direct loops, plus adjointness.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "xgrad/backend/cpu/conv.hpp"
#include "xgrad/backend/cpu/conv_pooled.hpp"
#include "xgrad/backend/cpu/pool.hpp"
#include "xgrad/backend/cpu/resize.hpp"

namespace {

namespace cpu = xgrad::cpu;
using Vec = std::vector<double>;

// ---------------------------------------------------------------- helpers

Vec random_vec(int64_t size, uint32_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(static_cast<std::size_t>(size));
  for (auto& e : v) e = dist(gen);
  return v;
}

// Small integers, so that max-pool windows are full of ties.
Vec random_ints(int64_t size, uint32_t seed, int lo, int hi) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  Vec v(static_cast<std::size_t>(size));
  for (auto& e : v) e = dist(gen);
  return v;
}

template <class T> std::vector<T> cast_vec(const Vec& v) { return std::vector<T>(v.begin(), v.end()); }

// Round-trips through T so that the double reference sees exactly the kernel's inputs.
template <class T> Vec through(const Vec& v) {
  Vec r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = static_cast<double>(static_cast<T>(v[i]));
  return r;
}

Vec abs_vec(const Vec& v) {
  Vec r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = std::abs(v[i]);
  return r;
}

template <class T> std::vector<T> nan_vec(int64_t size) {
  return std::vector<T>(static_cast<std::size_t>(size), std::numeric_limits<T>::quiet_NaN());
}

double dot(const Vec& a, const Vec& b) {
  REQUIRE(a.size() == b.size());
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

template <class T> Vec to_double(const std::vector<T>& v) { return Vec(v.begin(), v.end()); }

template <class T> double conv_tolerance() { return 256 * static_cast<double>(std::numeric_limits<T>::epsilon()); }

// Every |got - ref| must be within conv_tolerance<T>() * scale, where scale bounds the magnitude of
// the terms that were summed (so the check is independent of cancellation).
template <class T>
void check_close(const std::vector<T>& got, const Vec& ref, const Vec& scale, const std::string& what) {
  REQUIRE(got.size() == ref.size());
  REQUIRE(scale.size() == ref.size());
  std::size_t worst = 0;
  double worst_excess = -1;
  bool ok = true;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - ref[i]);
    const double allowed = conv_tolerance<T>() * scale[i] + 1e-300;
    // !(err <= allowed) also catches NaN left behind in an output that should be overwritten.
    if (!(err <= allowed)) ok = false;
    const double excess = std::isnan(err) ? std::numeric_limits<double>::infinity() : err - allowed;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  INFO(what << ": worst index " << worst << " got " << static_cast<double>(got[worst]) << " expected " << ref[worst]);
  CHECK(ok);
}

template <class T> void check_close(const std::vector<T>& got, const Vec& ref, double scale, const std::string& what) {
  check_close(got, ref, Vec(ref.size(), scale), what);
}

void check_adjoint(double lhs, double rhs, double scale, const std::string& what) {
  INFO(what << ": <Ax, y> = " << lhs << ", <x, A^T y> = " << rhs);
  CHECK(std::abs(lhs - rhs) <= 1e-12 * scale);
}

// ---------------------------------------------------------------- convolution

struct ConvCase {
  int64_t n, c_in, h, w, c_out, kh, kw, sh, sw, pt, pb, pl, pr, dh, dw;
};

cpu::Conv2dGeometry conv_geometry(const ConvCase& c) {
  const int64_t out_h = (c.h + c.pt + c.pb - c.dh * (c.kh - 1) - 1) / c.sh + 1;
  const int64_t out_w = (c.w + c.pl + c.pr - c.dw * (c.kw - 1) - 1) / c.sw + 1;
  return {c.n, c.c_in, c.h, c.w, c.c_out, c.kh, c.kw, c.sh, c.sw, c.pt, c.pl, c.dh, c.dw, out_h, out_w};
}

const std::vector<ConvCase>& conv_cases() {
  //                                  n  ci  h   w  co kh kw sh sw pt pb pl pr dh dw
  static const std::vector<ConvCase> cases = {
      {1, 1, 5, 5, 1, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1},      // plain valid conv
      {3, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1},      // same padding
      {3, 3, 9, 8, 2, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1},      // stride 2
      {1, 3, 7, 7, 5, 3, 3, 1, 1, 2, 2, 2, 2, 2, 2},      // dilation 2
      {3, 1, 11, 9, 3, 3, 2, 2, 1, 2, 1, 0, 3, 2, 1},     // asymmetric everything
      {3, 3, 6, 5, 4, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1},      // 1x1 pointwise fast path
      {1, 3, 7, 6, 2, 1, 1, 2, 2, 0, 0, 0, 0, 1, 1},      // 1x1 stride 2
      {3, 3, 5, 5, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},      // 1x1 with padding
      {1, 1, 4, 4, 1, 5, 5, 1, 1, 2, 2, 2, 2, 1, 1},      // kernel larger than the image
      {3, 2, 5, 7, 3, 2, 3, 3, 2, 0, 1, 2, 0, 1, 2},      // strides 3/2, odd sizes
      {1, 2, 3, 3, 2, 2, 2, 1, 1, 3, 3, 3, 3, 1, 1},      // windows entirely in the padding
      {3, 2, 10, 10, 3, 2, 2, 3, 3, 0, 0, 0, 0, 1, 1},    // stride > kernel: untouched inputs
      {3, 3, 8, 8, 4, 3, 3, 2, 2, 1, 0, 1, 0, 2, 2},      // dilation 2 with stride 2
      {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1},      // 1x1 image
      {8, 16, 16, 16, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1},  // large: parallel batch and weight blocks
      {6, 32, 12, 12, 24, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1},  // large pointwise
      {5, 3, 20, 17, 8, 5, 5, 2, 2, 2, 2, 2, 2, 1, 1},    // large strided
      {40, 6, 14, 14, 16, 5, 5, 1, 1, 0, 0, 0, 0, 1, 1},  // many images per batched GEMM, several GEMMs
      {24, 4, 30, 30, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1},   // batched GEMMs with padding
      {5, 1, 32, 32, 6, 5, 5, 1, 1, 0, 0, 0, 0, 1, 1},    // LeNet5's first layer (shifted taps, one channel)
      {2, 32, 9, 11, 10, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1},   // shifted taps: k over one depth block, 8 + 2 rows
      {2, 2, 6, 70, 3, 3, 4, 1, 1, 0, 0, 0, 0, 1, 1},     // shifted taps: several panels and a partial one
      {3, 2, 4, 3, 2, 4, 3, 1, 1, 0, 0, 0, 0, 1, 1},      // shifted taps: one output per image
      {3, 3, 8, 9, 20, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1},     // direct weight gradient: two channel vectors
      {2, 3, 5, 6, 12, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1},     // direct weight gradient: fewer outputs than lanes
  };
  return cases;
}

int64_t x_size(const cpu::Conv2dGeometry& g) { return g.n * g.c_in * g.h * g.w; }
int64_t w_size(const cpu::Conv2dGeometry& g) { return g.c_out * g.c_in * g.kh * g.kw; }
int64_t y_size(const cpu::Conv2dGeometry& g) { return g.n * g.c_out * g.out_h * g.out_w; }

// Visits every (x index, w index, y index) triple that the convolution multiplies together.
template <class F> void for_each_conv_term(const cpu::Conv2dGeometry& g, F&& f) {
  for (int64_t b = 0; b < g.n; ++b)
    for (int64_t co = 0; co < g.c_out; ++co)
      for (int64_t oh = 0; oh < g.out_h; ++oh)
        for (int64_t ow = 0; ow < g.out_w; ++ow)
          for (int64_t ci = 0; ci < g.c_in; ++ci)
            for (int64_t ki = 0; ki < g.kh; ++ki)
              for (int64_t kj = 0; kj < g.kw; ++kj) {
                const int64_t ih = oh * g.stride_h - g.pad_top + ki * g.dil_h;
                const int64_t iw = ow * g.stride_w - g.pad_left + kj * g.dil_w;
                if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;
                const int64_t xi = ((b * g.c_in + ci) * g.h + ih) * g.w + iw;
                const int64_t wi = ((co * g.c_in + ci) * g.kh + ki) * g.kw + kj;
                const int64_t yi = ((b * g.c_out + co) * g.out_h + oh) * g.out_w + ow;
                f(static_cast<std::size_t>(xi), static_cast<std::size_t>(wi), static_cast<std::size_t>(yi));
              }
}

Vec naive_conv_forward(const cpu::Conv2dGeometry& g, const Vec& x, const Vec& w) {
  Vec y(static_cast<std::size_t>(y_size(g)), 0.0);
  for_each_conv_term(g, [&](auto xi, auto wi, auto yi) { y[yi] += x[xi] * w[wi]; });
  return y;
}

Vec naive_conv_backward_input(const cpu::Conv2dGeometry& g, const Vec& gy, const Vec& w) {
  Vec gx(static_cast<std::size_t>(x_size(g)), 0.0);
  for_each_conv_term(g, [&](auto xi, auto wi, auto yi) { gx[xi] += gy[yi] * w[wi]; });
  return gx;
}

Vec naive_conv_backward_weight(const cpu::Conv2dGeometry& g, const Vec& x, const Vec& gy) {
  Vec gw(static_cast<std::size_t>(w_size(g)), 0.0);
  for_each_conv_term(g, [&](auto xi, auto wi, auto yi) { gw[wi] += x[xi] * gy[yi]; });
  return gw;
}

// ---------------------------------------------------------------- pooling

struct PoolCase {
  int64_t n, c, h, w, kh, kw, sh, sw, pt, pb, pl, pr;
};

cpu::Pool2dGeometry pool_geometry(const PoolCase& c) {
  const int64_t out_h = (c.h + c.pt + c.pb - c.kh) / c.sh + 1;
  const int64_t out_w = (c.w + c.pl + c.pr - c.kw) / c.sw + 1;
  return {c.n, c.c, c.h, c.w, c.kh, c.kw, c.sh, c.sw, c.pt, c.pl, out_h, out_w};
}

const std::vector<PoolCase>& pool_cases() {
  //                                  n  c   h   w kh kw sh sw pt pb pl pr
  static const std::vector<PoolCase> cases = {
      {1, 1, 4, 4, 2, 2, 2, 2, 0, 0, 0, 0},     // classic 2x2/2
      {3, 3, 7, 7, 3, 3, 2, 2, 1, 1, 1, 1},     // overlapping 3x3/2 with padding
      {1, 3, 5, 6, 3, 3, 1, 1, 1, 1, 1, 1},     // stride 1, same-size output
      {3, 1, 9, 7, 2, 3, 2, 1, 0, 1, 1, 0},     // asymmetric
      {3, 2, 5, 5, 1, 1, 2, 2, 0, 0, 0, 0},     // 1x1 kernel, stride 2
      {1, 2, 7, 7, 2, 2, 2, 2, 0, 1, 0, 1},     // ceil-mode-like extra bottom/right pad
      {1, 1, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1},     // window bigger than most of the image
      {3, 3, 8, 5, 4, 3, 3, 2, 2, 1, 1, 0},     // kernel > stride, odd sizes
      {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0},     // 1x1 image
      {4, 16, 32, 32, 2, 2, 2, 2, 0, 0, 0, 0},  // large: parallel over planes
      {2, 8, 33, 31, 3, 3, 2, 2, 1, 1, 1, 1},   // large, odd, padded
      {2, 3, 6, 40, 3, 3, 1, 1, 1, 1, 1, 1},    // stride 1, wide: SIMD interior with clipped rows
      {1, 2, 5, 37, 2, 3, 1, 1, 1, 0, 0, 2},    // stride 1, wide, asymmetric padding
      {1, 2, 4, 33, 2, 3, 1, 1, 0, 1, 0, 2},    // stride 1: interior ends just short of a SIMD block
      {2, 3, 28, 28, 2, 2, 2, 2, 0, 0, 0, 0},   // LeNet5's first pooling: window starts in batches and a tail
      {2, 4, 10, 10, 2, 2, 2, 2, 0, 0, 0, 0},   // LeNet5's second: rows shorter than a batch
      {1, 2, 5, 45, 3, 3, 2, 2, 1, 1, 1, 1},    // stride 2, wide, padded: batched interior between edges
      {1, 2, 4, 50, 2, 4, 1, 3, 0, 0, 2, 1},    // kernel > stride along w, padded
      {2, 3, 7, 9, 2, 2, 2, 2, 0, 0, 0, 0},     // 2x2/2 on odd sizes: the last row and column unread
      {1, 3, 4, 70, 2, 2, 2, 2, 0, 0, 0, 0},    // 2x2/2, rows of several vectors and a partial one
      {3, 2, 6, 2, 2, 2, 2, 2, 0, 0, 0, 0},     // 2x2/2, one window per row: vectors span many rows
      {2, 2, 5, 41, 2, 2, 2, 2, 0, 0, 0, 0},  // 2x2/2, wide rows, odd height and width: an input row and column unread
      {2, 3, 4, 18, 2, 2, 2, 2, 0, 0, 0, 0},  // 2x2/2, 9 windows a row: one more than half a float vector
  };
  return cases;
}

int64_t pool_in_size(const cpu::Pool2dGeometry& g) { return g.n * g.c * g.h * g.w; }
int64_t pool_out_size(const cpu::Pool2dGeometry& g) { return g.n * g.c * g.out_h * g.out_w; }

// Flat input index of the first NaN of each window in row-major order, else of its first
// maximum (padding never wins), -1 if empty.
template <class V> std::vector<int64_t> naive_argmax(const cpu::Pool2dGeometry& g, const V& x) {
  std::vector<int64_t> arg(static_cast<std::size_t>(pool_out_size(g)), -1);
  for (int64_t p = 0; p < g.n * g.c; ++p)
    for (int64_t oh = 0; oh < g.out_h; ++oh)
      for (int64_t ow = 0; ow < g.out_w; ++ow) {
        int64_t best = -1;
        for (int64_t ki = 0; ki < g.kh; ++ki)
          for (int64_t kj = 0; kj < g.kw; ++kj) {
            const int64_t ih = oh * g.stride_h - g.pad_top + ki;
            const int64_t iw = ow * g.stride_w - g.pad_left + kj;
            if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;
            const int64_t xi = (p * g.h + ih) * g.w + iw;
            const auto v = x[static_cast<std::size_t>(xi)];
            const auto b = best < 0 ? v : x[static_cast<std::size_t>(best)];
            if (best < 0 || (!std::isnan(b) && (std::isnan(v) || v > b))) best = xi;
          }
        arg[static_cast<std::size_t>((p * g.out_h + oh) * g.out_w + ow)] = best;
      }
  return arg;
}

// Visits every (input index, output index, weight) of average pooling.
template <class F> void for_each_avg_term(const cpu::Pool2dGeometry& g, F&& f) {
  for (int64_t p = 0; p < g.n * g.c; ++p)
    for (int64_t oh = 0; oh < g.out_h; ++oh)
      for (int64_t ow = 0; ow < g.out_w; ++ow) {
        std::vector<int64_t> members;
        for (int64_t ki = 0; ki < g.kh; ++ki)
          for (int64_t kj = 0; kj < g.kw; ++kj) {
            const int64_t ih = oh * g.stride_h - g.pad_top + ki;
            const int64_t iw = ow * g.stride_w - g.pad_left + kj;
            if (ih >= 0 && ih < g.h && iw >= 0 && iw < g.w) members.push_back((p * g.h + ih) * g.w + iw);
          }
        const int64_t yi = (p * g.out_h + oh) * g.out_w + ow;
        for (int64_t xi : members)
          f(static_cast<std::size_t>(xi), static_cast<std::size_t>(yi), 1.0 / static_cast<double>(members.size()));
      }
}

// ---------------------------------------------------------------- bilinear resize

struct ResizeCase {
  int64_t n, c, h, w, out_h, out_w;
};

const std::vector<ResizeCase>& resize_cases() {
  static const std::vector<ResizeCase> cases = {
      {1, 1, 2, 2, 4, 4}, {3, 3, 5, 7, 9, 4},  {1, 2, 4, 4, 2, 2}, {3, 1, 7, 5, 7, 5},     {1, 1, 1, 1, 3, 3},
      {1, 3, 1, 5, 4, 1}, {2, 2, 6, 9, 13, 3}, {3, 2, 8, 8, 3, 5}, {4, 8, 32, 32, 48, 20},
  };
  return cases;
}

// Visits every (input index, output index, weight), written from the PyTorch formulas.
template <class F> void for_each_resize_term(const ResizeCase& r, bool align_corners, F&& f) {
  auto axis = [&](int64_t in, int64_t out, int64_t d, int64_t& i0, int64_t& i1, double& lambda) {
    double src = 0;
    if (align_corners) {
      src = out > 1 ? static_cast<double>(d) * static_cast<double>(in - 1) / static_cast<double>(out - 1) : 0.0;
    } else {
      src = (static_cast<double>(d) + 0.5) * static_cast<double>(in) / static_cast<double>(out) - 0.5;
      src = std::max(src, 0.0);
    }
    i0 = static_cast<int64_t>(std::floor(src));
    i0 = std::min(i0, in - 1);
    i1 = i0 < in - 1 ? i0 + 1 : i0;
    lambda = std::min(src - static_cast<double>(i0), 1.0);
  };
  for (int64_t p = 0; p < r.n * r.c; ++p)
    for (int64_t oh = 0; oh < r.out_h; ++oh)
      for (int64_t ow = 0; ow < r.out_w; ++ow) {
        int64_t h0, h1, w0, w1;
        double lh, lw;
        axis(r.h, r.out_h, oh, h0, h1, lh);
        axis(r.w, r.out_w, ow, w0, w1, lw);
        const auto yi = static_cast<std::size_t>((p * r.out_h + oh) * r.out_w + ow);
        auto xi = [&](int64_t ih, int64_t iw) { return static_cast<std::size_t>((p * r.h + ih) * r.w + iw); };
        f(xi(h0, w0), yi, (1 - lh) * (1 - lw));
        f(xi(h0, w1), yi, (1 - lh) * lw);
        f(xi(h1, w0), yi, lh * (1 - lw));
        f(xi(h1, w1), yi, lh * lw);
      }
}

}  // namespace

// ================================================================ convolution tests

TEST_CASE_TEMPLATE("conv2d kernels match direct loops", T, float, double) {
  uint32_t seed = 1;
  for (const ConvCase& cc : conv_cases()) {
    const cpu::Conv2dGeometry g = conv_geometry(cc);
    CAPTURE(cc.n);
    CAPTURE(cc.c_in);
    CAPTURE(cc.h);
    CAPTURE(cc.w);
    CAPTURE(cc.c_out);
    CAPTURE(cc.kh);
    CAPTURE(cc.kw);
    CAPTURE(cc.sh);
    CAPTURE(cc.sw);
    CAPTURE(cc.pt);
    CAPTURE(cc.pl);
    CAPTURE(cc.dh);
    CAPTURE(cc.dw);
    REQUIRE(g.out_h > 0);
    REQUIRE(g.out_w > 0);

    const Vec x = through<T>(random_vec(x_size(g), seed++));
    const Vec w = through<T>(random_vec(w_size(g), seed++));
    const Vec gy = through<T>(random_vec(y_size(g), seed++));
    const auto xt = cast_vec<T>(x), wt = cast_vec<T>(w), gyt = cast_vec<T>(gy);

    // Outputs start as NaN: every kernel must overwrite, never accumulate into, its output.
    auto y = nan_vec<T>(y_size(g));
    cpu::conv2d_forward(g, xt.data(), wt.data(), y.data());
    check_close(y, naive_conv_forward(g, x, w), naive_conv_forward(g, abs_vec(x), abs_vec(w)), "forward");

    auto gx = nan_vec<T>(x_size(g));
    cpu::conv2d_backward_input(g, gyt.data(), wt.data(), gx.data());
    check_close(gx, naive_conv_backward_input(g, gy, w), naive_conv_backward_input(g, abs_vec(gy), abs_vec(w)),
                "backward_input");

    auto gw = nan_vec<T>(w_size(g));
    cpu::conv2d_backward_weight(g, xt.data(), gyt.data(), gw.data());
    check_close(gw, naive_conv_backward_weight(g, x, gy), naive_conv_backward_weight(g, abs_vec(x), abs_vec(gy)),
                "backward_weight");

    // The batch reduction is deterministic: a second run agrees bit for bit.
    auto gw2 = nan_vec<T>(w_size(g));
    cpu::conv2d_backward_weight(g, xt.data(), gyt.data(), gw2.data());
    CHECK(std::equal(gw.begin(), gw.end(), gw2.begin()));
  }
}

TEST_CASE_TEMPLATE("unpadded stride-1 conv2d kernels add an infinity only where it is read", T, float, double) {
  // Positive values and one +inf in x and in gy: every result the infinity reaches is +inf,
  // every other stays finite. A kernel that multiplies a zeroed lane by an element outside the
  // outputs (or adds one in) would make a NaN or a stray infinity. (With padding, the column
  // matrix's zeros meet the infinity in the products, as in other libraries' im2col.)
  uint32_t seed = 500;
  const double inf = std::numeric_limits<double>::infinity();
  for (const ConvCase& cc : conv_cases()) {
    const cpu::Conv2dGeometry g = conv_geometry(cc);
    if (!cpu::detail::conv_is_shifted(g)) continue;
    INFO("x [", cc.n, ", ", cc.c_in, ", ", cc.h, ", ", cc.w, "], w [", cc.c_out, ", ", cc.c_in, ", ", cc.kh, ", ",
         cc.kw, "]");
    Vec x = through<T>(random_vec(x_size(g), seed++, 0.5, 1.5));
    Vec w = through<T>(random_vec(w_size(g), seed++, 0.5, 1.5));
    Vec gy = through<T>(random_vec(y_size(g), seed++, 0.5, 1.5));
    x[x.size() / 2] = inf;
    gy[gy.size() / 2] = inf;
    const auto xt = cast_vec<T>(x), wt = cast_vec<T>(w), gyt = cast_vec<T>(gy);
    auto same_class = [](const std::vector<T>& got, const Vec& want, const std::string& what) {
      int64_t bad = 0, infinite = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        infinite += std::isinf(want[i]) ? 1 : 0;
        if (std::isinf(want[i]) != std::isinf(static_cast<double>(got[i])) || std::isnan(static_cast<double>(got[i])))
          ++bad;
      }
      CAPTURE(what);
      CHECK(infinite > 0);
      CHECK(bad == 0);
    };
    auto y = nan_vec<T>(y_size(g));
    cpu::conv2d_forward(g, xt.data(), wt.data(), y.data());
    same_class(y, naive_conv_forward(g, x, w), "forward");
    auto gx = nan_vec<T>(x_size(g));
    cpu::conv2d_backward_input(g, gyt.data(), wt.data(), gx.data());
    same_class(gx, naive_conv_backward_input(g, gy, w), "backward_input");
    auto gw = nan_vec<T>(w_size(g));
    cpu::conv2d_backward_weight(g, xt.data(), gyt.data(), gw.data());
    same_class(gw, naive_conv_backward_weight(g, x, gy), "backward_weight");
  }
}

TEST_CASE("conv2d backward kernels are adjoints of forward") {
  uint32_t seed = 1000;
  for (const ConvCase& cc : conv_cases()) {
    const cpu::Conv2dGeometry g = conv_geometry(cc);
    CAPTURE(cc.n);
    CAPTURE(cc.c_in);
    CAPTURE(cc.h);
    CAPTURE(cc.kh);
    CAPTURE(cc.sh);
    CAPTURE(cc.pt);
    CAPTURE(cc.dh);
    const Vec x = random_vec(x_size(g), seed++);
    const Vec w = random_vec(w_size(g), seed++);
    const Vec gy = random_vec(y_size(g), seed++);

    Vec y(static_cast<std::size_t>(y_size(g)));
    Vec gx(static_cast<std::size_t>(x_size(g)));
    Vec gw(static_cast<std::size_t>(w_size(g)));
    cpu::conv2d_forward(g, x.data(), w.data(), y.data());
    cpu::conv2d_backward_input(g, gy.data(), w.data(), gx.data());
    cpu::conv2d_backward_weight(g, x.data(), gy.data(), gw.data());

    // <conv(x, w), gy> is one trilinear sum; each backward kernel must reproduce it.
    double scale = 0;
    for_each_conv_term(g, [&](auto xi, auto wi, auto yi) { scale += std::abs(x[xi] * w[wi] * gy[yi]); });
    const double lhs = dot(y, gy);
    check_adjoint(lhs, dot(x, gx), scale + 1, "backward_input vs forward in x");
    check_adjoint(lhs, dot(w, gw), scale + 1, "backward_weight vs forward in w");
  }
}

TEST_CASE("im2col and col2im are adjoint, and col2im accumulates") {
  uint32_t seed = 2000;
  for (const ConvCase& cc : conv_cases()) {
    cpu::Conv2dGeometry g = conv_geometry(cc);
    CAPTURE(cc.h);
    CAPTURE(cc.kh);
    CAPTURE(cc.sh);
    CAPTURE(cc.pt);
    CAPTURE(cc.dh);
    const int64_t img = g.c_in * g.h * g.w;
    const int64_t col_size = g.c_in * g.kh * g.kw * g.out_h * g.out_w;
    const Vec x = random_vec(img, seed++);
    const Vec c = random_vec(col_size, seed++);
    const Vec base = random_vec(img, seed++);

    Vec col(static_cast<std::size_t>(col_size), std::numeric_limits<double>::quiet_NaN());
    cpu::im2col(g, x.data(), col.data());
    Vec folded = base;
    cpu::col2im(g, c.data(), folded.data());
    Vec delta(folded.size());
    for (std::size_t i = 0; i < delta.size(); ++i) delta[i] = folded[i] - base[i];

    double scale = 1;
    for (std::size_t i = 0; i < c.size(); ++i) scale += std::abs(c[i]);
    check_adjoint(dot(col, c), dot(x, delta), scale, "col2im vs im2col");

    // im2col of one image equals the direct-loop unfolding (zero in the padding).
    g.n = 1;
    Vec expect(static_cast<std::size_t>(col_size), 0.0);
    const int64_t ohw = g.out_h * g.out_w;
    for (int64_t ci = 0; ci < g.c_in; ++ci)
      for (int64_t ki = 0; ki < g.kh; ++ki)
        for (int64_t kj = 0; kj < g.kw; ++kj)
          for (int64_t oh = 0; oh < g.out_h; ++oh)
            for (int64_t ow = 0; ow < g.out_w; ++ow) {
              const int64_t ih = oh * g.stride_h - g.pad_top + ki * g.dil_h;
              const int64_t iw = ow * g.stride_w - g.pad_left + kj * g.dil_w;
              if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;
              expect[static_cast<std::size_t>(((ci * g.kh + ki) * g.kw + kj) * ohw + oh * g.out_w + ow)] =
                  x[static_cast<std::size_t>((ci * g.h + ih) * g.w + iw)];
            }
    CHECK(col == expect);
  }
}

// ================================================================ pooling tests

// Max pooling as the op runs it: each window's argmax, then a take (the forward, or any
// input-shaped v read at the argmax) or a put (the gradient).
template <class T> std::vector<int32_t> pool_argmax(const cpu::Pool2dGeometry& g, const T* x) {
  std::vector<int32_t> idx(static_cast<std::size_t>(pool_out_size(g)));
  cpu::max_pool2d_argmax(g, x, idx.data());
  return idx;
}
template <class T> void max_pool_select(const cpu::Pool2dGeometry& g, const T* x, const T* v, T* out) {
  cpu::max_pool2d_take(g, pool_argmax(g, x).data(), v, out);
}
template <class T> void max_pool_forward(const cpu::Pool2dGeometry& g, const T* x, T* y) {
  max_pool_select(g, x, x, y);
}
template <class T> void max_pool_scatter(const cpu::Pool2dGeometry& g, const T* x, const T* gy, T* gx) {
  cpu::max_pool2d_put(g, pool_argmax(g, x).data(), gy, gx);
}

TEST_CASE_TEMPLATE("pool2d kernels match direct loops", T, float, double) {
  uint32_t seed = 3000;
  for (const PoolCase& pc : pool_cases()) {
    const cpu::Pool2dGeometry g = pool_geometry(pc);
    CAPTURE(pc.n);
    CAPTURE(pc.c);
    CAPTURE(pc.h);
    CAPTURE(pc.w);
    CAPTURE(pc.kh);
    CAPTURE(pc.kw);
    CAPTURE(pc.sh);
    CAPTURE(pc.sw);
    CAPTURE(pc.pt);
    CAPTURE(pc.pl);
    REQUIRE(g.out_h > 0);
    REQUIRE(g.out_w > 0);
    const auto in_n = static_cast<std::size_t>(pool_in_size(g));
    const auto out_n = static_cast<std::size_t>(pool_out_size(g));

    // Continuous values, many ties, and all-negative values (a padded zero must never win).
    for (int pattern = 0; pattern < 3; ++pattern) {
      CAPTURE(pattern);
      const Vec x = pattern == 0   ? through<T>(random_vec(pool_in_size(g), seed++))
                    : pattern == 1 ? random_ints(pool_in_size(g), seed++, -2, 2)
                                   : random_ints(pool_in_size(g), seed++, -5, -1);
      const Vec v = through<T>(random_vec(pool_in_size(g), seed++));
      const Vec gy = through<T>(random_vec(pool_out_size(g), seed++));
      const auto xt = cast_vec<T>(x), vt = cast_vec<T>(v), gyt = cast_vec<T>(gy);
      const auto arg = naive_argmax(g, x);

      Vec y_ref(out_n, 0.0), sel_ref(out_n, 0.0), gx_ref(in_n, 0.0), gx_scale(in_n, 0.0);
      for (std::size_t o = 0; o < out_n; ++o) {
        if (arg[o] < 0) continue;
        const auto a = static_cast<std::size_t>(arg[o]);
        y_ref[o] = x[a];
        sel_ref[o] = v[a];
        gx_ref[a] += gy[o];
        gx_scale[a] += std::abs(gy[o]);
      }

      auto y = nan_vec<T>(pool_out_size(g));
      max_pool_forward(g, xt.data(), y.data());
      CHECK(to_double(y) == y_ref);

      // The argmax pass that also writes the maxima (what a graph runs for the pair).
      std::vector<int32_t> idx_with(out_n, -2);
      auto y_with = nan_vec<T>(pool_out_size(g));
      cpu::max_pool2d_argmax(g, xt.data(), idx_with.data(), y_with.data());
      CHECK(idx_with == pool_argmax(g, xt.data()));
      CHECK(to_double(y_with) == y_ref);
      // And with the windows whose maximum is not above 0 dropped (-1).
      std::vector<int32_t> idx_drop(out_n, -2);
      cpu::max_pool2d_argmax(g, xt.data(), idx_drop.data(), y_with.data(), true);
      for (std::size_t o = 0; o < out_n; ++o) {
        CAPTURE(o);
        CHECK(idx_drop[o] == (arg[o] >= 0 && x[static_cast<std::size_t>(arg[o])] > 0 ? idx_with[o] : -1));
      }

      auto sel = nan_vec<T>(pool_out_size(g));
      max_pool_select(g, xt.data(), vt.data(), sel.data());
      CHECK(to_double(sel) == sel_ref);

      auto gx = nan_vec<T>(pool_in_size(g));
      max_pool_scatter(g, xt.data(), gyt.data(), gx.data());
      check_close(gx, gx_ref, gx_scale, "max_pool2d_put");

      Vec avg_ref(out_n, 0.0), avg_scale(out_n, 0.0), avg_back_ref(in_n, 0.0), avg_back_scale(in_n, 0.0);
      for_each_avg_term(g, [&](auto xi, auto yi, double wgt) {
        avg_ref[yi] += wgt * x[xi];
        avg_scale[yi] += wgt * std::abs(x[xi]);
        avg_back_ref[xi] += wgt * gy[yi];
        avg_back_scale[xi] += wgt * std::abs(gy[yi]);
      });
      auto ya = nan_vec<T>(pool_out_size(g));
      cpu::avg_pool2d_forward(g, xt.data(), ya.data());
      check_close(ya, avg_ref, avg_scale, "avg_pool2d_forward");

      auto gxa = nan_vec<T>(pool_in_size(g));
      cpu::avg_pool2d_backward(g, gyt.data(), gxa.data());
      check_close(gxa, avg_back_ref, avg_back_scale, "avg_pool2d_backward");
    }
  }
}

TEST_CASE_TEMPLATE("max_pool2d propagates the first NaN of a window", T, float, double) {
  // Wide rows: the batched window starts, the scalar tail and the padded edges all meet NaNs.
  for (const PoolCase& pc :
       {PoolCase{1, 2, 6, 37, 2, 2, 2, 2, 0, 0, 0, 0}, PoolCase{1, 1, 5, 40, 3, 3, 1, 1, 1, 1, 1, 1}}) {
    const cpu::Pool2dGeometry g = pool_geometry(pc);
    CAPTURE(pc.w);
    std::vector<T> x = cast_vec<T>(random_vec(pool_in_size(g), 77));
    for (std::size_t i = 3; i < x.size(); i += 7) x[i] = std::numeric_limits<T>::quiet_NaN();
    const std::vector<int64_t> arg = naive_argmax(g, x);
    std::vector<T> y(static_cast<std::size_t>(pool_out_size(g)));
    std::vector<T> gy(y.size()), gx(x.size());
    std::iota(gy.begin(), gy.end(), T(1));
    max_pool_forward(g, x.data(), y.data());
    max_pool_scatter(g, x.data(), gy.data(), gx.data());
    std::vector<int32_t> idx_with(y.size());
    std::vector<T> y_with(y.size());
    cpu::max_pool2d_argmax(g, x.data(), idx_with.data(), y_with.data());
    std::vector<int32_t> idx_drop(y.size());
    cpu::max_pool2d_argmax(g, x.data(), idx_drop.data(), y_with.data(), true);
    std::vector<T> gx_ref(x.size(), T(0));
    for (std::size_t o = 0; o < y.size(); ++o) {
      const T want = x[static_cast<std::size_t>(arg[o])];
      CAPTURE(o);
      CHECK(std::isnan(y[o]) == std::isnan(want));
      if (!std::isnan(want)) CHECK(y[o] == want);
      CHECK(idx_with[o] == static_cast<int32_t>(arg[o] % (g.h * g.w)));
      CHECK(idx_drop[o] == (want > T(0) ? idx_with[o] : -1));  // a NaN maximum is dropped too
      CHECK(std::isnan(y_with[o]) == std::isnan(want));
      if (!std::isnan(want)) CHECK(y_with[o] == want);
      gx_ref[static_cast<std::size_t>(arg[o])] += gy[o];
    }
    CHECK(gx == gx_ref);
  }
}

TEST_CASE("pool2d backward kernels are adjoints") {
  uint32_t seed = 4000;
  for (const PoolCase& pc : pool_cases()) {
    const cpu::Pool2dGeometry g = pool_geometry(pc);
    CAPTURE(pc.h);
    CAPTURE(pc.kh);
    CAPTURE(pc.sh);
    CAPTURE(pc.pt);
    for (int pattern = 0; pattern < 2; ++pattern) {
      const Vec x = pattern == 0 ? random_vec(pool_in_size(g), seed++) : random_ints(pool_in_size(g), seed++, -1, 1);
      const Vec v = random_vec(pool_in_size(g), seed++);
      const Vec u = random_vec(pool_out_size(g), seed++);

      Vec sel(static_cast<std::size_t>(pool_out_size(g)));
      Vec sc(static_cast<std::size_t>(pool_in_size(g)));
      max_pool_select(g, x.data(), v.data(), sel.data());
      max_pool_scatter(g, x.data(), u.data(), sc.data());
      check_adjoint(dot(sel, u), dot(v, sc), static_cast<double>(u.size()) + 1, "put vs take");

      Vec ya(static_cast<std::size_t>(pool_out_size(g)));
      Vec gxa(static_cast<std::size_t>(pool_in_size(g)));
      cpu::avg_pool2d_forward(g, x.data(), ya.data());
      cpu::avg_pool2d_backward(g, u.data(), gxa.data());
      check_adjoint(dot(ya, u), dot(x, gxa), static_cast<double>(u.size()) + 1, "avg backward vs forward");
    }
  }
}

TEST_CASE("max_pool2d tie-breaking, padding and NaN") {
  // One 3x3 plane, 2x2 windows, stride 1, padding 1 on every side: 4x4 outputs.
  const cpu::Pool2dGeometry g{1, 1, 3, 3, 2, 2, 1, 1, 1, 1, 4, 4};
  const std::vector<double> x = {-3, -1, -1,  //
                                 -1, -2, -4,  //
                                 -5, -6, -7};
  std::vector<double> y(16);
  max_pool_forward(g, x.data(), y.data());
  // Corner windows hold one real element each; padding (which would be 0) never wins.
  CHECK(y[0] == -3);
  CHECK(y[3] == -1);
  CHECK(y[12] == -5);
  CHECK(y[15] == -7);

  // Window (1, 1) covers x[0..1][0..1] = {-3, -1, -1, -2}: the first -1 (index 1) wins the tie.
  std::vector<double> gy(16, 0.0);
  gy[5] = 1;
  std::vector<double> gx(9, 42.0);
  max_pool_scatter(g, x.data(), gy.data(), gx.data());
  CHECK(gx == std::vector<double>{0, 1, 0, 0, 0, 0, 0, 0, 0});

  // A NaN propagates through its windows.
  std::vector<float> xf = {1, 2, 3, 4, std::numeric_limits<float>::quiet_NaN(), 5, 6, 7, 8};
  std::vector<float> yf(16);
  max_pool_forward(g, xf.data(), yf.data());
  CHECK(std::isnan(yf[5]));
  CHECK(std::isnan(yf[10]));
  CHECK(yf[0] == 1);
}

TEST_CASE_TEMPLATE("max_pool2d argmax with NaNs is the first NaN in row-major order", T, float, double) {
  // A wide plane so that the SIMD path sees the NaNs too; one 3x3 window per 3 columns.
  const int64_t w = 48;
  const cpu::Pool2dGeometry g{1, 1, 3, w, 3, 3, 3, 3, 0, 0, 1, w / 3};
  const T nan = std::numeric_limits<T>::quiet_NaN();
  std::vector<T> x(static_cast<std::size_t>(3 * w));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<T>(i % 7);
  // Window 0: NaNs at (1, 0) and (0, 2); (0, 2) comes first in row-major order.
  x[static_cast<std::size_t>(1 * w + 0)] = nan;
  x[static_cast<std::size_t>(0 * w + 2)] = nan;
  // Window 15 (columns 45..47): NaNs at (2, 45) and (1, 46); (1, 46) comes first.
  x[static_cast<std::size_t>(2 * w + 45)] = nan;
  x[static_cast<std::size_t>(1 * w + 46)] = nan;

  std::vector<T> y(static_cast<std::size_t>(w / 3));
  max_pool_forward(g, x.data(), y.data());
  CHECK(std::isnan(y[0]));
  CHECK(std::isnan(y[15]));
  CHECK(y[1] == 5);  // columns 3..5: {3, 4, 5}, {2, 3, 4}, {1, 2, 3}

  std::vector<T> gy(y.size(), T(0));
  gy[0] = 1;
  gy[15] = 2;
  std::vector<T> gx(x.size(), T(7));
  max_pool_scatter(g, x.data(), gy.data(), gx.data());
  CHECK(gx[static_cast<std::size_t>(0 * w + 2)] == 1);
  CHECK(gx[static_cast<std::size_t>(1 * w + 46)] == 2);
  CHECK(std::accumulate(gx.begin(), gx.end(), T(0)) == 3);
}

TEST_CASE("avg_pool2d divides by the in-bounds count") {
  const cpu::Pool2dGeometry g{1, 1, 2, 2, 2, 2, 1, 1, 1, 1, 3, 3};
  const std::vector<double> x = {1, 2, 3, 4};
  std::vector<double> y(9);
  cpu::avg_pool2d_forward(g, x.data(), y.data());
  CHECK(y == std::vector<double>{1, 1.5, 2, 2, 2.5, 3, 3, 3.5, 4});
}

// ================================================================ resize tests

TEST_CASE_TEMPLATE("resize_bilinear matches direct loops", T, float, double) {
  uint32_t seed = 5000;
  for (const ResizeCase& rc : resize_cases()) {
    for (bool align : {false, true}) {
      CAPTURE(rc.h);
      CAPTURE(rc.w);
      CAPTURE(rc.out_h);
      CAPTURE(rc.out_w);
      CAPTURE(align);
      const int64_t in_n = rc.n * rc.c * rc.h * rc.w;
      const int64_t out_n = rc.n * rc.c * rc.out_h * rc.out_w;
      const Vec x = through<T>(random_vec(in_n, seed++));
      const Vec gy = through<T>(random_vec(out_n, seed++));
      const auto xt = cast_vec<T>(x), gyt = cast_vec<T>(gy);

      Vec y_ref(static_cast<std::size_t>(out_n), 0.0), y_scale(static_cast<std::size_t>(out_n), 0.0);
      Vec gx_ref(static_cast<std::size_t>(in_n), 0.0), gx_scale(static_cast<std::size_t>(in_n), 0.0);
      // Source coordinates up to max(h, w) are rounded, so the weights carry an absolute
      // error of a few eps * max(h, w); the scale allows for it.
      const double coord = static_cast<double>(std::max(rc.h, rc.w)) / 16;
      for_each_resize_term(rc, align, [&](auto xi, auto yi, double wgt) {
        y_ref[yi] += wgt * x[xi];
        y_scale[yi] += (std::abs(wgt) + coord) * std::abs(x[xi]);
        gx_ref[xi] += wgt * gy[yi];
        gx_scale[xi] += (std::abs(wgt) + coord) * std::abs(gy[yi]);
      });

      auto y = nan_vec<T>(out_n);
      cpu::resize_bilinear_forward(rc.n, rc.c, rc.h, rc.w, rc.out_h, rc.out_w, align, xt.data(), y.data());
      check_close(y, y_ref, y_scale, "resize forward");

      auto gx = nan_vec<T>(in_n);
      cpu::resize_bilinear_backward(rc.n, rc.c, rc.h, rc.w, rc.out_h, rc.out_w, align, gyt.data(), gx.data());
      check_close(gx, gx_ref, gx_scale, "resize backward");
    }
  }
}

TEST_CASE("resize_bilinear backward is the adjoint of forward") {
  uint32_t seed = 6000;
  for (const ResizeCase& rc : resize_cases()) {
    for (bool align : {false, true}) {
      CAPTURE(rc.h);
      CAPTURE(rc.out_h);
      CAPTURE(align);
      const int64_t in_n = rc.n * rc.c * rc.h * rc.w;
      const int64_t out_n = rc.n * rc.c * rc.out_h * rc.out_w;
      const Vec x = random_vec(in_n, seed++);
      const Vec u = random_vec(out_n, seed++);
      Vec y(static_cast<std::size_t>(out_n));
      Vec gx(static_cast<std::size_t>(in_n));
      cpu::resize_bilinear_forward(rc.n, rc.c, rc.h, rc.w, rc.out_h, rc.out_w, align, x.data(), y.data());
      cpu::resize_bilinear_backward(rc.n, rc.c, rc.h, rc.w, rc.out_h, rc.out_w, align, u.data(), gx.data());
      check_adjoint(dot(y, u), dot(x, gx), static_cast<double>(out_n) + 1, "resize backward vs forward");
    }
  }
}

TEST_CASE("resize_bilinear known values (as PyTorch interpolate)") {
  const std::vector<double> x = {1, 2, 3, 4};
  std::vector<double> y(16);
  cpu::resize_bilinear_forward<double>(1, 1, 2, 2, 4, 4, false, x.data(), y.data());
  CHECK(y == std::vector<double>{1, 1.25, 1.75, 2, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3, 3.25, 3.75, 4});

  std::vector<double> z(9);
  cpu::resize_bilinear_forward<double>(1, 1, 2, 2, 3, 3, true, x.data(), z.data());
  CHECK(z == std::vector<double>{1, 1.5, 2, 2, 2.5, 3, 3, 3.5, 4});

  // Downsampling 4 -> 2 without align_corners samples halfway between pixel pairs.
  const std::vector<double> row = {0, 1, 2, 3};
  std::vector<double> half(2);
  cpu::resize_bilinear_forward<double>(1, 1, 1, 4, 1, 2, false, row.data(), half.data());
  CHECK(half == std::vector<double>{0.5, 2.5});
}

// ================================================================ gradients through max pooling

// A convolution whose output is max pooled: its pool's geometry (windows kp x kp, stride sp),
// and the argmax and pooled gradient the sparse kernels read instead of the put's output.
template <class T> struct PooledCase {
  cpu::Conv2dGeometry conv;
  cpu::Pool2dGeometry pool;
  std::vector<int32_t> idx;
  Vec x, w, gp;
};

template <class T>
PooledCase<T> pooled_case(int64_t c_in, int64_t c_out, int64_t k, int64_t kp, int64_t sp, bool drop, uint32_t seed) {
  PooledCase<T> c;
  const int64_t n = 3, h = 13, w = 12;
  c.conv = {n, c_in, h, w, c_out, k, k, 1, 1, 0, 0, 1, 1, h - k + 1, w - k + 1};
  c.pool = {n,
            c_out,
            c.conv.out_h,
            c.conv.out_w,
            kp,
            kp,
            sp,
            sp,
            0,
            0,
            (c.conv.out_h - kp) / sp + 1,
            (c.conv.out_w - kp) / sp + 1};
  c.x = through<T>(random_vec(x_size(c.conv), seed));
  c.w = through<T>(random_vec(w_size(c.conv), seed + 1));
  // Small integers: windows full of ties, and with drop some maxima at 0 or below (argmax -1).
  const auto y = cast_vec<T>(random_ints(y_size(c.conv), seed + 2, -3, 3));
  c.idx.resize(static_cast<std::size_t>(c.pool.n * c.pool.c * c.pool.out_h * c.pool.out_w));
  std::vector<T> values(c.idx.size());
  cpu::max_pool2d_argmax(c.pool, y.data(), c.idx.data(), values.data(), drop);
  c.gp = through<T>(random_vec(static_cast<int64_t>(c.idx.size()), seed + 3));
  return c;
}

// The put's output in double: what the dense kernels would read.
Vec naive_put(const cpu::Pool2dGeometry& p, const std::vector<int32_t>& idx, const Vec& gp) {
  Vec gy(static_cast<std::size_t>(p.n * p.c * p.h * p.w), 0.0);
  for (std::size_t o = 0; o < idx.size(); ++o) {
    const auto plane = static_cast<int64_t>(o) / (p.out_h * p.out_w);
    if (idx[o] >= 0) gy[static_cast<std::size_t>(plane * p.h * p.w + idx[o])] += gp[o];
  }
  return gy;
}

TEST_CASE_TEMPLATE("a convolution's gradients through max pooling sum over the pooled elements only", T, float,
                   double) {
  // Against the put followed by the direct loops: window rows of one to several vectors (c_in),
  // 3 x 3 and 5 x 5 windows, pools that tile, overlap (an element can win two windows) or leave
  // rows out, dropped windows, and 1 to 3 threads (the weight gradient's blocks).
  const int saved = cpu::num_threads();
  uint32_t seed = 900;
  for (int threads : {1, 3})
    for (int64_t c_in : {1, 2, 6, 17})
      for (int64_t k : {3, 5})
        for (const std::pair<int64_t, int64_t>& pool : {std::pair<int64_t, int64_t>{2, 2}, {3, 2}, {3, 3}}) {
          const int64_t kp = pool.first, sp = pool.second;  // not bindings: doctest's INFO captures them
          cpu::set_num_threads(threads);
          const int64_t c_out = c_in == 17 ? 3 : 5;
          seed += 4;
          const bool drop = seed / 4 % 2 == 0;
          const PooledCase<T> c = pooled_case<T>(c_in, c_out, k, kp, sp, drop, seed);
          INFO("threads ", threads, ", c_in ", c_in, ", window ", k, ", pool ", kp, " / ", sp, ", drop ", drop);
          REQUIRE(cpu::detail::conv_pooled_suits(c.conv));
          const Vec gy = naive_put(c.pool, c.idx, c.gp);
          const auto xt = cast_vec<T>(c.x), wt = cast_vec<T>(c.w), gpt = cast_vec<T>(c.gp);
          auto gx = nan_vec<T>(x_size(c.conv));
          cpu::conv2d_backward_input_pooled(c.conv, c.pool, c.idx.data(), gpt.data(), wt.data(), gx.data());
          check_close(gx, naive_conv_backward_input(c.conv, gy, c.w),
                      naive_conv_backward_input(c.conv, abs_vec(gy), abs_vec(c.w)), "input gradient");
          auto gw = nan_vec<T>(w_size(c.conv));
          cpu::conv2d_backward_weight_pooled(c.conv, c.pool, xt.data(), c.idx.data(), gpt.data(), gw.data());
          check_close(gw, naive_conv_backward_weight(c.conv, c.x, gy),
                      naive_conv_backward_weight(c.conv, abs_vec(c.x), abs_vec(gy)), "weight gradient");
          // The blocks of images are fixed by the geometry: a second run agrees bit for bit.
          auto again = nan_vec<T>(w_size(c.conv));
          cpu::conv2d_backward_weight_pooled(c.conv, c.pool, xt.data(), c.idx.data(), gpt.data(), again.data());
          CHECK(std::memcmp(gw.data(), again.data(), gw.size() * sizeof(T)) == 0);
        }
  cpu::set_num_threads(saved);
}

TEST_CASE_TEMPLATE("gradients through max pooling meet an infinity as the dense kernels do", T, float, double) {
  // The dense kernels multiply the put's zeros by every x (and w) element; 0 * inf is NaN. Where
  // x (for the weight gradient) or w (for the input gradient) is not finite the sparse kernels
  // run the dense ones, bit for bit, and so do geometries they do not serve (a 7 x 7 window).
  const T inf = std::numeric_limits<T>::infinity();
  auto bits_equal = [](const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
  };
  for (int64_t k : {5, 7}) {
    PooledCase<T> c = pooled_case<T>(2, 4, k, 2, 2, true, 40);
    INFO("window ", k);
    CHECK(cpu::detail::conv_pooled_suits(c.conv) == (k == 5));
    auto xt = cast_vec<T>(c.x), wt = cast_vec<T>(c.w);
    const auto gpt = cast_vec<T>(c.gp);
    xt[xt.size() / 3] = inf;
    wt[wt.size() / 2] = -inf;
    std::vector<T> gy(static_cast<std::size_t>(y_size(c.conv)));
    cpu::max_pool2d_put(c.pool, c.idx.data(), gpt.data(), gy.data());
    auto want_gw = nan_vec<T>(w_size(c.conv)), got_gw = nan_vec<T>(w_size(c.conv));
    cpu::conv2d_backward_weight(c.conv, xt.data(), gy.data(), want_gw.data());
    cpu::conv2d_backward_weight_pooled(c.conv, c.pool, xt.data(), c.idx.data(), gpt.data(), got_gw.data());
    CHECK(std::any_of(want_gw.begin(), want_gw.end(), [](T v) { return std::isnan(v); }));
    CHECK(bits_equal(got_gw, want_gw));
    auto want_gx = nan_vec<T>(x_size(c.conv)), got_gx = nan_vec<T>(x_size(c.conv));
    cpu::conv2d_backward_input(c.conv, gy.data(), wt.data(), want_gx.data());
    cpu::conv2d_backward_input_pooled(c.conv, c.pool, c.idx.data(), gpt.data(), wt.data(), got_gx.data());
    CHECK(std::any_of(want_gx.begin(), want_gx.end(), [](T v) { return std::isnan(v); }));
    CHECK(bits_equal(got_gx, want_gx));
  }
}

TEST_CASE_TEMPLATE("a convnet block's forward pools each image in cache with the three kernels' bits", T, float,
                   double) {
  // conv2d_relu_max_pool against conv2d_forward, a bias or none, ReLU and max_pool2d_argmax
  // (drop_nonpositive) in turn: the direct kernel (output channels filling half a vector or more) and the shifted
  // product (few), odd output sizes whose last row or column no window covers, a pointwise
  // kernel, and geometries the in-cache route does not serve (stride 2, a 3 x 3 pool), which run
  // the three kernels. Small integers make ties and maxima at 0 or below (argmax -1); a NaN, an
  // infinity and -0 reach some windows. 1 and 3 threads.
  struct Block {
    int64_t c_in, c_out, k, h, w, stride, pool;
  };
  constexpr int64_t L = static_cast<int64_t>(xsimd::batch<T>::size);
  const int saved = cpu::num_threads();
  uint32_t seed = 1200;
  for (int threads : {1, 3})
    for (const Block b : {Block{1, 6, 5, 32, 32, 1, 2}, Block{6, 16, 5, 14, 14, 1, 2}, Block{3, L, 3, 13, 12, 1, 2},
                          Block{2, 5, 3, 11, 12, 1, 2}, Block{4, 3, 1, 6, 7, 1, 2}, Block{2, 4, 3, 13, 13, 2, 2},
                          Block{2, 16, 3, 12, 12, 1, 3}}) {
      cpu::set_num_threads(threads);
      const int64_t n = 5, oh = (b.h - b.k) / b.stride + 1, ow = (b.w - b.k) / b.stride + 1;
      const cpu::Conv2dGeometry conv{n, b.c_in, b.h, b.w, b.c_out, b.k, b.k, b.stride, b.stride, 0, 0, 1, 1, oh, ow};
      const cpu::Pool2dGeometry pool{n,      b.c_out, oh, ow, b.pool,      b.pool,
                                     b.pool, b.pool,  0,  0,  oh / b.pool, ow / b.pool};
      INFO("threads ", threads, ", c_in ", b.c_in, ", c_out ", b.c_out, ", window ", b.k, ", stride ", b.stride,
           ", pool ", b.pool);
      CHECK(cpu::detail::conv_relu_max_pool_suits(conv, pool) == (b.stride == 1 && b.pool == 2));
      auto x = cast_vec<T>(random_ints(x_size(conv), ++seed, -2, 2));
      const auto w = cast_vec<T>(random_ints(w_size(conv), ++seed, -1, 1));
      x[7] = std::numeric_limits<T>::quiet_NaN();
      x[x.size() / 2] = std::numeric_limits<T>::infinity();
      x[x.size() - 9] = -T(0);
      const auto bias = cast_vec<T>(random_vec(b.c_out, ++seed));
      for (const T* b_or_none : {static_cast<const T*>(nullptr), bias.data()}) {
        INFO("bias ", b_or_none != nullptr);
        std::vector<T> y(static_cast<std::size_t>(y_size(conv)));
        cpu::conv2d_forward(conv, x.data(), w.data(), y.data());
        for (std::size_t e = 0; e < y.size(); ++e) {
          if (b_or_none) y[e] += b_or_none[e / static_cast<std::size_t>(oh * ow) % static_cast<std::size_t>(b.c_out)];
          y[e] = xgrad::math::max(y[e], T(0));
        }
        const auto pooled = static_cast<std::size_t>(n * b.c_out * pool.out_h * pool.out_w);
        std::vector<T> want_values(pooled), got_values = nan_vec<T>(static_cast<int64_t>(pooled));
        std::vector<int32_t> want_idx(pooled), got_idx(pooled, INT32_MIN);
        cpu::max_pool2d_argmax(pool, y.data(), want_idx.data(), want_values.data(), true);
        cpu::conv2d_relu_max_pool(conv, pool, x.data(), w.data(), b_or_none, got_values.data(), got_idx.data());
        CHECK(std::count(want_idx.begin(), want_idx.end(), -1) > 0);
        CHECK(std::any_of(want_values.begin(), want_values.end(), [](T v) { return std::isnan(v); }));
        CHECK(got_idx == want_idx);
        CHECK(std::memcmp(got_values.data(), want_values.data(), pooled * sizeof(T)) == 0);
      }
    }
  cpu::set_num_threads(saved);
}

TEST_CASE_TEMPLATE("kernels whose threads lay out the weights themselves read each call's weights", T, float, double) {
  // The direct forward, the convnet block's forward and the pooled input gradient lay w out per
  // thread, once per call: a second call with new weights in the same buffer must read the new
  // ones on every thread, not the layout a thread kept from the first call. Output channels that
  // fill a vector take the direct forward kernel on every target (its lanes all used, where the
  // shifted product's tiles would compute rows and grid columns past the outputs); 1 and 3 threads.
  constexpr int64_t L = static_cast<int64_t>(xsimd::batch<T>::size);
  const int saved = cpu::num_threads();
  const int64_t n = 6, c_in = 3, k = 5, h = 14, w_extent = 13, oh = h - k + 1, ow = w_extent - k + 1;
  const cpu::Conv2dGeometry conv{n, c_in, h, w_extent, L, k, k, 1, 1, 0, 0, 1, 1, oh, ow};
  const cpu::Pool2dGeometry pool{n, L, oh, ow, 2, 2, 2, 2, 0, 0, oh / 2, ow / 2};
  const auto pooled = static_cast<std::size_t>(n * L * pool.out_h * pool.out_w);
  const Vec x = through<T>(random_vec(x_size(conv), 1300));
  const auto xt = cast_vec<T>(x);
  for (int threads : {1, 3}) {
    cpu::set_num_threads(threads);
    std::vector<T> weights(static_cast<std::size_t>(w_size(conv)));  // one buffer, two calls
    for (uint32_t seed : {1301u, 1302u}) {
      INFO("threads ", threads, ", weights ", seed);
      const Vec w = through<T>(random_vec(w_size(conv), seed));
      std::copy(w.begin(), w.end(), weights.begin());
      REQUIRE(cpu::detail::conv_direct_suits<T>(conv));
      const Vec y = naive_conv_forward(conv, x, w);
      auto got_y = nan_vec<T>(y_size(conv));
      cpu::conv2d_forward(conv, xt.data(), weights.data(), got_y.data());
      check_close(got_y, y, naive_conv_forward(conv, abs_vec(x), abs_vec(w)), "forward");
      // The block's forward against max_pool2d_argmax of the forward's own result after ReLU.
      for (T& v : got_y) v = xgrad::math::max(v, T(0));
      std::vector<T> want_values(pooled), got_values = nan_vec<T>(static_cast<int64_t>(pooled));
      std::vector<int32_t> want_idx(pooled), got_idx(pooled, INT32_MIN);
      cpu::max_pool2d_argmax(pool, got_y.data(), want_idx.data(), want_values.data(), true);
      cpu::conv2d_relu_max_pool(conv, pool, xt.data(), weights.data(), static_cast<const T*>(nullptr),
                                got_values.data(), got_idx.data());
      CHECK(got_idx == want_idx);
      CHECK(std::memcmp(got_values.data(), want_values.data(), pooled * sizeof(T)) == 0);
      const Vec gp = through<T>(random_vec(static_cast<int64_t>(pooled), seed + 10));
      const auto gpt = cast_vec<T>(gp);
      const Vec gy = naive_put(pool, want_idx, gp);
      auto gx = nan_vec<T>(x_size(conv));
      cpu::conv2d_backward_input_pooled(conv, pool, want_idx.data(), gpt.data(), weights.data(), gx.data());
      check_close(gx, naive_conv_backward_input(conv, gy, w), naive_conv_backward_input(conv, abs_vec(gy), abs_vec(w)),
                  "input gradient");
    }
  }
  cpu::set_num_threads(saved);
}
