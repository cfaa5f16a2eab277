// Numerical semantics (docs/NUMERICS.md): integer division, wrap-around and powers; saturating
// float-to-int casts; NaN through max, min, relu, maximum, minimum, clip, sign, argmax and max
// pooling; C's special cases of pow; erf and gelu at their special values. Each is checked
// against a plain-loop reference eagerly, compiled at O0, O1 and O2 (inputs as graph inputs, and
// as constants the O1/O2 folding pass computes), and on Device::thrust eagerly and compiled.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numbers>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ops/op_table.hpp"

namespace xg = xgrad;

namespace numerics_test {

/// Same value: NaN for NaN, otherwise ==, and for floating point zeros the same sign.
template <class T> bool same(T got, T want) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
    return got == want && std::signbit(got) == std::signbit(want);
  } else {
    return got == want;
  }
}

using D = xg::Tensor<double>;

template <class T> using Runs = std::vector<std::pair<std::string, std::vector<T>>>;

/// f on 1-D tensors holding `data...`: eagerly; compiled at O0, O1 and O2 with the tensors as
/// inputs, and with them made inside the function (constants of the graph, which O1 and O2 fold);
/// on Device::thrust eagerly and compiled at O2. Each run's values, by name.
/// (f is jitted as a std::function of its signature: the file's many lambdas then make a few
/// jitted types, not one each, which keeps this file's build time down.)
template <class F, class... T> auto everywhere(F lambda, const std::vector<T>&... data) {
  using Result = decltype(lambda(xg::tensor<T>(data)...));
  using Out = typename Result::value_type;
  const std::function<Result(const xg::Tensor<T>&...)> f = lambda;
  const std::function<Result()> on_constants = [&] { return f(xg::tensor<T>(data)...); };
  Runs<Out> runs;
  runs.push_back({"eager", f(xg::tensor<T>(data)...).to_vector()});
  for (auto [name, level] : {std::pair{"O0", xg::JitLevel::O0}, {"O1", xg::JitLevel::O1}, {"O2", xg::JitLevel::O2}}) {
    runs.push_back({std::string("jit ") + name, xg::jit(f, {.level = level})(xg::tensor<T>(data)...).to_vector()});
    auto folded = xg::jit(on_constants, {.level = level});
    runs.push_back({std::string("jit constants ") + name, folded().to_vector()});
  }
  if constexpr (xg::thrust_available()) {
    auto on = [](const auto& t) { return t.to(xg::Device::thrust); };
    runs.push_back({"thrust", f(on(xg::tensor<T>(data))...).to_vector()});
    runs.push_back({"thrust jit O2", xg::jit(f, {.level = xg::JitLevel::O2})(on(xg::tensor<T>(data))...).to_vector()});
  }
  return runs;
}

/// Every run equals `want` element for element (by `same`, or within a relative tolerance).
template <class T> void check_runs(const Runs<T>& runs, const std::vector<T>& want, double tolerance = 0) {
  for (const auto& run : runs) {  // no structured binding: clang 14 cannot capture one in CAPTURE
    const auto& name = run.first;
    const auto& got = run.second;
    CAPTURE(name);
    REQUIRE(got.size() == want.size());
    std::size_t mismatches = 0;
    std::string first;
    for (std::size_t i = 0; i < want.size(); ++i) {
      bool ok = same(got[i], want[i]);
      if (!ok && tolerance > 0)
        ok = xg::testing::matches_reference(static_cast<double>(got[i]), static_cast<double>(want[i]), tolerance);
      if (!ok && mismatches++ == 0) first = xg::detail::concat("element ", i, ": got ", +got[i], ", want ", +want[i]);
    }
    INFO(first);
    CHECK(mismatches == 0);
  }
}

/// `pattern` repeated to at least n elements: long enough for SIMD bodies and their tails.
template <class T> std::vector<T> repeat(const std::vector<T>& pattern, std::size_t n = 37) {
  std::vector<T> out;
  while (out.size() < n)
    for (T v : pattern) out.push_back(v);
  return out;
}

