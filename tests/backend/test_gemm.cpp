// Tests for xgrad::cpu::gemm against a naive double-precision reference.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "xgrad/backend/cpu/gemm.hpp"
#include "xgrad/backend/cpu/thread_pool.hpp"

namespace {

struct GemmCase {
  int64_t m, n, k;
  bool trans_a = false;
  bool trans_b = false;
  double alpha = 1.0;
  double beta = 0.0;
  int64_t ldc_pad = 0;  // extra columns in C beyond n
};

/// Runs one gemm<T> against the reference and returns the worst error relative to the
/// magnitude of the terms summed into each entry.
template <class T> double run_case(const GemmCase& g, uint32_t seed = 7) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  const int64_t ldc = g.n + g.ldc_pad;
  std::vector<T> a(static_cast<size_t>(std::max<int64_t>(1, g.m * g.k)));
  std::vector<T> b(static_cast<size_t>(std::max<int64_t>(1, g.k * g.n)));
  std::vector<T> c(static_cast<size_t>(std::max<int64_t>(1, g.m * ldc)));
  for (auto& x : a) x = static_cast<T>(dist(rng));
  for (auto& x : b) x = static_cast<T>(dist(rng));
  if (g.beta == 0.0) {
    for (auto& x : c) x = std::numeric_limits<T>::quiet_NaN();
  } else {
    for (auto& x : c) x = static_cast<T>(dist(rng));
  }
  const std::vector<T> c0 = c;

  // Storage of A is m x k row-major, or k x m row-major when transposed (then A = stored^T).
  const int64_t ars = g.trans_a ? 1 : g.k;
  const int64_t acs = g.trans_a ? g.m : 1;
  const int64_t brs = g.trans_b ? 1 : g.n;
  const int64_t bcs = g.trans_b ? g.k : 1;

  xgrad::cpu::gemm<T>(g.m, g.n, g.k, static_cast<T>(g.alpha), a.data(), ars, acs, b.data(), brs, bcs,
                      static_cast<T>(g.beta), c.data(), ldc);

  double worst = 0.0;
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      double sum = 0.0, mag = 0.0;
      for (int64_t p = 0; p < g.k; ++p) {
        const double t = static_cast<double>(a[static_cast<size_t>(i * ars + p * acs)]) *
                         static_cast<double>(b[static_cast<size_t>(p * brs + j * bcs)]);
        sum += t;
        mag += std::abs(t);
      }
      const double c_old = static_cast<double>(c0[static_cast<size_t>(i * ldc + j)]);
      double want = g.alpha * sum;
      if (g.beta != 0.0) want += g.beta * c_old;
      const double scale = std::abs(g.alpha) * mag + std::abs(g.beta * c_old) + 1.0;
      const double got = static_cast<double>(c[static_cast<size_t>(i * ldc + j)]);
      const double err = std::isfinite(got) ? std::abs(got - want) / scale : std::numeric_limits<double>::infinity();
      worst = std::max(worst, err);
    }
    // Padding columns of C must be untouched.
    for (int64_t j = g.n; j < ldc; ++j) {
      const T before = c0[static_cast<size_t>(i * ldc + j)];
      const T after = c[static_cast<size_t>(i * ldc + j)];
      if (!(before == after || (std::isnan(before) && std::isnan(after))))
        worst = std::numeric_limits<double>::infinity();
    }
  }
  return worst;
}

/// gemm's C = A B + beta C from C = c0 (A(i, p) at a[i * ars + p * acs], B row-major n wide, C
/// ldc wide) on 1, 2 and 3 threads, in that order.
template <class T> std::vector<std::vector<T>> gemm_on_1_2_3_threads(int64_t m, int64_t n, int64_t k,
                                                                     const std::vector<T>& a, int64_t ars, int64_t acs,
                                                                     const std::vector<T>& b, T beta,
                                                                     const std::vector<T>& c0, int64_t ldc) {
  std::vector<std::vector<T>> results;
  for (int threads : {1, 2, 3}) {
    xgrad::cpu::set_num_threads(threads);
    std::vector<T> c = c0;
    xgrad::cpu::gemm<T>(m, n, k, T(1), a.data(), ars, acs, b.data(), n, 1, beta, c.data(), ldc);
    results.push_back(std::move(c));
  }
  return results;
}