template <class T> std::vector<T> map2(const std::vector<T>& a, const std::vector<T>& b, T (*f)(T, T)) {
  std::vector<T> out;
  for (std::size_t i = 0; i < a.size(); ++i) out.push_back(f(a[i], b[i]));
  return out;
}

// ---- integers -----------------------------------------------------------------------------

/// Signed arithmetic modulo 2^bits, through unsigned integers (where it is defined in C++).
template <class T> T wrap_add(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}
template <class T> T wrap_sub(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) - static_cast<U>(b)));
}
template <class T> T wrap_mul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
}
/// Truncating division; x / 0 is 0, INT_MIN / -1 wraps to INT_MIN.
template <class T> T int_div(T a, T b) {
  if (b == 0) return 0;
  if (b == -1) return wrap_sub<T>(0, a);
  return static_cast<T>(a / b);
}
/// a ** b by b multiplications, wrapping; a negative b gives the real power truncated toward 0.
template <class T> T int_pow(T a, T b) {
  if (b < 0) return a == 1 ? 1 : a == -1 ? (b % 2 ? -1 : 1) : 0;
  T r = 1;
  for (T i = 0; i < b; ++i) r = wrap_mul(r, a);
  return r;
}

template <class T> void check_integer_division() {
  constexpr T lo = std::numeric_limits<T>::min(), hi = std::numeric_limits<T>::max();
  const auto a = repeat<T>({7, -7, 7, -7, 0, 5, -5, lo, lo, hi, lo, hi, 1, 0, 3, lo, 9});
  const auto b = repeat<T>({2, 2, -2, -2, 0, 0, 0, -1, 1, -1, 0, 0, 3, 5, -1, 2, 4});
  check_runs(everywhere([](auto x, auto y) { return x / y; }, a, b), map2<T>(a, b, int_div<T>));
  // With a scalar divisor of 0, on either side.
  check_runs(everywhere([](auto x) { return x / T(0); }, a), std::vector<T>(a.size(), T(0)));
  std::vector<T> zero_over(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) zero_over[i] = int_div<T>(0, a[i]);
  check_runs(everywhere([](auto x) { return T(0) / x; }, a), zero_over);
}

TEST_CASE("numerics: integer division truncates; x / 0 is 0 and INT_MIN / -1 is INT_MIN, never SIGFPE") {
  SUBCASE("int32") { check_integer_division<std::int32_t>(); }
  SUBCASE("int64") { check_integer_division<std::int64_t>(); }
  // The example.
  CHECK((xg::tensor<std::int32_t>({1, 2}) / xg::tensor<std::int32_t>({1, 0})).to_vector() ==
        std::vector<std::int32_t>{1, 0});
}

template <class T> void check_integer_wrap() {
  constexpr T lo = std::numeric_limits<T>::min(), hi = std::numeric_limits<T>::max();
  const auto a = repeat<T>({hi, lo, lo, hi, 3, -4, hi / 2 + 7, lo + 1, 0});
  const auto b = repeat<T>({1, -1, lo, hi, 5, 6, 3, -2, lo});
  check_runs(everywhere([](auto x, auto y) { return x + y; }, a, b), map2<T>(a, b, wrap_add<T>));
  check_runs(everywhere([](auto x, auto y) { return x - y; }, a, b), map2<T>(a, b, wrap_sub<T>));
  check_runs(everywhere([](auto x, auto y) { return x * y; }, a, b), map2<T>(a, b, wrap_mul<T>));
  std::vector<T> negated, absolute, squared;
  T total = 0;
  for (T v : a) {
    negated.push_back(wrap_sub<T>(0, v));
    absolute.push_back(v < 0 ? wrap_sub<T>(0, v) : v);
    squared.push_back(wrap_mul(v, v));
    total = wrap_add(total, v);
  }
  check_runs(everywhere([](auto x) { return -x; }, a), negated);
  check_runs(everywhere([](auto x) { return xg::abs(x); }, a), absolute);
  check_runs(everywhere([](auto x) { return xg::square(x); }, a), squared);
  check_runs(everywhere([](auto x) { return xg::reshape(xg::sum(x), {1}); }, a), std::vector<T>{total});
  // Powers: wrapping, and negative exponents truncated toward zero.
  const auto base = repeat<T>({2, 3, -3, 10, 1, -1, -1, 0, 0, 2, 7, -2});
  const auto exponent = repeat<T>({10, 40, 41, 25, -5, -3, -4, 0, -1, -1, 0, 63});
  check_runs(everywhere([](auto x, auto y) { return xg::pow(x, y); }, base, exponent),
             map2<T>(base, exponent, int_pow<T>));
}