template <class T> double gemm_tolerance() { return std::is_same_v<T, float> ? 1e-5 : 1e-13; }

template <class T> void check_shapes(const std::vector<GemmCase>& cases) {
  for (const auto& g : cases) {
    CAPTURE(g.m);
    CAPTURE(g.n);
    CAPTURE(g.k);
    CAPTURE(g.trans_a);
    CAPTURE(g.trans_b);
    CAPTURE(g.alpha);
    CAPTURE(g.beta);
    CHECK(run_case<T>(g) <= gemm_tolerance<T>());
  }
}

std::vector<GemmCase> basic_shapes() {
  std::vector<GemmCase> out;
  // {6, 1100, 25}: one panel of A rows, so B is read in place, across several column blocks;
  // {6, 25, 300}: a conv's weight-gradient shape, whose transposed B is one partial panel.
  const int64_t dims[][3] = {{1, 1, 1},
                             {1, 7, 1},
                             {7, 1, 3},
                             {2, 3, 4},
                             {7, 13, 5},
                             {16, 16, 16},
                             {15, 17, 31},
                             {14, 32, 8},
                             {13, 31, 9},
                             {28, 64, 64},
                             {64, 64, 64},
                             {65, 33, 129},
                             {33, 65, 257},
                             {100, 3, 300},
                             {3, 100, 300},
                             {1, 300, 70},
                             {300, 1, 70},
                             {129, 97, 513},
                             {6, 1100, 25},
                             {6, 25, 300},
                             {300, 257, 1},  // an outer product (per-example weight gradients)
                             // Few outputs over a long k: with B transposed, the dot-product form (conv1's weight
                             // gradient; odd sizes for the tiles' and k's edges).
                             {6, 25, 2352},
                             {3, 5, 1101},
                             {8, 7, 1031}};
  for (const auto& d : dims) {
    for (int t = 0; t < 4; ++t) {
      out.push_back({d[0], d[1], d[2], (t & 1) != 0, (t & 2) != 0});
    }
  }
  return out;
}

}  // namespace

TEST_CASE_TEMPLATE("gemm matches naive reference across shapes and transposes", T, float, double) {
  check_shapes<T>(basic_shapes());
}

TEST_CASE_TEMPLATE("gemm alpha and beta", T, float, double) {
  std::vector<GemmCase> cases;
  for (const auto& d :
       {GemmCase{7, 13, 5}, GemmCase{65, 33, 129}, GemmCase{30, 70, 300}, GemmCase{30, 70, 1}, GemmCase{6, 25, 2000}}) {
    for (double alpha : {1.0, 2.0, -0.5}) {
      for (double beta : {0.0, 1.0, 0.25}) {
        GemmCase g = d;
        g.alpha = alpha;
        g.beta = beta;
        g.ldc_pad = 3;
        cases.push_back(g);
        g.trans_b = true;  // B transposed alone: the dot-product form where it suits
        cases.push_back(g);
        g.trans_a = true;
        cases.push_back(g);
      }
    }
  }
  check_shapes<T>(cases);
}

TEST_CASE_TEMPLATE("gemm sizes crossing the cache blocks", T, float, double) {
  using cfg = xgrad::cpu::detail::GemmConfig<T>;
  const int64_t mc = cfg::mc, nc = cfg::nc, kc = cfg::kc;
  std::vector<GemmCase> cases = {
      {mc + 1, 40, kc + 1, false, false, 1.0, 1.0},
      {mc - 1, 40, 2 * kc + 3, true, false, 1.0, 0.0},
      {20, nc + 5, 50, false, true, 2.0, 0.0},
      {2 * cfg::mr + 1, nc - 1, kc - 1, true, true, 1.0, 1.0},
  };
  check_shapes<T>(cases);
}

TEST_CASE_TEMPLATE("gemm packs A once for all its column blocks: each block's numbers as a product of its own", T,
                   float, double) {
  // Over several column blocks, depth blocks and row blocks, A (also transposed) is packed in
  // the first column block and read packed by the others; each column block of C must be what
  // the same product over just its columns gives, bit for bit.
  using cfg = xgrad::cpu::detail::GemmConfig<T>;
  const int saved = xgrad::cpu::num_threads();
  xgrad::cpu::set_num_threads(1);
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(-1, 1);
  const int64_t m = 2 * cfg::mc + 5, n = 2 * cfg::nc + 70, k = 2 * cfg::kc + 3;
  for (const bool trans_a : {false, true}) {
    CAPTURE(trans_a);
    const int64_t ars = trans_a ? 1 : k, acs = trans_a ? m : 1;
    std::vector<T> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)), c0(static_cast<size_t>(m * n));
    for (auto* v : {&a, &b, &c0})
      for (T& x : *v) x = static_cast<T>(u(rng));
    std::vector<T> whole = c0, blocks = c0;
    xgrad::cpu::gemm<T>(m, n, k, T(1), a.data(), ars, acs, b.data(), n, 1, T(0.5), whole.data(), n);
    for (int64_t col = 0; col < n; col += cfg::nc) {
      const int64_t cols = std::min(cfg::nc, n - col);
      xgrad::cpu::gemm<T>(m, cols, k, T(1), a.data(), ars, acs, b.data() + col, n, 1, T(0.5), blocks.data() + col, n);
    }
    CHECK(whole == blocks);
  }
  check_shapes<T>({{m, n, k, false, false, 1.0, 0.5}});
  xgrad::cpu::set_num_threads(saved);
}

TEST_CASE_TEMPLATE("gemm with zero-sized dimensions", T, float, double) {
  std::vector<T> a(16, T(1)), b(16, T(1));
  SUBCASE("m or n zero leaves C alone") {
    std::vector<T> c(16, T(5));
    xgrad::cpu::gemm<T>(0, 4, 4, T(1), a.data(), 4, 1, b.data(), 4, 1, T(0), c.data(), 4);
    xgrad::cpu::gemm<T>(4, 0, 4, T(1), a.data(), 4, 1, b.data(), 4, 1, T(0), c.data(), 4);
    for (T x : c) CHECK(x == T(5));
  }
  SUBCASE("k zero scales C by beta") {
    std::vector<T> c(16, T(5));
    xgrad::cpu::gemm<T>(4, 4, 0, T(1), a.data(), 1, 1, b.data(), 1, 1, T(0.5), c.data(), 4);
    for (T x : c) CHECK(x == T(2.5));
  }
  SUBCASE("k zero with beta zero clears NaN C") {
    std::vector<T> c(16, std::numeric_limits<T>::quiet_NaN());
    xgrad::cpu::gemm<T>(4, 4, 0, T(1), a.data(), 1, 1, b.data(), 1, 1, T(0), c.data(), 4);
    for (T x : c) CHECK(x == T(0));
  }
}

TEST_CASE_TEMPLATE("gemm with general (non-unit) strides", T, float, double) {
  // A and B are every other row/column of larger buffers, so neither stride is 1.
  const int64_t m = 37, n = 45, k = 70;
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<T> abuf(static_cast<size_t>(2 * m * 3 * k)), bbuf(static_cast<size_t>(2 * k * 3 * n));
  for (auto& x : abuf) x = static_cast<T>(dist(rng));
  for (auto& x : bbuf) x = static_cast<T>(dist(rng));
  const int64_t ars = 6 * k, acs = 2, brs = 3, bcs = 2 * k * 3;
  std::vector<T> c(static_cast<size_t>(m * n), std::numeric_limits<T>::quiet_NaN());
  xgrad::cpu::gemm<T>(m, n, k, T(1), abuf.data(), ars, acs, bbuf.data(), brs, bcs, T(0), c.data(), n);
  double worst = 0.0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0, mag = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double t = static_cast<double>(abuf[static_cast<size_t>(i * ars + p * acs)]) *
                         static_cast<double>(bbuf[static_cast<size_t>(p * brs + j * bcs)]);
        sum += t;
        mag += std::abs(t);
      }
      const double got = static_cast<double>(c[static_cast<size_t>(i * n + j)]);
      const double err =
          std::isfinite(got) ? std::abs(got - sum) / (mag + 1.0) : std::numeric_limits<double>::infinity();
      worst = std::max(worst, err);
    }
  }
  CHECK(worst <= gemm_tolerance<T>());
}