TEST_CASE("numerics: signed integer + - * neg abs square sum and pow wrap around in two's complement") {
  SUBCASE("int32") { check_integer_wrap<std::int32_t>(); }
  SUBCASE("int64") { check_integer_wrap<std::int64_t>(); }
}

// ---- casts ----------------------------------------------------------------------------------

/// Rust's `as` from a float to the integer I: NaN is 0, out of range saturates, else truncates.
template <class I> I saturating(double x) {
  const double limit = std::ldexp(1.0, std::numeric_limits<I>::digits);  // 2^31 or 2^63
  if (std::isnan(x)) return 0;
  if (x >= limit) return std::numeric_limits<I>::max();
  if (x <= -limit) return std::numeric_limits<I>::min();
  return static_cast<I>(std::trunc(x));
}

template <class F, class I> void check_float_to_int() {
  const F inf = std::numeric_limits<F>::infinity(), big = std::ldexp(F(1), std::numeric_limits<I>::digits);
  const std::vector<F> x =
      repeat<F>({std::numeric_limits<F>::quiet_NaN(), inf, -inf, F(2.7), F(-2.7), F(0.5), F(-0.5), F(-0.0), big, -big,
                 std::nextafter(big, F(0)), std::nextafter(-big, F(0)), std::nextafter(-big, -inf), F(1e30), F(-1e30),
                 std::numeric_limits<F>::denorm_min()});
  std::vector<I> want;
  for (F v : x) want.push_back(saturating<I>(static_cast<double>(v)));
  check_runs(everywhere([](auto t) { return xg::cast<I>(t); }, x), want);
}

TEST_CASE("numerics: float to integer casts saturate, NaN gives 0, as Rust's `as`") {
  SUBCASE("float to int32") { check_float_to_int<float, std::int32_t>(); }
  SUBCASE("float to int64") { check_float_to_int<float, std::int64_t>(); }
  SUBCASE("double to int32") { check_float_to_int<double, std::int32_t>(); }
  SUBCASE("double to int64") { check_float_to_int<double, std::int64_t>(); }
  SUBCASE("the other conversions: int64 to int32 wraps, double to float overflows to inf, NaN is true") {
    const std::vector<std::int64_t> wide{(std::int64_t{1} << 32) + 5, -(std::int64_t{1} << 31) - 1, -1, 123};
    std::vector<std::int32_t> narrow;
    for (auto v : wide) narrow.push_back(static_cast<std::int32_t>(static_cast<std::uint32_t>(v)));
    check_runs(everywhere([](auto t) { return xg::cast<std::int32_t>(t); }, wide), narrow);
    const std::vector<double> d{1e300, -1e300, std::nan(""), 1e-300, -0.0, 0.1};
    check_runs(everywhere([](auto t) { return xg::cast<float>(t); }, d),
               std::vector<float>{std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                                  std::nanf(""), 0.0f, -0.0f, 0.1f});
    check_runs(everywhere([](auto t) { return xg::cast<bool>(t); }, d),
               std::vector<bool>{true, true, true, true, false, true});
  }
}

// ---- NaN ------------------------------------------------------------------------------------

template <class T> T nan_max(T a, T b) { return std::isnan(a) ? a : std::isnan(b) ? b : (a > b ? a : b); }
template <class T> T nan_min(T a, T b) { return std::isnan(a) ? a : std::isnan(b) ? b : (a < b ? a : b); }

template <class T> void check_nan_elementwise() {
  const T nan = std::numeric_limits<T>::quiet_NaN(), inf = std::numeric_limits<T>::infinity();
  const auto a = repeat<T>({nan, 1, nan, -2, 0, nan, inf, -inf, T(-0.5), 3, T(0.25)}, 41);
  const auto b = repeat<T>({0, nan, nan, -3, 1, T(-1), nan, 2, T(0.5), -inf, T(0.25)}, 41);
  std::vector<T> relu, clipped, sign;
  for (T v : a) {
    relu.push_back(std::isnan(v) ? v : v > 0 ? v : T(0));
    clipped.push_back(std::isnan(v) ? v : v < T(-1) ? T(-1) : v > T(1) ? T(1) : v);
    sign.push_back(std::isnan(v) ? v : static_cast<T>((v > 0) - (v < 0)));
  }
  check_runs(everywhere([](auto x) { return xg::relu(x); }, a), relu);
  check_runs(everywhere([](auto x) { return xg::clip(x, T(-1), T(1)); }, a), clipped);
  check_runs(everywhere([](auto x) { return xg::sign(x); }, a), sign);
  check_runs(everywhere([](auto x, auto y) { return xg::maximum(x, y); }, a, b), map2<T>(a, b, nan_max<T>));
  check_runs(everywhere([](auto x, auto y) { return xg::minimum(x, y); }, a, b), map2<T>(a, b, nan_min<T>));
  // A NaN scalar on either side.
  check_runs(everywhere([](auto x) { return xg::maximum(x, std::numeric_limits<T>::quiet_NaN()); }, a),
             std::vector<T>(a.size(), nan));
  check_runs(everywhere([](auto x) { return xg::minimum(std::numeric_limits<T>::quiet_NaN(), x); }, a),
             std::vector<T>(a.size(), nan));
  // A chain O2 fuses into one kernel (CPU blocks, one Thrust functor) gives the same.
  auto chain = [](auto x, auto y) { return xg::sign(xg::clip(xg::maximum(x, y), T(-1), T(1))) + xg::relu(x) * y; };
  std::vector<T> want;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const T m = nan_max(a[i], b[i]);
    const T c = std::isnan(m) ? m : m < T(-1) ? T(-1) : m > T(1) ? T(1) : m;
    want.push_back((std::isnan(c) ? c : static_cast<T>((c > 0) - (c < 0))) + relu[i] * b[i]);
  }
  check_runs(everywhere(chain, a, b), want, 1e-6);  // O2 may make the multiply-add one fma
  const std::string ir = xg::jit(chain, {.level = xg::JitLevel::O2}).lower(xg::tensor<T>(a), xg::tensor<T>(b)).ir();
  CAPTURE(ir);
  CHECK(ir.find("Fused(") != std::string::npos);
}

TEST_CASE("numerics: NaN propagates through relu, maximum, minimum, clip and sign, fused or not") {
  SUBCASE("float") { check_nan_elementwise<float>(); }
  SUBCASE("double") { check_nan_elementwise<double>(); }
}

template <class T> void check_nan_reductions() {
  const T nan = std::numeric_limits<T>::quiet_NaN();
  // [3, 45]: row 0 has one NaN late (after SIMD batches), row 1 none, row 2 NaN first and twice.
  std::vector<T> x(3 * 45);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<T>(std::sin(0.7 * static_cast<double>(i)));
  x[40] = nan;
  x[90] = nan;
  x[120] = nan;
  x[100] = T(5);  // larger than every other number
  auto at = [&](std::size_t r, std::size_t c) { return x[r * 45 + c]; };
  std::vector<T> row_max, row_min, col_max;
  std::vector<std::int32_t> row_argmax;
  for (std::size_t r = 0; r < 3; ++r) {
    T mx = at(r, 0), mn = at(r, 0);
    std::int32_t best = 0;
    for (std::size_t c = 1; c < 45; ++c) {
      mx = nan_max(mx, at(r, c));
      mn = nan_min(mn, at(r, c));
      const T v = at(r, c), b = at(r, static_cast<std::size_t>(best));
      if (!std::isnan(b) && (v > b || std::isnan(v))) best = static_cast<std::int32_t>(c);
    }
    row_max.push_back(mx);
    row_min.push_back(mn);
    row_argmax.push_back(best);
  }
  for (std::size_t c = 0; c < 45; ++c) col_max.push_back(nan_max(nan_max(at(0, c), at(1, c)), at(2, c)));
  auto matrix = [](auto t) { return xg::reshape(t, {3, 45}); };
  check_runs(everywhere([&](auto t) { return xg::max(matrix(t), {1}); }, x), row_max);
  check_runs(everywhere([&](auto t) { return xg::min(matrix(t), {-1}); }, x), row_min);
  check_runs(everywhere([&](auto t) { return xg::max(matrix(t), {0}); }, x), col_max);
  check_runs(everywhere([&](auto t) { return xg::argmax(matrix(t), 1); }, x), row_argmax);
  check_runs(everywhere([](auto t) { return xg::reshape(xg::max(t), {1}); }, x), std::vector<T>{nan});
  // Over more than one chunk of a parallel full reduction (cpu::kReduceChunk), the NaN last.
  std::vector<T> many(70001, T(1));
  many.back() = nan;
  check_runs(everywhere([](auto t) { return xg::reshape(xg::min(t), {1}); }, many), std::vector<T>{nan});
}