enum class Operand { a, b };

/// gemm_serial with one operand read where it is, its rows a few elements longer than needed (3
/// for A, 5 for B) and the last ending where its buffer ends (the sanitizer build sees any read
/// past it), against the same operand stored transposed, which is packed first (pack_a,
/// pack_b): the products agree bit for bit.
template <class T> void check_in_place(Operand which, int64_t m, int64_t n, int64_t k, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  const bool on_a = which == Operand::a;
  const int64_t rows = on_a ? m : k, cols = on_a ? k : n, ld = cols + (on_a ? 3 : 5);
  std::vector<T> x((rows - 1) * ld + cols), x_t(rows * cols), other(on_a ? k * n : m * k);
  for (auto* v : {&x, &other})
    for (T& e : *v) e = static_cast<T>(u(rng));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) x_t[c * rows + r] = x[r * ld + c];
  std::vector<T> in_place(m * n, std::numeric_limits<T>::quiet_NaN()), packed = in_place;
  using xgrad::cpu::detail::gemm_serial;
  if (on_a) {
    gemm_serial<T>(m, n, k, T(1), x.data(), ld, 1, other.data(), n, 1, T(0), in_place.data(), n);
    gemm_serial<T>(m, n, k, T(1), x_t.data(), 1, m, other.data(), n, 1, T(0), packed.data(), n);
  } else {
    gemm_serial<T>(m, n, k, T(1), other.data(), k, 1, x.data(), ld, 1, T(0), in_place.data(), n);
    gemm_serial<T>(m, n, k, T(1), other.data(), k, 1, x_t.data(), 1, k, T(0), packed.data(), n);
  }
  CHECK(in_place == packed);
}

TEST_CASE_TEMPLATE("gemm computes x W^T as its transpose: a dense layer's shapes", T, float, double) {
  // B transposed and at most a panel of rows in A: C^T = W x^T with W's rows read in place
  // (across depth blocks past kc), x packed, and C^T transposed into C through whole blocks of
  // lanes and the edges past them; beta and a padded C; 1 to 3 threads, each taking W's rows.
  // A panel is 64 float rows under AVX-512, 16 under AVX2: the batch is LeNet5's 32 where it fits.
  using cfg = xgrad::cpu::detail::GemmConfig<T>;
  const int64_t batch = std::min<int64_t>(32, cfg::nr), short_batch = std::min<int64_t>(20, cfg::nr);
  REQUIRE(xgrad::cpu::detail::transposed_suits<T>(batch, 120, 400, 1, 1, 400));
  REQUIRE_FALSE(xgrad::cpu::detail::transposed_suits<T>(cfg::nr + 1, 400, 120, 1, 1, 120));  // A too tall
  REQUIRE_FALSE(xgrad::cpu::detail::transposed_suits<T>(batch, batch, 84, 1, 1, 84));        // W no larger
  const int saved = xgrad::cpu::num_threads();
  for (int threads : {1, 2, 3}) {
    xgrad::cpu::set_num_threads(threads);
    CAPTURE(threads);
    std::vector<GemmCase> cases;
    for (const auto& d : std::vector<std::array<int64_t, 3>>{{batch, 120, 400},
                                                             {batch, 84, 120},
                                                             {short_batch, 50, 2 * cfg::kc + 3},
                                                             {cfg::nr, 4 * cfg::nr + 7, 300},
                                                             {1, 300, 70}})
      for (double beta : {0.0, 0.5}) {
        REQUIRE(xgrad::cpu::detail::transposed_suits<T>(d[0], d[1], d[2], 1, 1, d[2]));
        GemmCase g{d[0], d[1], d[2], false, true, 1.5, beta};
        g.ldc_pad = 3;
        cases.push_back(g);
      }
    check_shapes<T>(cases);
  }
  xgrad::cpu::set_num_threads(saved);
}