TEST_CASE("numerics: max and min reductions are NaN where a NaN is, argmax points at the first NaN") {
  SUBCASE("float") { check_nan_reductions<float>(); }
  SUBCASE("double") { check_nan_reductions<double>(); }
}

TEST_CASE("numerics: max_pool2d passes a NaN in its window on, and its gradient goes to the NaN") {
  const double nan = std::nan("");
  // One 4x4 plane, 2x2 windows: NaN in window (0, 0) after its maximum, in window (1, 1) twice.
  const std::vector<double> x{1, 9, 2, 3, nan, 4, 5, 6, 7, 8, nan, 0, 1, 2, 3, nan};
  auto pool = [](auto t) { return xg::reshape(xg::max_pool2d(xg::reshape(t, {1, 1, 4, 4}), 2, 2), {4}); };
  check_runs(everywhere(pool, x), std::vector<double>{nan, 6, 8, nan});
  // d sum(pool(x) * w) / dx: each window's weight at its first NaN (row-major), else its maximum.
  auto grad = [&](D t, D w) { return xg::grad([&](D u) { return xg::sum(pool(u) * w); })(t); };
  const std::vector<double> want{0, 0, 0, 0, 1, 0, 0, 2, 0, 3, 4, 0, 0, 0, 0, 0};
  check_runs(everywhere(grad, x, std::vector<double>{1, 2, 3, 4}), want);
}

TEST_CASE("numerics: gradients at NaN follow the value: maximum's NaN operand, max's NaN elements") {
  const double nan = std::nan("");
  const std::vector<double> a{nan, 1, nan, 2, 3}, b{0, nan, nan, 2, 1};
  // d sum(maximum(a, b)) / da: 1 where a is NaN or larger, 1/2 on ties, 0 where b is NaN.
  check_runs(everywhere([](D x, D y) { return xg::grad([&](D u) { return xg::sum(xg::maximum(u, y)); })(x); }, a, b),
             std::vector<double>{1, 0, 1, 0.5, 1});
  check_runs(everywhere([](D x, D y) { return xg::grad([&](D u) { return xg::sum(xg::minimum(x, u)); })(y); }, a, b),
             std::vector<double>{0, 1, 0, 0.5, 1});
  // The gradient of max over a group holding NaNs is shared by its NaNs, as PyTorch's.
  check_runs(everywhere([](D x) { return xg::grad([](D u) { return xg::max(u); })(x); }, a),
             std::vector<double>{0.5, 0, 0.5, 0, 0});
  // relu's gradient is 0 at NaN (where y > 0 fails), as PyTorch's.
  check_runs(everywhere([](D x) { return xg::grad([](D u) { return xg::sum(xg::relu(u)); })(x); }, a),
             std::vector<double>{0, 1, 0, 1, 1});
}

// ---- pow --------------------------------------------------------------------------------------

template <class T> void check_pow_special_cases() {
  const T nan = std::numeric_limits<T>::quiet_NaN(), inf = std::numeric_limits<T>::infinity();
  const std::vector<T> bases{T(0),   T(-0.0), T(1), T(-1), T(2), T(-2),
                             T(0.5), T(-0.5), inf,  -inf,  nan,  std::numeric_limits<T>::denorm_min()};
  const std::vector<T> exponents{T(-0.5), T(0.5), T(-1),   T(1), T(2), T(-2), T(3),
                                 T(-3),   T(0),   T(-0.0), inf,  -inf, nan,   T(2.5)};
  std::vector<T> a, b, want;
  for (T x : bases)
    for (T y : exponents) {
      a.push_back(x);
      b.push_back(y);
      want.push_back(std::pow(x, y));
    }
  check_runs(everywhere([](auto x, auto y) { return xg::pow(x, y); }, a, b), want, 1e-6);
}

TEST_CASE("numerics: pow has C's special cases: pow(0, -0.5) is inf, pow(NaN, 0) and pow(1, NaN) are 1") {
  SUBCASE("float") { check_pow_special_cases<float>(); }
  SUBCASE("double") { check_pow_special_cases<double>(); }
  // The gradient of pow(x, 0.5) is sqrt's, at 0 too (inf), and elsewhere.
  const std::vector<double> x{0, 0.25, 1, 4, 0, 9, 16, 0.01, 2};
  auto by_pow = everywhere([](D t) { return xg::grad([](D u) { return xg::sum(xg::pow(u, 0.5)); })(t); }, x);
  std::vector<double> want;
  for (double v : x) want.push_back(0.5 / std::sqrt(v));
  check_runs(by_pow, want, 1e-12);
  check_runs(everywhere([](D t) { return xg::grad([](D u) { return xg::sum(xg::sqrt(u)); })(t); }, x), want, 1e-12);
  // The exponent's gradient y * log(a) is 0 where a = 0 and y = 0, not 0 * -inf.
  const std::vector<double> e(x.size(), 0.5);
  std::vector<double> want_e;
  for (double v : x) want_e.push_back(v == 0 ? 0.0 : std::sqrt(v) * std::log(v));
  check_runs(everywhere([](D t, D p) { return xg::grad([&](D q) { return xg::sum(xg::pow(t, q)); })(p); }, x, e),
             want_e, 1e-12);
}

// ---- erf and gelu ---------------------------------------------------------------------------

template <class T> void check_erf_and_gelu() {
  constexpr T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  const auto x = repeat<T>({T(0), T(-0.0), inf, -inf, nan, T(0.5), T(-0.5), T(1), T(-2.25), T(3.5), T(-6), T(30),
                            T(1e-20), T(-40), T(0.0625)});
  std::vector<T> want_erf, want_gelu, want_gelu_tanh;
  for (T v : x) {
    const long double l = v;
    want_erf.push_back(static_cast<T>(std::erf(l)));
    // PyTorch's formulas, in long double: 0.5 x (1 + erf(x / sqrt 2)) and the tanh form.
    want_gelu.push_back(static_cast<T>(0.5L * l * (1 + std::erf(l / std::sqrt(2.0L)))));
    const long double inner = std::sqrt(2 / std::numbers::pi_v<long double>) * (l + 0.044715L * l * l * l);
    want_gelu_tanh.push_back(static_cast<T>(0.5L * l * (1 + std::tanh(inner))));
  }
  const double tolerance = std::is_same_v<T, float> ? 2e-6 : 1e-13;
  // erf keeps the sign of zero, is exactly ±1 at ±inf and NaN at NaN (`same` at 0 tolerance
  // for those; the rest within the tolerance).
  check_runs(everywhere([](auto t) { return xg::erf(t); }, x), want_erf, tolerance);
  CHECK(same(xg::erf(xg::tensor<T>({T(-0.0)})).to_vector()[0], T(-0.0)));
  check_runs(everywhere([](auto t) { return xg::gelu(t); }, x), want_gelu, tolerance);
  check_runs(everywhere([](auto t) { return xg::gelu(t, xg::GeluApproximation::tanh); }, x), want_gelu_tanh, tolerance);
}