TEST_CASE_TEMPLATE("gemm reads A in place across depth blocks when one panel of B covers C", T, float, double) {
  // n <= nr: each row of A is read once, so a tall A with rows k + 3 apart is read in place,
  // a last micro-panel of an odd number of rows packed; the numbers are the packed path's, bit
  // for bit.
  using cfg = xgrad::cpu::detail::GemmConfig<T>;
  std::mt19937 rng(13);
  for (const int64_t m : {int64_t{cfg::mr + 1}, int64_t{100}})
    for (const int64_t n : {int64_t{5}, int64_t{cfg::nr}})
      for (const int64_t k : {int64_t{cfg::kc + 1}, int64_t{3 * cfg::kc}}) {
        CAPTURE(m);
        CAPTURE(n);
        CAPTURE(k);
        check_in_place<T>(Operand::a, m, n, k, rng);
      }
}

TEST_CASE_TEMPLATE("gemm reads a small depth block of B in place: the packed path's numbers bit for bit", T, float,
                   double) {
  // B's rows contiguous: read where they are when a depth block of B is at most
  // kGemmInPlaceBlockB (LeNet5's fc1: x for the weight gradient, a half of W for the input
  // gradient), with rows not whole vectors apart and a last partial panel (check_in_place).
  using cfg = xgrad::cpu::detail::GemmConfig<T>;
  std::mt19937 rng(13);
  const int64_t wide = 1600 / static_cast<int64_t>(sizeof(T));  // fc1's 400 floats, 200 doubles
  for (const auto& shape : std::vector<std::array<int64_t, 3>>{
           {32, wide, 60}, {120, wide, 32}, {3 * cfg::mr + 1, cfg::nr + 7, 33}, {32, 2 * cfg::nr, cfg::kc + 9}}) {
    const int64_t m = shape[0], n = shape[1], k = shape[2];  // CAPTURE cannot take structured bindings (clang 14)
    CAPTURE(m);
    CAPTURE(n);
    CAPTURE(k);
    REQUIRE(m > 2 * cfg::mr);  // B in place for this rule, not for A's few rows
    REQUIRE(std::min(k, cfg::kc) * n * static_cast<int64_t>(sizeof(T)) <= xgrad::cpu::kGemmInPlaceBlockB);
    check_in_place<T>(Operand::b, m, n, k, rng);
  }
}

TEST_CASE_TEMPLATE("gemm sums a dense layer's input gradient in two halves of k: the same bits on any thread count", T,
                   float, double) {
  // g W with W [k, n] row-major and k >= 3 m: the second half of k is added to the first, on
  // one thread as on two or three (each half then also split along n), so the results are
  // equal bit for bit, and close to the reference.
  using cfg = xgrad::cpu::detail::GemmConfig<T>;
  REQUIRE(xgrad::cpu::detail::k_halves_split<T>(32, 120, T(1), 1) == 60);
  REQUIRE(xgrad::cpu::detail::k_halves_split<T>(32, 120, T(2), 1) == 0);          // alpha is not 1
  REQUIRE(xgrad::cpu::detail::k_halves_split<T>(64, 120, T(1), 1) == 0);          // k < 3 m
  REQUIRE(xgrad::cpu::detail::k_halves_split<T>(32, 3 * cfg::kc, T(1), 1) == 0);  // more than two blocks
  std::mt19937 rng(14);
  std::uniform_real_distribution<double> u(-1, 1);
  const int saved = xgrad::cpu::num_threads();
  for (const auto& d : std::vector<std::array<int64_t, 3>>{{32, 400, 120}, {5, 77, 2 * cfg::kc - 13}, {16, 250, 96}})
    for (const T beta : {T(0), T(0.5)}) {
      const int64_t m = d[0], n = d[1], k = d[2];
      CAPTURE(m);
      CAPTURE(n);
      CAPTURE(k);
      CAPTURE(beta);
      REQUIRE(xgrad::cpu::detail::k_halves_split<T>(m, k, T(1), 1) > 0);
      std::vector<T> a(m * k), b(k * n), c0(m * (n + 2));
      for (auto* v : {&a, &b, &c0})
        for (T& x : *v) x = static_cast<T>(u(rng));
      const auto results = gemm_on_1_2_3_threads<T>(m, n, k, a, k, 1, b, beta, c0, n + 2);
      CHECK(results[1] == results[0]);
      CHECK(results[2] == results[0]);
      double worst = 0.0;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n + 2; ++j) {
          double want = static_cast<double>(c0[i * (n + 2) + j]);
          if (j < n) {
            double sum = 0.0, mag = 0.0;
            for (int64_t p = 0; p < k; ++p) {
              const double t = static_cast<double>(a[i * k + p]) * static_cast<double>(b[p * n + j]);
              sum += t;
              mag += std::abs(t);
            }
            want = sum + static_cast<double>(beta) * want;
            worst = std::max(worst, std::abs(static_cast<double>(results[0][i * (n + 2) + j]) - want) / (mag + 1.0));
          } else {
            CHECK(results[0][i * (n + 2) + j] == c0[i * (n + 2) + j]);  // C's padding untouched
          }
        }
      CHECK(worst <= gemm_tolerance<T>());
    }
  xgrad::cpu::set_num_threads(saved);
}

TEST_CASE("gemm multithreaded matches single-threaded") {
  const int saved = xgrad::cpu::num_threads();
  for (int threads : {1, 2, 3}) {
    xgrad::cpu::set_num_threads(threads);
    CAPTURE(threads);
    check_shapes<float>({{200, 190, 120}, {500, 40, 100, true, false}, {40, 500, 100, false, true, 1.0, 1.0}});
    check_shapes<double>({{130, 250, 70, true, true, 2.0, 0.5}});
  }
  xgrad::cpu::set_num_threads(saved);
}

TEST_CASE_TEMPLATE("gemm split along n shares each packed block among the threads: one thread's bits", T, float,
                   double) {
  // Products whose threads would each pack both operands go through gemm_column_homes; its
  // blocks cross column, depth and row blocks and their edges, A is also transposed, C is
  // also scaled by beta.
  using xgrad::cpu::detail::homes_suit;
  REQUIRE(homes_suit<T>(300, 1200, 600, 1, 1, 2));
  CHECK_FALSE(homes_suit<T>(300, 1200, 600, 1, 1, 1));  // one thread: nothing to share
  CHECK_FALSE(homes_suit<T>(12, 1200, 600, 1, 1, 2));   // two micro-panels of A: B read in place
  CHECK_FALSE(homes_suit<T>(300, 200, 100, 1, 1, 2));   // a depth block of B small enough for L2
  std::mt19937 rng(21);
  std::uniform_real_distribution<double> u(-1, 1);
  const int saved = xgrad::cpu::num_threads();
  for (const GemmCase& g : {GemmCase{300, 1200, 600}, GemmCase{301, 1000, 555, true, false, 1.0, 0.5, 3}}) {
    CAPTURE(g.m);
    CAPTURE(g.n);
    CAPTURE(g.trans_a);
    REQUIRE(homes_suit<T>(g.m, g.n, g.k, g.trans_a ? g.m : 1, 1, 2));
    const int64_t ldc = g.n + g.ldc_pad, ars = g.trans_a ? 1 : g.k, acs = g.trans_a ? g.m : 1;
    std::vector<T> a(static_cast<size_t>(g.m * g.k)), b(static_cast<size_t>(g.k * g.n)),
        c0(static_cast<size_t>(g.m * ldc));
    for (auto* v : {&a, &b, &c0})
      for (T& x : *v) x = static_cast<T>(u(rng));
    const auto results = gemm_on_1_2_3_threads<T>(g.m, g.n, g.k, a, ars, acs, b, static_cast<T>(g.beta), c0, ldc);
    CHECK(results[1] == results[0]);
    CHECK(results[2] == results[0]);
  }
  xgrad::cpu::set_num_threads(saved);
}