TEST_CASE("numerics: erf and gelu (both forms) at zeros, infinities, NaN and far tails, fused or not") {
  SUBCASE("float") { check_erf_and_gelu<float>(); }
  SUBCASE("double") { check_erf_and_gelu<double>(); }
  // Their gradients against the closed forms: erf' = 2/sqrt(pi) exp(-x^2), and GELU's
  // Phi(x) + x phi(x) with phi the standard normal density.
  const std::vector<double> x{-3, -1.5, -0.25, 0, 0.3, 1, 2.5, 6, -6};
  std::vector<double> d_erf, d_gelu;
  for (double v : x) {
    d_erf.push_back(2 / std::sqrt(std::numbers::pi) * std::exp(-v * v));
    d_gelu.push_back(0.5 * (1 + std::erf(v / std::sqrt(2.0))) +
                     v * std::exp(-v * v / 2) / std::sqrt(2 * std::numbers::pi));
  }
  check_runs(everywhere([](D t) { return xg::grad([](D u) { return xg::sum(xg::erf(u)); })(t); }, x), d_erf, 1e-13);
  check_runs(everywhere([](D t) { return xg::grad([](D u) { return xg::sum(xg::gelu(u)); })(t); }, x), d_gelu, 1e-13);
}

TEST_CASE("numerics: float erf is within 8 ulps of the true erf everywhere, odd and at most 1 in magnitude") {
  // Every 256th float from 2^-30 to 5 (a million of them, each binade alike), and their negatives.
  std::vector<float> x;
  for (std::uint32_t bits = std::bit_cast<std::uint32_t>(0x1p-30f); bits < std::bit_cast<std::uint32_t>(5.0f);
       bits += 256) {
    x.push_back(std::bit_cast<float>(bits));
    x.push_back(-x.back());
  }
  const auto y = xg::erf(xg::tensor<float>(x, {static_cast<std::int64_t>(x.size())})).to_vector();
  double worst = 0;
  float worst_at = 0;
  bool bounded = true, odd = true;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const long double want = std::erf(static_cast<long double>(x[i]));
    const float rounded = static_cast<float>(want);
    const double ulp = std::nextafter(std::fabs(rounded), 2.0f) - std::fabs(rounded);
    const double err = std::fabs(static_cast<double>(y[i]) - static_cast<double>(want)) / ulp;
    if (err > worst) worst = err, worst_at = x[i];
    bounded = bounded && std::fabs(y[i]) <= 1.0f;
    odd = odd && std::signbit(y[i]) == std::signbit(x[i]) && (i % 2 == 0 || y[i] == -y[i - 1]);
  }
  CAPTURE(worst_at);
  CHECK(worst <= 8.0);  // 6 with fused multiply-adds, 7 without
  CHECK(bounded);
  CHECK(odd);
}

TEST_CASE("numerics: tril and triu at the int64 limits keep everything or nothing; cumsum of integers wraps") {
  const auto x = xg::arange<std::int32_t>(6);
  const auto m = xg::reshape(x, {2, 3});
  CHECK(xg::tril(m, std::numeric_limits<std::int64_t>::max()).to_vector() == m.to_vector());
  CHECK(xg::triu(m, std::numeric_limits<std::int64_t>::min()).to_vector() == m.to_vector());
  CHECK(xg::tril(m, -2).to_vector() == std::vector<std::int32_t>(6, 0));
  CHECK(xg::triu(m, 3).to_vector() == std::vector<std::int32_t>(6, 0));
  CHECK(xg::cumsum(m, 1).to_vector() == std::vector<std::int32_t>{0, 1, 3, 3, 7, 12});
  const auto big = xg::tensor<std::int32_t>({std::numeric_limits<std::int32_t>::max(), 1});
  CHECK(xg::cumsum(big, 0).to_vector()[1] == std::numeric_limits<std::int32_t>::min());
  // Empty results whose other axes multiply to 2^40 return at once (found by the fuzzer).
  const std::int64_t huge = std::int64_t{1} << 40;
  CHECK(xg::cumsum(xg::zeros<float>({huge, 0}), 0).numel() == 0);
  CHECK(xg::take(xg::zeros<float>({huge, 3, 0}), xg::tensor<std::int32_t>({0, 2}), 1).shape() == xg::Shape{huge, 2, 0});
}

}  // namespace numerics_test