TEST_CASE("gemm split along n: a worker late from a background task takes up its share midway") {
  // The worker is held by a background task until the caller has finished a block of C; the
  // caller then waits, inside that block's callback, until the worker has finished one too: the
  // worker joins the product midway. C is the one-thread product bit for bit, each element told
  // once.
  const int saved = xgrad::cpu::num_threads();
  const int64_t m = 300, n = 1200, k = 600;
  std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n));
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 11) * 0.25f - 1.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 13) * 0.125f - 0.75f;
  std::vector<float> reference(static_cast<size_t>(m * n)), c(reference.size());
  xgrad::cpu::set_num_threads(1);
  xgrad::cpu::gemm<float>(m, n, k, 1.0f, a.data(), k, 1, b.data(), n, 1, 0.0f, reference.data(), n);
  xgrad::cpu::set_num_threads(2);
  REQUIRE(xgrad::cpu::detail::homes_suit<float>(m, n, k, 1, 1, 2));

  std::atomic<bool> release{false}, worker_told{false};
  xgrad::cpu::detail::BackgroundTask hold;
  hold.m_invoke = [](void* ctx) {
    while (!static_cast<std::atomic<bool>*>(ctx)->load()) std::this_thread::yield();
  };
  hold.m_ctx = &release;
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<std::atomic<int>> told(reference.size());
  const xgrad::cpu::GemmBlockDone done = [&](int64_t row, int64_t rows, int64_t col, int64_t cols) {
    for (int64_t i = row; i < row + rows; ++i)
      for (int64_t j = col; j < col + cols; ++j) ++told[static_cast<size_t>(i * n + j)];
    if (std::this_thread::get_id() != caller) {
      worker_told.store(true);
    } else if (!release.exchange(true)) {
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (!worker_told.load() && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
    }
  };
  xgrad::cpu::detail::run_in_background(hold);
  xgrad::cpu::gemm<float>(m, n, k, 1.0f, a.data(), k, 1, b.data(), n, 1, 0.0f, c.data(), n, &done);
  xgrad::cpu::detail::wait_for(hold);
  CHECK(worker_told.load());
  CHECK(c == reference);
  CHECK(std::all_of(told.begin(), told.end(), [](const std::atomic<int>& t) { return t.load() == 1; }));
  xgrad::cpu::set_num_threads(saved);
}

TEST_CASE("gemm tells each element of C once, when it is final") {
  // Shapes on either side of the split's choices: along n with a small C (told after the
  // product: up to 16 KiB at once on the calling thread, else in whole rows), along n with a
  // large one, along m, and serial; with B transposed, C computed as its transpose (a small C of
  // either kind and a large one).
  const int saved = xgrad::cpu::num_threads();
  for (int threads : {1, 2, 3}) {
    xgrad::cpu::set_num_threads(threads);
    for (const auto& shape : std::vector<std::array<int64_t, 4>>{{32, 120, 400, 0},
                                                                 {32, 256, 300, 0},
                                                                 {32, 256, 400, 1},
                                                                 {32, 600, 300, 0},
                                                                 {120, 400, 32, 0},
                                                                 {300, 64, 200, 0},
                                                                 {8, 8, 8, 0},
                                                                 {32, 120, 400, 1},
                                                                 {40, 1000, 64, 1}}) {
      const int64_t m = shape[0], n = shape[1], k = shape[2];
      const bool trans_b = shape[3] != 0;
      const int64_t brs = trans_b ? 1 : n, bcs = trans_b ? k : 1;
      CAPTURE(threads);
      CAPTURE(m);
      CAPTURE(n);
      CAPTURE(trans_b);
      std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)), c(static_cast<size_t>(m * n));
      for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 7) - 3.0f;
      for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 5) - 2.0f;
      std::vector<float> reference(c.size());
      xgrad::cpu::set_num_threads(1);
      xgrad::cpu::gemm<float>(m, n, k, 1.0f, a.data(), k, 1, b.data(), brs, bcs, 0.0f, reference.data(), n);
      xgrad::cpu::set_num_threads(threads);
      std::vector<int> told(c.size(), 0);
      std::vector<float> seen(c.size(), -1.0f);
      std::mutex mutex;
      const xgrad::cpu::GemmBlockDone done = [&](int64_t row, int64_t rows, int64_t col, int64_t cols) {
        std::lock_guard lock(mutex);
        for (int64_t i = row; i < row + rows; ++i)
          for (int64_t j = col; j < col + cols; ++j) {
            ++told[static_cast<size_t>(i * n + j)];
            seen[static_cast<size_t>(i * n + j)] = c[static_cast<size_t>(i * n + j)];
          }
      };
      xgrad::cpu::gemm<float>(m, n, k, 1.0f, a.data(), k, 1, b.data(), brs, bcs, 0.0f, c.data(), n, &done);
      CHECK(std::all_of(told.begin(), told.end(), [](int t) { return t == 1; }));
      CHECK(seen == reference);  // exact: small integers
    }
  }
  xgrad::cpu::set_num_threads(saved);
}

TEST_CASE_TEMPLATE("gemm_packed_a reads an A already in pack_a's layout: gemm's numbers, bit for bit", T, float,
                   double) {
  using cfg = xgrad::cpu::detail::GemmConfig<T>;
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(-1, 1);
  for (const int64_t m : {int64_t{1}, int64_t{cfg::mr}, int64_t{cfg::mr + 1}, int64_t{128}})
    for (const int64_t n : {int64_t{3}, int64_t{32}, int64_t{cfg::nr + 5}})
      for (const int64_t k : {int64_t{1}, int64_t{17}, int64_t{cfg::kc}})
        for (const T beta : {T(0), T(1)}) {
          CAPTURE(m);
          CAPTURE(n);
          CAPTURE(k);
          CAPTURE(beta);
          std::vector<T> a(m * k), b(k * n), c0(m * n);
          for (auto* v : {&a, &b, &c0})
            for (T& x : *v) x = static_cast<T>(u(rng));
          // pack_a's layout: rows a_row_stride apart, zero rows up to a whole micro-panel.
          const int64_t rows = (m + cfg::mr - 1) / cfg::mr * cfg::mr;
          std::vector<T> packed(rows * cfg::a_row_stride, T(0));
          for (int64_t i = 0; i < m; ++i) std::copy_n(&a[i * k], k, &packed[i * cfg::a_row_stride]);
          std::vector<T> want = c0, got = c0;
          xgrad::cpu::detail::gemm_serial<T>(m, n, k, T(0.5), a.data(), k, 1, b.data(), n, 1, beta, want.data(), n);
          xgrad::cpu::detail::gemm_packed_a<T>(m, n, k, T(0.5), packed.data(), b.data(), n, 1, beta, got.data(), n);
          CHECK(got == want);
        }
}

TEST_CASE_TEMPLATE("gemm reads a small A in place: the packed path's numbers bit for bit, nothing read past A", T,
                   float, double) {
  using cfg = xgrad::cpu::detail::GemmConfig<T>;
  std::mt19937 rng(12);
  // A last micro-panel of an odd number of rows is packed, since the edge kernels read rows up
  // to an even count: check_in_place's A ends where its buffer ends.
  for (const int64_t m : {int64_t{1}, int64_t{4}, int64_t{cfg::mr + 3}, int64_t{cfg::mr + 4}, int64_t{60}})
    for (const int64_t n : {int64_t{7}, int64_t{cfg::nr}, int64_t{cfg::nr + 5}})
      for (const int64_t k : {int64_t{5}, int64_t{32}}) {
        CAPTURE(m);
        CAPTURE(n);
        CAPTURE(k);
        REQUIRE(m * k * static_cast<int64_t>(sizeof(T)) <= xgrad::cpu::kGemmSmallA);
        check_in_place<T>(Operand::a, m, n, k, rng);
      }
}
