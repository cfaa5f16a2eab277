// Each pass on small traced graphs: golden IR text before and after, and the values the
// optimized graph computes against eager.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <xgrad/backend/cpu/thread_pool.hpp>
#include <xgrad/xgrad.hpp>

#include "test_support.hpp"

namespace xg = xgrad;
using xgrad::testing::message_of;

namespace {

/// True when a and b hold the same bits.
template <class T> bool same_bits(const xg::Tensor<T>& a, const xg::Tensor<T>& b) {
  const auto x = a.to_vector(), y = b.to_vector();
  return a.shape() == b.shape() && std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
}

/// Sets the pool's thread count for a scope.
struct Threads {
  int saved = xg::cpu::num_threads();
  explicit Threads(int n) { xg::cpu::set_num_threads(n); }
  ~Threads() { xg::cpu::set_num_threads(saved); }
};

/// The body of a graph's text: the lines between "{" and "}", without source comments.
std::string body(const std::string& ir) {
  std::string out;
  std::size_t start = ir.find(") {\n") + 4, end = ir.find("\n}", start);
  std::istringstream lines(ir.substr(start, end - start));
  for (std::string line; std::getline(lines, line);) {
    if (auto hash = line.find("  #"); hash != std::string::npos) line.resize(hash);
    out += line + "\n";
  }
  return out;
}

/// O2 with every pass but `pass` switched off; `name` names the graph (and its fused bodies).
xg::JitConfig only(const std::string& pass, std::string name = {}) {
  xg::JitConfig config{.level = xg::JitLevel::O2, .name = std::move(name)};
  for (const auto& p : xg::passes::pass_names())
    if (p != pass) config.disabled_passes.push_back(p);
  return config;
}

template <class F, class... Args> std::string optimized(F f, xg::JitConfig config, const Args&... args) {
  return body(xg::jit(f, config).lower(args...).ir());
}

/// A small train step of a dense layer, tanh and a mean square loss, with plain SGD on w and b.
auto small_train_step(xg::Parameter<float>& w, xg::Parameter<float>& b) {
  return [&w, &b](xg::Tensor<float> x) {
    auto [loss, grads] = xg::value_and_grad([&] { return xg::mean(xg::square(xg::tanh(xg::matmul(x, w) + b))); },
                                            std::vector<xg::Tensor<float>>{w, b})();
    xg::no_grad off;
    w -= grads[0] * 0.1f;
    b -= grads[1] * 0.1f;
    return loss;
  };
}

}  // namespace

TEST_CASE("passes: dce drops what nothing reads, keeps prints and effects") {
  auto f = [](xg::Tensor<float> x) {
    auto unused = xg::exp(x);
    xg::print("x", x);
    return x * x;
  };
  auto x = xg::ones<float>({3});
  CHECK(optimized(f, {.level = xg::JitLevel::O0}, x) ==
        "  %1 : f32[3] = Exp(%0)\n"
        "  Print(%0) {label=\"x\"}\n"
        "  %2 : f32[3] = Mul(%0, %0)\n"
        "  return %2\n");
  CHECK(optimized(f, only("dce"), x) ==
        "  Print(%0) {label=\"x\"}\n"
        "  %1 : f32[3] = Mul(%0, %0)\n"
        "  return %1\n");
}

TEST_CASE("passes: cse keeps the first of equal computations") {
  auto f = [](xg::Tensor<float> x) { return xg::exp(x) * 2.0f + xg::exp(x) * 2.0f; };
  auto x = xg::ones<float>({3});
  CHECK(optimized(f, only("cse"), x) ==
        "  %1 : f32[3] = Exp(%0)\n"
        "  %2 : f32[] = Const() {value=2}\n"
        "  %3 : f32[3] = Mul(%1, %2)\n"
        "  %4 : f32[3] = Add(%3, %3)\n"
        "  return %4\n");
}

TEST_CASE("passes: fold computes constant subgraphs once, with the eager kernels") {
  auto f = [](xg::Tensor<float> x) { return x * (xg::full<float>({}, 2.0f) * 3.0f + 1.0f); };
  auto x = xg::ones<float>({3});
  CHECK(optimized(f, xg::JitConfig{.level = xg::JitLevel::O1}, x) ==
        "  %1 : f32[] = Const() {value=7}\n"
        "  %2 : f32[3] = Mul(%0, %1)\n"
        "  return %2\n");
  // A constant is not broadcast into a large one.
  auto g = [](xg::Tensor<float> v) {
    return xg::concat(
        std::vector<xg::Tensor<float>>{v, xg::broadcast_to(xg::full<float>({}, 1.0f), xg::Shape{100, 100})});
  };
  CHECK(optimized(g, only("fold"), xg::ones<float>({100, 100})).find("BroadcastTo") != std::string::npos);
  // Nor into one of more than 64 elements (a mean's gradient, 1/n spread over the input):
  // fusion runs the broadcast from the scalar, so no [16, 16] constant is stored or read.
  auto h = [](xg::Tensor<float> v) {
    auto spread = xg::broadcast_to(xg::full<float>({}, 0.5f), xg::Shape{16, 16});
    return v * (spread * 3.0f);
  };
  auto v = xg::ones<float>({16, 16});
  CHECK(optimized(h, xg::JitConfig{.level = xg::JitLevel::O1}, v).find("f32[16, 16] = Const") == std::string::npos);
  CHECK(optimized(h, {}, v).find("ops=\"BroadcastTo, Mul, Mul\"") != std::string::npos);
  CHECK(xg::jit(h)(v).to_vector() == h(v).to_vector());
}

TEST_CASE("passes: simplify removes identities; strict keeps those that change bits") {
  auto x = xg::ones<float>({2, 3});
  auto f = [](xg::Tensor<float> v) {
    auto a = -(-v) * 1.0f;
    auto b = xg::transpose(xg::transpose(a));
    auto c = xg::reshape(xg::reshape(b, {3, 2}), {6});
    return xg::exp(xg::log(c + 0.0f));
  };
  CHECK(optimized(f, xg::JitConfig{.level = xg::JitLevel::O1}, x) ==
        "  %1 : f32[6] = Reshape(%0) {shape=[6]}\n"
        "  return %1\n");
  CHECK(optimized(f, xg::JitConfig{.level = xg::JitLevel::O1, .strict = true}, x) ==
        "  %1 : f32[6] = Reshape(%0) {shape=[6]}\n"
        "  %2 : f32[] = Const() {value=0}\n"
        "  %3 : f32[6] = Add(%1, %2)\n"
        "  %4 : f32[6] = Log(%3)\n"
        "  %5 : f32[6] = Exp(%4)\n"
        "  return %5\n");
  // The result never aliases the argument: x * 1 returns a new tensor, as eagerly.
  auto one = xg::jit([](xg::Tensor<float> v) { return v * 1.0f; }, {.level = xg::JitLevel::O1});
  auto y = one(x);
  CHECK(y.impl()->storage != x.impl()->storage);
}

TEST_CASE("passes: an elementwise op reads a broadcast's input directly when it broadcasts the same") {
  auto f = [](xg::Tensor<float> x, xg::Tensor<float> b) { return x * xg::broadcast_to(b, xg::Shape{2, 3}); };
  auto x = xg::ones<float>({2, 3}), b = xg::tensor<float>({1, 2, 3});
  CHECK(optimized(f, only("simplify"), x, b) ==
        "  %2 : f32[2, 3] = BroadcastTo(%1) {shape=[2, 3]}\n"
        "  %3 : f32[2, 3] = Mul(%0, %1)\n"
        "  return %3\n");
  CHECK(xg::jit(f)(x, b).to_vector() == f(x, b).to_vector());
  // Not when the broadcast is what gives the output its shape.
  auto g = [](xg::Tensor<float> v, xg::Tensor<float> w) { return v * xg::broadcast_to(w, xg::Shape{2, 3}); };
  CHECK(optimized(g, only("simplify"), xg::ones<float>({3}), b).find("Mul(%0, %2)") != std::string::npos);
}

TEST_CASE("passes: simplify makes the sum of a broadcast one multiply, outside strict") {
  auto f = [](xg::Tensor<float> v) {
    auto wide = xg::broadcast_to(v, xg::Shape{4, 3});
    return xg::sum(wide, {0});
  };
  auto v = xg::tensor<float>({1, 2, 3});
  CHECK(optimized(f, xg::JitConfig{.level = xg::JitLevel::O1}, v) ==
        "  %1 : f32[1, 3] = Reshape(%0) {shape=[1, 3]}\n"
        "  %2 : f32[] = Const() {value=4}\n"
        "  %3 : f32[1, 3] = Mul(%1, %2)\n"
        "  %4 : f32[3] = Reshape(%3) {shape=[3]}\n"
        "  return %4\n");
  CHECK(xg::jit(f)(v).to_vector() == std::vector<float>{4, 8, 12});
  CHECK(optimized(f, xg::JitConfig{.level = xg::JitLevel::O1, .strict = true}, v).find("SumTo") != std::string::npos);
  // Not when a summed axis holds different values: that sum is real work.
  auto g = [](xg::Tensor<float> m) {
    auto wide = xg::broadcast_to(m, xg::Shape{2, 4, 3});
    return xg::sum(wide, {0, 1});
  };
  auto m = xg::reshape(xg::tensor<float>({1, 2, 3, 4, 5, 6}), {2, 1, 3});
  CHECK(optimized(g, xg::JitConfig{.level = xg::JitLevel::O1}, m).find("SumTo") != std::string::npos);
  // A sum of no copies is 0, even of a NaN: not NaN * 0.
  auto none = [](xg::Tensor<float> s) {
    auto wide = xg::broadcast_to(s, xg::Shape{0, 3});
    return xg::sum(wide, {0});
  };
  auto nan = xg::full<float>({3}, std::numeric_limits<float>::quiet_NaN());
  CHECK(xg::jit(none)(nan).to_vector() == std::vector<float>{0, 0, 0});
  // Where it comes from: a bias's gradient under a mean loss sums a broadcast scalar.
  auto loss = [](xg::Tensor<float> x, xg::Tensor<float> b) { return xg::mean(x + b); };
  auto db = [&](xg::Tensor<float> x, xg::Tensor<float> b) { return xg::grad(loss, xg::argnums<1>)(x, b); };
  auto x = xg::ones<float>({8, 3});
  auto b = xg::tensor<float>({0.5, -1, 2});
  CHECK(optimized(db, xg::JitConfig{.level = xg::JitLevel::O1}, x, b).find("SumTo") == std::string::npos);
  auto want = db(x, b).to_vector();
  auto got = xg::jit(db)(x, b).to_vector();
  REQUIRE(got.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-6));
}

TEST_CASE("passes: simplify makes a multiply feeding only an add one fma, outside strict") {
  auto f = [](xg::Tensor<float> v, xg::Tensor<float> w) {
    auto p = v * w;
    return p + 0.5f;
  };
  auto v = xg::tensor<float>({1, 2, 3}), w = xg::tensor<float>({4, 5, 6});
  CHECK(optimized(f, xg::JitConfig{.level = xg::JitLevel::O1}, v, w) ==
        "  %2 : f32[] = Const() {value=0.5}\n"
        "  %3 : f32[3] = Fma(%0, %1, %2)\n"
        "  return %3\n");
  CHECK(optimized(f, xg::JitConfig{.level = xg::JitLevel::O1, .strict = true}, v, w).find("Fma") == std::string::npos);
  CHECK(xg::jit(f)(v, w).to_vector() == std::vector<float>{4.5f, 10.5f, 18.5f});
  // One rounding: 1 - 2^-26 is not a float, so (1 + 2^-13)(1 - 2^-13) - 1 is 0 unfused and
  // -2^-26 as an fma, jitted or called directly.
  const float e = 1.0f / 8192;
  auto near = [](xg::Tensor<float> a, xg::Tensor<float> b) {
    auto p = a * b;
    return p - 1.0f;
  };
  auto a = xg::full<float>({20}, 1 + e), b = xg::full<float>({20}, 1 - e);
  CHECK(near(a, b).to_vector() == std::vector<float>(20, 0.0f));
  CHECK(xg::fma(a, b, xg::full<float>({}, -1.0f)).to_vector() == std::vector<float>(20, -e * e));
  // Not when the product is read again: the fma would not save its pass.
  auto twice = [](xg::Tensor<float> p, xg::Tensor<float> q) {
    auto m = p * q;
    return m + m;
  };
  CHECK(optimized(twice, xg::JitConfig{.level = xg::JitLevel::O1}, v, w).find("Fma") == std::string::npos);
}

TEST_CASE("passes: simplify joins neighbouring slices' gradients, and neighbouring slices, into one") {
  using F = xg::Tensor<float>;
  const xg::Shape whole{2, 5};
  xg::JitConfig simplify = only("simplify");  // and DCE, which removes what a rewrite leaves unread
  std::erase(simplify.disabled_passes, "dce");
  // The gradient of a split: each part placed in zeros, then added.
  auto placed = [&](F a, F b) {
    return xg::slice_backward(b, whole, {0, 2}) + xg::slice_backward(a, whole, {0, 0}) * 1.0f;
  };
  const auto a = xg::tensor<float>({1, -0.0f, 3, 4}, {2, 2}), b = xg::tensor<float>({5, 6, 7, 8, 9, 10}, {2, 3});
  CHECK(optimized(placed, simplify, a, b) ==
        "  %2 : f32[2, 5] = Concat(%0, %1) {axis=1}\n"
        "  return %2\n");
  // Under strict the add stays: it turns a's -0 into +0, which eager keeps.
  xg::JitConfig strict = simplify;
  strict.strict = true;
  CHECK(optimized(placed, strict, a, b).find("Add(") != std::string::npos);
  const auto eager = placed(a, b).to_vector();
  CHECK(xg::jit(placed, strict)(a, b).to_vector() == eager);
  const auto joined = xg::jit(placed)(a, b).to_vector();
  CHECK(joined == eager);          // equal, -0 == +0 ...
  CHECK(std::signbit(joined[1]));  // ... but the concat keeps a's -0
  CHECK_FALSE(std::signbit(eager[1]));
  // Parts that do not meet stay as they are.
  auto apart = [](F x, F y) { return xg::slice_backward(x, {2, 6}, {0, 0}) + xg::slice_backward(y, {2, 6}, {0, 3}); };
  CHECK(optimized(apart, simplify, a, b).find("Concat") == std::string::npos);
  // Neighbouring slices joined again are the slice they make up; a slice of a concat that is
  // one of its parts is that part.
  auto rejoined = [](F x) {
    return xg::concat<float>({xg::slice(x, {0, 1}, {2, 2}), xg::slice(x, {0, 3}, {2, 1})}, 1);
  };
  const auto x = xg::tensor<float>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {2, 5});
  CHECK(optimized(rejoined, simplify, x) ==
        "  %1 : f32[2, 3] = Slice(%0) {begin=[0, 1], size=[2, 3]}\n"
        "  return %1\n");
  CHECK(xg::jit(rejoined)(x).to_vector() == rejoined(x).to_vector());
  auto part = [](F p, F q) { return xg::slice(xg::concat<float>({p, q}, 1), {0, 2}, {2, 3}) * 2.0f; };
  CHECK(optimized(part, simplify, a, b) ==
        "  %2 : f32[] = Const() {value=2}\n"
        "  %3 : f32[2, 3] = Mul(%1, %2)\n"
        "  return %3\n");
  // The whole of an argument is not handed back as the result: the caller would get its own tensor.
  auto all = [](F y) { return xg::concat<float>({xg::slice(y, {0, 0}, {2, 2}), xg::slice(y, {0, 2}, {2, 3})}, 1); };
  const auto copy = xg::jit(all)(x);
  CHECK(copy.to_vector() == x.to_vector());
  CHECK(copy.data() != x.data());
}

TEST_CASE("passes: simplify moves ReLU's gradient through max pooling's, onto the pooled tensor") {
  auto f = [](xg::Tensor<float> x, xg::Tensor<float> w) {
    return xg::grad([&](xg::Tensor<float> v) { return xg::sum(xg::max_pool2d(xg::relu(v), 2, 2) * w); })(x);
  };
  // Negative windows, zeros, ties, a NaN, an infinity: every case of both masks.
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  auto x = xg::reshape(xg::tensor<float>({-1, -2, 0, 0, 3, 3, -5, 2, nan, 1, 0,  -0.0f, 4, inf, 2, 2,
                                          -3, -3, 0, 5, 1, 7, -1, 7, 2,   0, -4, -4,    0, 0,   9, 1}),
                       {1, 2, 4, 4});
  auto w = xg::reshape(xg::arange<float>(1, 9), {1, 2, 2, 2});
  const std::string ir = optimized(f, xg::JitConfig{.level = xg::JitLevel::O1}, x, w);
  // The mask is taken of the pooled [1, 2, 2, 2] tensor; no Select of the full one is left.
  CHECK(ir.find("f32[1, 2, 2, 2] = Select(") != std::string::npos);
  CHECK(ir.find("f32[1, 2, 4, 4] = Select(") == std::string::npos);
  const auto want = f(x, w).to_vector();
  for (bool strict : {false, true}) {
    CAPTURE(strict);
    const auto got = xg::jit(f, {.strict = strict})(x, w).to_vector();
    REQUIRE(got.size() == want.size());
    CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);  // bitwise, -0 included
  }
  // At O2 the mask moves on into the argmax (-1 where the maximum is not above 0), and the put
  // reads the gradient itself: no Select is left.
  const std::string ir2 = optimized(f, xg::JitConfig{}, x, w);
  CHECK(ir2.find("drop_nonpositive=true") != std::string::npos);
  CHECK(ir2.find("= Select(") == std::string::npos);
  // Not when the argmax is read elsewhere: here it is returned, and must keep every window's.
  const xg::cpu::Pool2dGeometry geo{1, 2, 4, 4, 2, 2, 2, 2, 0, 0, 2, 2};
  auto with_argmax = [&](xg::Tensor<float> v, xg::Tensor<float> u) {
    return std::tuple{f(v, u), xg::detail::max_pool_argmax(xg::relu(v), geo, xg::SourceLoc::current())};
  };
  const auto [g_eager, idx_eager] = with_argmax(x, w);
  const auto [g_jit, idx_jit] = xg::jit(with_argmax)(x, w);
  CHECK(idx_jit.to_vector() == idx_eager.to_vector());
  CHECK(std::memcmp(g_jit.to_vector().data(), g_eager.to_vector().data(), want.size() * sizeof(float)) == 0);
  CHECK(xg::jit(with_argmax).lower(x, w).ir().find("drop_nonpositive") == std::string::npos);
  // Not for a mask of another tensor.
  auto other = [](xg::Tensor<float> y, xg::Tensor<float> g) {
    auto back = xg::grad([&](xg::Tensor<float> v) { return xg::sum(xg::max_pool2d(v, 2, 2) * g); })(y);
    return xg::where(y * 2.0f > 0.0f, back, 0.0f);
  };
  CHECK(optimized(other, xg::JitConfig{.level = xg::JitLevel::O1}, x, w).find("f32[1, 2, 4, 4] = Select(") !=
        std::string::npos);
}

TEST_CASE("max pooling finds each window's argmax once for the forward and the backward, at every level") {
  // Overlapping windows (kernel 3, stride 2, same padding) so an element can win two windows,
  // and values on a coarse grid so windows tie.
  auto f = [](xg::Tensor<double> x) {
    return xg::grad([](xg::Tensor<double> v) {
      auto p = xg::max_pool2d(v, 3, 2, xg::PadMode::same);
      return xg::sum(p * p);
    })(x);
  };
  auto x = xg::cast<double>(xg::cast<std::int32_t>(xg::randn<double>({2, 3, 9, 8}, 4) * 2.0)) / 2.0;
  const auto count = [](const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  const auto want = f(x).to_vector();
  for (auto level : {xg::JitLevel::O0, xg::JitLevel::O1, xg::JitLevel::O2}) {
    for (bool strict : {false, true}) {
      CAPTURE(static_cast<int>(level));
      CAPTURE(strict);
      const xg::JitConfig config{.level = level, .strict = strict};
      const std::string ir = optimized(f, config, x);
      // At O2 fusion pairs the argmax with the forward's take: one pass makes both.
      const bool paired = level == xg::JitLevel::O2;
      CHECK(count(ir, "i32[2, 3, 5, 4] = MaxPoolArgmax(") == (paired ? 0 : 1));
      CHECK(count(ir, "i32[2, 3, 5, 4]) = MaxPoolWithArgmax(") == (paired ? 1 : 0));
      CHECK(count(ir, "= MaxPoolTake(") == (paired ? 0 : 1));
      CHECK(count(ir, "f64[2, 3, 9, 8] = MaxPoolPut(") == 1);
      const auto got = xg::jit(f, config)(x).to_vector();
      REQUIRE(got.size() == want.size());
      CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(double)) == 0);
    }
  }

  // Take and put are adjoint, as their gradient rules say: <take(v), u> = <v, put(u)>.
  const xg::cpu::Pool2dGeometry geo{2, 3, 9, 8, 3, 3, 2, 2, 1, 0, 5, 4};  // same padding: 1 row above, no column
  const auto idx = xg::detail::max_pool_argmax(x, geo, xg::SourceLoc::current());
  auto v = xg::randn<double>({2, 3, 9, 8}, 5), u = xg::randn<double>({2, 3, 5, 4}, 6);
  const double lhs = xg::sum(xg::detail::max_pool_take(v, idx, geo, xg::SourceLoc::current()) * u).item();
  const double rhs = xg::sum(v * xg::detail::max_pool_put(idx, u, geo, xg::SourceLoc::current())).item();
  CHECK(lhs == doctest::Approx(rhs).epsilon(1e-12));
  CHECK(xg::detail::max_pool_take(x, idx, geo, xg::SourceLoc::current()).to_vector() ==
        xg::max_pool2d(x, 3, 2, xg::PadMode::same).to_vector());
}

TEST_CASE("passes: fuse takes a convolution's gradients through max pooling from the pooled gradient") {
  // A convnet block, conv -> ReLU -> 2 x 2 max pooling, and the gradients of its input and of its
  // weights. At O2 both read the argmax and the pooled gradient (the put and its zeros are gone);
  // their sums run in another order, so the results are close to eager's, not bitwise. Strict
  // mode and O1 keep the put and eager's bits.
  auto f = [](xg::Tensor<float> x, xg::Tensor<float> w) {
    return xg::grad(
        [](xg::Tensor<float> v, xg::Tensor<float> u) {
          auto p = xg::max_pool2d(xg::relu(xg::conv2d(v, u, {.pad_mode = xg::PadMode::valid})), 2, 2);
          return xg::sum(p * p);
        },
        xg::argnums<0, 1>)(x, w);
  };
  const auto x = xg::randn<float>({3, 4, 12, 11}, 1), w = xg::randn<float>({6, 4, 5, 5}, 2);
  const auto [want_x, want_w] = f(x, w);
  const auto count = [](const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  const auto close = [](const xg::Tensor<float>& got, const xg::Tensor<float>& want) {
    const auto a = got.to_vector(), b = want.to_vector();
    REQUIRE(a.size() == b.size());
    double worst = 0, scale = 1;
    for (std::size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
      scale = std::max(scale, std::abs(static_cast<double>(b[i])));
    }
    CAPTURE(worst);
    CHECK(worst <= 1e-5 * scale);
  };
  const std::string ir = optimized(f, xg::JitConfig{}, x, w);
  CHECK(count(ir, "f32[3, 4, 12, 11] = Conv2DInputGradPooled(") == 1);
  CHECK(count(ir, "f32[6, 4, 5, 5] = Conv2DWeightGradPooled(") == 1);
  CHECK(count(ir, "= MaxPoolPut(") == 0);
  CHECK(count(ir, "= Conv2DReLUMaxPool(") == 1);
  const auto [got_x, got_w] = xg::jit(f)(x, w);
  close(got_x, want_x);
  close(got_w, want_w);
  for (const xg::JitConfig& config : {xg::JitConfig{.strict = true}, xg::JitConfig{.level = xg::JitLevel::O1}}) {
    CAPTURE(config.strict);
    const std::string kept = optimized(f, config, x, w);
    CHECK(count(kept, "= MaxPoolPut(") == 1);
    CHECK(count(kept, "Pooled(") == 0);
    // The forward block is exact: strict fuses it too (and its gradients keep eager's bits).
    CHECK(count(kept, "= Conv2DReLUMaxPool(") == (config.strict ? 1 : 0));
    const auto [exact_x, exact_w] = xg::jit(f, config)(x, w);
    CHECK(exact_x.to_vector() == want_x.to_vector());
    CHECK(exact_w.to_vector() == want_w.to_vector());
  }
}

TEST_CASE("passes: fuse pools a convnet block's convolution in cache, in inference and in a train step") {
  // max_pool2d(relu(conv2d(x, w) [+ b])) as one Conv2DReLUMaxPool node, the convolution's output
  // never stored whole: with the pooled values bit for bit as eager's, float and double, including
  // a NaN, an infinity and windows whose maximum is not above 0. Not when another op reads the
  // ReLU's output (it must then be stored), nor for 3 x 3 pooling (no in-cache route).
  const auto count = [](const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  auto check = [&]<class T>(std::type_identity<T>) {
    auto block = [](xg::Tensor<T> x, xg::Tensor<T> w) {
      return xg::max_pool2d(xg::relu(xg::conv2d(x, w, {.pad_mode = xg::PadMode::valid})), 2, 2);
    };
    for (const std::int64_t c_out : {3, 16}) {  // the shifted product, the direct kernel
      CAPTURE(c_out);
      auto x = xg::randn<T>({3, 2, 13, 12}, 7);
      auto w = xg::randn<T>({c_out, 2, 3, 3}, 8);
      std::vector<T> xs = x.to_vector();
      xs[5] = std::numeric_limits<T>::quiet_NaN();
      xs[40] = std::numeric_limits<T>::infinity();
      x = xg::tensor<T>(xs, {3, 2, 13, 12});
      const auto want = block(x, w).to_vector();
      CHECK(std::count_if(want.begin(), want.end(), [](T v) { return v == T(0); }) > 0);
      CHECK(std::count_if(want.begin(), want.end(), [](T v) { return std::isnan(v); }) > 0);
      const std::string ir = optimized(block, xg::JitConfig{}, x, w);
      CHECK(count(ir, "= Conv2DReLUMaxPool(") == 1);
      CHECK(count(ir, "Conv2D(") == 0);
      const auto got = xg::jit(block)(x, w).to_vector();
      REQUIRE(got.size() == want.size());
      CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(T)) == 0);
      // With a bias (bias_add, as nn::Conv2d adds one): the add goes into the block too.
      auto biased = [](xg::Tensor<T> x, xg::Tensor<T> w, xg::Tensor<T> b) {
        return xg::max_pool2d(xg::relu(xg::bias_add(xg::conv2d(x, w, {.pad_mode = xg::PadMode::valid}), b)), 2, 2);
      };
      const auto b = xg::randn<T>({c_out}, 9);
      const std::string biased_ir = optimized(biased, xg::JitConfig{}, x, w, b);
      CHECK(count(biased_ir, "= Conv2DReLUMaxPool(") == 1);
      CHECK(count(biased_ir, "= Add(") == 0);
      const auto want_biased = biased(x, w, b).to_vector(), got_biased = xg::jit(biased)(x, w, b).to_vector();
      REQUIRE(got_biased.size() == want_biased.size());
      CHECK(std::memcmp(got_biased.data(), want_biased.data(), want_biased.size() * sizeof(T)) == 0);
    }
  };
  check(std::type_identity<float>{});
  check(std::type_identity<double>{});

  const auto x = xg::randn<float>({2, 1, 12, 12}, 1), w = xg::randn<float>({4, 1, 5, 5}, 2);
  auto relu_read_twice = [](xg::Tensor<float> v, xg::Tensor<float> u) {
    auto r = xg::relu(xg::conv2d(v, u, {.pad_mode = xg::PadMode::valid}));
    return xg::sum(xg::max_pool2d(r, 2, 2)) + xg::sum(r);
  };
  CHECK(count(optimized(relu_read_twice, xg::JitConfig{}, x, w), "Conv2DReLUMaxPool(") == 0);
  CHECK(xg::jit(relu_read_twice)(x, w).item() == doctest::Approx(relu_read_twice(x, w).item()).epsilon(1e-5));
  auto wide_pool = [](xg::Tensor<float> v, xg::Tensor<float> u) {
    return xg::max_pool2d(xg::relu(xg::conv2d(v, u, {.pad_mode = xg::PadMode::valid})), 3, 3);
  };
  CHECK(count(optimized(wide_pool, xg::JitConfig{}, x, w), "Conv2DReLUMaxPool(") == 0);
}

TEST_CASE("passes: optimized graphs compute what eager computes; bad pass names are refused") {
  auto f = [](xg::Tensor<double> v, xg::Tensor<double> w) {
    auto h = xg::tanh(xg::matmul(v, w) * 1.0) + xg::tanh(xg::matmul(v, w) * 1.0);
    return xg::sum(h * (xg::full<double>({}, 0.5) + 0.25));
  };
  auto v = xg::randn<double>({4, 3}, 1), w = xg::randn<double>({3, 5}, 2);
  auto eager = xg::grad(f, xg::argnums<0, 1>)(v, w);
  for (auto level : {xg::JitLevel::O0, xg::JitLevel::O1, xg::JitLevel::O2}) {
    auto [gv, gw] = xg::jit(xg::grad(f, xg::argnums<0, 1>), {.level = level, .strict = true})(v, w);
    CHECK(gv.to_vector() == std::get<0>(eager).to_vector());
    CHECK(gw.to_vector() == std::get<1>(eager).to_vector());
  }
  auto msg = message_of<xg::ValueError>([&] { xg::jit(f, {.disabled_passes = {"fusion-typo"}})(v, w); });
  CHECK(msg.find("unknown pass 'fusion-typo'") != std::string::npos);
}

namespace {

/// The whole IR text (graph and subgraphs) without source comments or the memory-plan line.
std::string all_of(const std::string& ir) {
  std::string out;
  std::istringstream lines(ir);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("# memory plan", 0) == 0) continue;
    if (auto hash = line.find("  #"); hash != std::string::npos) line.resize(hash);
    out += line + "\n";
  }
  return out;
}

}  // namespace

TEST_CASE("passes: layout folds multi-head attention's head split and merge into attention and its gradient") {
  xg::init::set_seed(3);
  xg::nn::MultiheadAttention attention(16, 4, {.causal = true});
  const auto params = attention.parameters();
  const auto x = xg::randn<float>({2, 9, 16}, 1), w = xg::randn<float>({2, 9, 16}, 2);
  auto step = [&](const xg::Tensor<float>& input) {
    auto [loss, grads] = xg::value_and_grad([&] { return xg::sum(attention(input) * w); }, params)();
    grads.push_back(loss);
    return grads;
  };
  const std::string folded = all_of(xg::jit(step).lower(x).ir());
  // Both ops read the projection's columns (q, k, v at 0, 16, 32 of 48) and no copy is left:
  // no transpose, no slice, no slice gradient, no concat.
  CHECK(folded.find("ScaledDotProductAttentionWithLse(") != std::string::npos);
  CHECK(folded.find("ScaledDotProductAttentionGradWithLse(") != std::string::npos);
  std::size_t layouts = 0;
  for (std::size_t at = 0; (at = folded.find("heads=4 of width 48 at columns 0, 16, 32", at)) != std::string::npos;
       ++at)
    ++layouts;
  CHECK(layouts == 2);
  for (const char* copy : {"Transpose(", "Slice(", "SliceGrad(", "Concat("}) {
    CAPTURE(copy);
    CHECK(folded.find(copy) == std::string::npos);
  }
  const std::string unfolded = all_of(xg::jit(step, {.disabled_passes = {"layout"}}).lower(x).ir());
  CHECK(unfolded.find("heads=") == std::string::npos);
  CHECK(unfolded.find("Transpose(") != std::string::npos);
  // The same values as eager mode: the kernels do the same arithmetic, only reading elsewhere.
  const auto eager = step(x);
  const auto compiled = xg::jit(step)(x);
  REQUIRE(compiled.size() == eager.size());
  for (std::size_t i = 0; i < eager.size(); ++i) {
    CAPTURE(i);
    CHECK(xg::max(xg::abs(compiled[i] - eager[i])).item() <= 1e-5f * (1 + xg::max(xg::abs(eager[i])).item()));
  }
  // Heads whose rows span two rows of the projection are no column ranges of it: left as they
  // are (here each [8, 16] slice is reshaped to 4 rows of 2 heads of 16).
  auto spanning = [](const xg::Tensor<float>& qkv) {
    auto heads = [&](std::int64_t column) {
      const auto part = xg::reshape(xg::slice(qkv, {0, 0, column}, {2, 8, 16}), {2, 4, 2, 16});
      return xg::transpose(part, {0, 2, 1, 3});
    };
    return xg::scaled_dot_product_attention(heads(0), heads(16), heads(32), {.causal = true});
  };
  const auto qkv = xg::randn<float>({2, 8, 48}, 4);
  CHECK(all_of(xg::jit(spanning).lower(qkv).ir()).find("heads=") == std::string::npos);
  CHECK(xg::max(xg::abs(xg::jit(spanning)(qkv) - spanning(qkv))).item() < 1e-6f);
  // Cross attention reads queries and keys from different projections: left as it was.
  const auto memory = xg::randn<float>({2, 5, 16}, 3);
  auto cross = [&](const xg::Tensor<float>& input, const xg::Tensor<float>& mem) { return attention(input, mem); };
  CHECK(all_of(xg::jit(cross).lower(x, memory).ir()).find("heads=") == std::string::npos);
  CHECK(xg::max(xg::abs(xg::jit(cross)(x, memory) - cross(x, memory))).item() < 1e-5f);
}

TEST_CASE("passes: fuse gives attention's gradient the log-denominators its forward made, with the same bits") {
  const auto q = xg::randn<float>({3, 70, 8}, 1), k = xg::randn<float>({3, 70, 8}, 2),
             v = xg::randn<float>({3, 70, 5}, 3);
  const auto w = xg::randn<float>({3, 70, 5}, 4);
  auto step = [](xg::Tensor<float> a, xg::Tensor<float> b, xg::Tensor<float> c, xg::Tensor<float> weights) {
    auto loss = [&](xg::Tensor<float> x, xg::Tensor<float> y, xg::Tensor<float> z) {
      return xg::sum(xg::scaled_dot_product_attention(x, y, z, {.causal = true}) * weights);
    };
    auto [ga, gb, gc] = xg::grad(loss, xg::argnums<0, 1, 2>)(a, b, c);
    return std::make_tuple(loss(a, b, c), ga, gb, gc);
  };
  const std::string ir = body(xg::jit(step, only("fuse")).lower(q, k, v, w).ir());
  INFO(ir);
  // (%out : f32[3, 70, 5], %lse : f32[3, 70]) = ScaledDotProductAttentionWithLse(q, k, v), and the
  // gradient reads q, k, v, out, its upstream gradient and lse.
  const auto forward = ir.find(" : f32[3, 70]) = ScaledDotProductAttentionWithLse(");
  REQUIRE(forward != std::string::npos);
  const auto lse_at = ir.rfind('%', forward);
  const std::string lse = ir.substr(lse_at, forward - lse_at);
  const auto backward = ir.find(" : f32[3, 1470] = ScaledDotProductAttentionGradWithLse(");
  REQUIRE(backward != std::string::npos);
  CHECK(ir.find(", " + lse + ") {causal=true", backward) == ir.find(") {causal=true", backward) - lse.size() - 2);
  CHECK(ir.find("= ScaledDotProductAttentionGrad(") == std::string::npos);
  // Exact (strict too), on the cpu (past one 64-query block) and on Device::thrust.
  const auto eager = step(q, k, v, w);
  const auto compiled = xg::jit(step, {.strict = true})(q, k, v, w);
  CHECK(same_bits(std::get<0>(compiled), std::get<0>(eager)));
  CHECK(same_bits(std::get<1>(compiled), std::get<1>(eager)));
  CHECK(same_bits(std::get<2>(compiled), std::get<2>(eager)));
  CHECK(same_bits(std::get<3>(compiled), std::get<3>(eager)));
  // Long sequences, which the forward runs in wider blocks: the gradient's own log-denominators
  // (eagerly) come out in the same blocks, with the same bits.
  const auto lq = xg::randn<float>({1, 600, 4}, 5), lk = xg::randn<float>({1, 600, 4}, 6);
  const auto lv = xg::randn<float>({1, 600, 3}, 7), lw = xg::randn<float>({1, 600, 3}, 8);
  const auto long_eager = step(lq, lk, lv, lw);
  const auto long_compiled = xg::jit(step, {.strict = true})(lq, lk, lv, lw);
  CHECK(same_bits(std::get<1>(long_compiled), std::get<1>(long_eager)));
  CHECK(same_bits(std::get<2>(long_compiled), std::get<2>(long_eager)));
#if defined(XGRAD_WITH_THRUST)
  const auto dq = q.to(xg::Device::thrust), dk = k.to(xg::Device::thrust), dv = v.to(xg::Device::thrust);
  const auto dw = w.to(xg::Device::thrust);
  const auto on_device = xg::jit(step)(dq, dk, dv, dw);
  const auto eager_device = step(dq, dk, dv, dw);
  CHECK(same_bits(std::get<1>(on_device).to(xg::Device::cpu), std::get<1>(eager_device).to(xg::Device::cpu)));
  CHECK(same_bits(std::get<3>(on_device).to(xg::Device::cpu), std::get<3>(eager_device).to(xg::Device::cpu)));
#endif
}

TEST_CASE("passes: fuse makes one kernel of an elementwise chain, broadcasts included") {
  // One op per statement: the order of evaluation of an expression's operands is unspecified.
  auto f = [](xg::Tensor<float> x, xg::Tensor<float> b) {
    auto t = xg::tanh(x * 1.5f + b);
    auto s = xg::sigmoid(x);
    auto q = x * x;
    return t * s + q;
  };
  auto x = xg::randn<float>({4, 1000}, 1), b = xg::randn<float>({1000}, 2);
  auto config = only("fuse", "chain");
  CHECK(all_of(xg::jit(f, config).lower(x, b).ir()) ==
        "graph chain(\n"
        "    %0 : f32[4, 1000]\n"
        "    %1 : f32[1000]\n"
        ") {\n"
        "  %2 : f32[] = Const() {value=1.5}\n"
        "  %3 : f32[4, 1000] = Fused(%0, %2, %1) {body=chain.fused0, ops=\"Mul, Add, Tanh, Sigmoid, Mul, Mul, Add\", "
        "merged=\"Add+Tanh, Sigmoid+Mul\"}\n"
        "  return %3\n"
        "}\n"
        "\n"
        "graph chain.fused0(\n"
        "    %0 : f32[4, 1000]\n"
        "    %1 : f32[]\n"
        "    %2 : f32[1000]\n"
        ") {\n"
        "  %3 : f32[4, 1000] = Mul(%0, %1)\n"
        "  %4 : f32[4, 1000] = Add(%3, %2)\n"
        "  %5 : f32[4, 1000] = Tanh(%4)\n"
        "  %6 : f32[4, 1000] = Sigmoid(%0)\n"
        "  %7 : f32[4, 1000] = Mul(%0, %0)\n"
        "  %8 : f32[4, 1000] = Mul(%5, %6)\n"
        "  %9 : f32[4, 1000] = Add(%8, %7)\n"
        "  return %9\n"
        "}\n");
  // The same bits as eager: every op through the same xsimd code, tails included.
  auto fused = xg::jit(f, config)(x, b).to_vector();
  auto eager = f(x, b).to_vector();
  REQUIRE(fused.size() == eager.size());
  CHECK(std::memcmp(fused.data(), eager.data(), fused.size() * sizeof(float)) == 0);
}

namespace {

/// Each unary op with a batch body, as a test calls it.
template <class T> std::vector<std::pair<std::string, xg::Tensor<T> (*)(const xg::Tensor<T>&)>> unary_ops() {
  return {{"Neg", [](const xg::Tensor<T>& x) { return xg::neg(x); }},
          {"Exp", [](const xg::Tensor<T>& x) { return xg::exp(x); }},
          {"Log", [](const xg::Tensor<T>& x) { return xg::log(x); }},
          {"Sqrt", [](const xg::Tensor<T>& x) { return xg::sqrt(x); }},
          {"Rsqrt", [](const xg::Tensor<T>& x) { return xg::rsqrt(x); }},
          {"Tanh", [](const xg::Tensor<T>& x) { return xg::tanh(x); }},
          {"Sigmoid", [](const xg::Tensor<T>& x) { return xg::sigmoid(x); }},
          {"ReLU", [](const xg::Tensor<T>& x) { return xg::relu(x); }},
          {"Sign", [](const xg::Tensor<T>& x) { return xg::sign(x); }},
          {"Abs", [](const xg::Tensor<T>& x) { return xg::abs(x); }},
          {"Square", [](const xg::Tensor<T>& x) { return xg::square(x); }},
          {"Sin", [](const xg::Tensor<T>& x) { return xg::sin(x); }},
          {"Cos", [](const xg::Tensor<T>& x) { return xg::cos(x); }}};
}

/// Every merged kernel of every unary op at T: jitted (strict, so no rewrite changes a bit)
/// against eager, bit for bit, and the pair named in the fused node's `merged` attribute;
/// float only has merged kernels, so a double group names none and runs op by op, as bitwise.
/// x spans two blocks with a tail; b is broadcast (gathered per block), s a scalar.
template <class T> void check_merged_kernels() {
  auto x = xg::randn<T>({3, 333}, 5), y = xg::randn<T>({3, 333}, 6), b = xg::randn<T>({333}, 7);
  auto s = xg::scalar<T>(T(0.75));
  using Args = std::tuple<xg::Tensor<T>, xg::Tensor<T>, xg::Tensor<T>, xg::Tensor<T>>;
  using Unary = xg::Tensor<T> (*)(const xg::Tensor<T>&);
  // Each case: the pair the kernel should merge (with "U" for the unary op) and the function.
  using Case = std::pair<std::string, std::function<xg::Tensor<T>(Unary, const Args&)>>;
  const std::vector<Case> cases = {
      {"Add+U", [](Unary u, const Args& a) { return u(std::get<0>(a) + std::get<2>(a)); }},
      {"Sub+U", [](Unary u, const Args& a) { return u(std::get<0>(a) - std::get<3>(a)); }},
      {"Mul+U", [](Unary u, const Args& a) { return u(std::get<3>(a) * std::get<0>(a)); }},
      {"Fma+U", [](Unary u, const Args& a) { return u(xg::fma(std::get<0>(a), std::get<3>(a), std::get<1>(a))); }},
      {"U+Add", [](Unary u, const Args& a) { return u(std::get<0>(a)) + std::get<2>(a); }},
      {"U+Add", [](Unary u, const Args& a) { return std::get<1>(a) + u(std::get<0>(a)); }},
      {"U+Mul", [](Unary u, const Args& a) { return u(std::get<0>(a)) * std::get<3>(a); }},
      {"U+Mul", [](Unary u, const Args& a) { return std::get<1>(a) * u(std::get<0>(a)); }},
      {"U+Fma", [](Unary u, const Args& a) { return xg::fma(u(std::get<0>(a)), std::get<1>(a), std::get<2>(a)); }},
      {"U+Fma", [](Unary u, const Args& a) { return xg::fma(std::get<3>(a), u(std::get<0>(a)), std::get<1>(a)); }},
      {"U+Fma", [](Unary u, const Args& a) { return xg::fma(std::get<2>(a), std::get<1>(a), u(std::get<0>(a))); }},
  };
  for (const auto& op : unary_ops<T>())
    for (std::size_t i = 0; i < cases.size(); ++i) {  // no structured binding: clang 14 cannot capture one in CAPTURE
      const auto& name = op.first;
      const auto& unary = op.second;
      CAPTURE(name);
      CAPTURE(i);
      auto f = [&](const xg::Tensor<T>& x_, const xg::Tensor<T>& y_, const xg::Tensor<T>& b_, const xg::Tensor<T>& s_) {
        return cases[i].second(unary, Args{x_, y_, b_, s_});
      };
      auto jitted = xg::jit(f, {.strict = true});
      std::string pair = cases[i].first;
      pair.replace(pair.find('U'), 1, name);
      const std::string ir = jitted.lower(x, y, b, s).ir();
      if constexpr (std::is_same_v<T, float>) {
        CHECK(ir.find("merged=\"" + pair + "\"") != std::string::npos);
      } else {
        CHECK(ir.find("Fused(") != std::string::npos);
        CHECK(ir.find("merged=") == std::string::npos);
      }
      const auto got = jitted(x, y, b, s).to_vector(), want = f(x, y, b, s).to_vector();
      REQUIRE(got.size() == want.size());
      CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(T)) == 0);
    }
}

}  // namespace

TEST_CASE("passes: a fused unary op runs with the cheap op feeding it or reading it in one loop, bitwise") {
  check_merged_kernels<float>();
  check_merged_kernels<double>();

  // Not merged: a value also read by another step, or also returned.
  auto shared = [](xg::Tensor<float> x) {
    auto a = x + 1.0f;
    auto t = xg::tanh(a);
    return t * a;  // Add's result read twice: only Tanh+Mul merges
  };
  auto returned = [](xg::Tensor<float> x) {
    auto a = x + 1.0f;
    auto t = xg::exp(a);
    return std::make_tuple(t, a);
  };
  auto x = xg::randn<float>({40}, 8);
  const std::string shared_ir = xg::jit(shared, only("fuse")).lower(x).ir();
  CHECK(shared_ir.find("merged=\"Tanh+Mul\"") != std::string::npos);
  CHECK(xg::jit(shared, {.strict = true})(x).to_vector() == shared(x).to_vector());
  CHECK(xg::jit(returned, only("fuse")).lower(x).ir().find("merged=") == std::string::npos);
  auto [jt, ja] = xg::jit(returned, {.strict = true})(x);
  auto [et, ea] = returned(x);
  CHECK(jt.to_vector() == et.to_vector());
  CHECK(ja.to_vector() == ea.to_vector());
}

TEST_CASE("passes: fuse never makes a cycle, and writes each value read outside its group") {
  // d feeds a reduction whose result the second chain needs: two groups, d an output of the first.
  auto f = [](xg::Tensor<float> x) {
    auto d = xg::exp(x) + 1.0f;
    auto s = xg::sum(d);
    return d * s + x;
  };
  auto x = xg::randn<float>({5, 7}, 3);
  auto config = only("fuse", "f");
  CHECK(body(xg::jit(f, config).lower(x).ir()) ==
        "  %1 : f32[] = Const() {value=1}\n"
        "  %2 : f32[5, 7] = Fused(%0, %1) {body=f.fused0, ops=\"Exp, Add\", merged=\"Exp+Add\"}\n"
        "  %3 : f32[1, 1] = SumTo(%2) {shape=[1, 1]}\n"
        "  %4 : f32[] = Reshape(%3) {shape=[]}\n"
        "  %5 : f32[5, 7] = Fused(%2, %4, %0) {body=f.fused1, ops=\"Mul, Add\"}\n"
        "  return %5\n");
  auto jitted = xg::jit(f, {.strict = true})(x).to_vector(), eager = f(x).to_vector();
  CHECK(std::memcmp(jitted.data(), eager.data(), jitted.size() * sizeof(float)) == 0);

  // Two groups, each convex, that need each other through reductions (exp(x) -> sum -> the
  // second group; sin(y) -> sum -> the first): one of them is given up, not a cycle made.
  auto crossed = [](xg::Tensor<float> u, xg::Tensor<float> v) {
    auto a = xg::exp(u);
    auto b = xg::sin(v);
    auto a_scaled = a * xg::sum(b);
    auto b_scaled = b * xg::sum(a);
    return std::make_tuple(a_scaled, b_scaled);
  };
  auto y = xg::randn<float>({5, 7}, 4);
  const std::string ir = all_of(xg::jit(crossed, only("fuse")).lower(x, y).ir());
  CHECK(ir.find("Fused(") != std::string::npos);
  auto [ja, jb] = xg::jit(crossed, {.strict = true})(x, y);
  auto [ea, eb] = crossed(x, y);
  CHECK(ja.to_vector() == ea.to_vector());
  CHECK(jb.to_vector() == eb.to_vector());
}

TEST_CASE("passes: fuse runs elementwise work as a MatMul's epilogue, on each block as it is finished") {
  auto f = [](xg::Tensor<float> x, xg::Tensor<float> w, xg::Tensor<float> b) {
    auto y = xg::matmul(x, w);
    auto z = xg::bias_add(y, b);
    return xg::relu(z);
  };
  auto x = xg::randn<float>({6, 5}, 1), w = xg::randn<float>({5, 4}, 2), b = xg::randn<float>({4}, 3);
  auto config = only("fuse", "dense");
  // The GEMM writes the MatMul's result into the group's output, which the group then
  // overwrites block by block: the result has no buffer, and is no output, of its own.
  CHECK(all_of(xg::jit(f, config).lower(x, w, b).ir()) ==
        "graph dense(\n"
        "    %0 : f32[6, 5]\n"
        "    %1 : f32[5, 4]\n"
        "    %2 : f32[4]\n"
        ") {\n"
        "  %3 : f32[4] = Reshape(%2) {shape=[4]}\n"
        "  %4 : f32[6, 4] = Fused(%0, %1, %3) {body=dense.fused0, ops=\"MatMul, Add, ReLU\", "
        "merged=\"Add+ReLU\"}\n"
        "  return %4\n"
        "}\n"
        "\n"
        "graph dense.fused0(\n"
        "    %0 : f32[6, 5]\n"
        "    %1 : f32[5, 4]\n"
        "    %2 : f32[4]\n"
        ") {\n"
        "  %3 : f32[6, 4] = MatMul(%0, %1) {transpose_a=false, transpose_b=false}\n"
        "  %4 : f32[6, 4] = Add(%3, %2)\n"
        "  %5 : f32[6, 4] = ReLU(%4)\n"
        "  return %5\n"
        "}\n");
  // A group whose outputs are narrower than the result (bool) keeps the result's own buffer,
  // the node's last output.
  auto positive = [](xg::Tensor<float> u, xg::Tensor<float> v) { return xg::matmul(u, v) > 0.0f; };
  CHECK(all_of(xg::jit(positive, only("fuse", "positive")).lower(x, w).ir())
            .find("(%3 : bool[6, 4], %4 : f32[6, 4]) = Fused(%0, %1") != std::string::npos);
  CHECK(xg::jit(positive)(x, w).to_vector() == positive(x, w).to_vector());
  // Bitwise as eager: small, large enough that the GEMM splits across threads and blocks, batched
  // (each matrix's rows are rows of the output), transposed.
  auto check_same = [](auto g, const auto&... args) {
    auto jitted = xg::jit(g)(args...).to_vector(), eager = g(args...).to_vector();
    REQUIRE(jitted.size() == eager.size());
    CHECK(std::memcmp(jitted.data(), eager.data(), jitted.size() * sizeof(float)) == 0);
  };
  check_same(f, x, w, b);
  check_same(f, xg::randn<float>({300, 700}, 4), xg::randn<float>({700, 530}, 5), xg::randn<float>({530}, 6));
  auto batched = [](xg::Tensor<float> u, xg::Tensor<float> v) {
    auto y = xg::matmul(u, v, true, false);
    return xg::tanh(y) * 2.0f;
  };
  check_same(batched, xg::randn<float>({3, 40, 30}, 7), xg::randn<float>({40, 20}, 8));
  // The group reads one of the GEMM's inputs too.
  auto reread = [](xg::Tensor<float> u, xg::Tensor<float> v) {
    auto y = xg::matmul(u, v);
    return xg::tanh(y) * u;
  };
  auto square = xg::randn<float>({4, 4}, 9);
  CHECK(all_of(xg::jit(reread, only("fuse")).lower(square, square).ir()).find("ops=\"MatMul, Tanh, Mul") !=
        std::string::npos);
  check_same(reread, square, xg::randn<float>({4, 4}, 10));
  // A convolution reports finished ranges too: one image at a time, or a chunk of images after
  // its scatter; each path (pointwise, one image per GEMM, several) keeps eager's bits.
  auto conv_layer = [](xg::Tensor<float> u, xg::Tensor<float> k, xg::Tensor<float> bias) {
    auto y = xg::conv2d(u, k);
    auto z = xg::bias_add(y, bias);
    return xg::relu(z);
  };
  for (auto shape : {std::tuple{2, 3, 8, 3}, std::tuple{16, 1, 28, 5}, std::tuple{3, 6, 5, 1}}) {
    const int n = std::get<0>(shape), c = std::get<1>(shape), side = std::get<2>(shape), kernel = std::get<3>(shape);
    CAPTURE(n);  // (not a structured binding: clang 14 cannot capture one in CAPTURE)
    auto u = xg::randn<float>({n, c, side, side}, 11), k = xg::randn<float>({4, c, kernel, kernel}, 12);
    auto bias = xg::randn<float>({4}, 13);
    CHECK(all_of(xg::jit(conv_layer, only("fuse")).lower(u, k, bias).ir()).find("ops=\"Conv2D, Add, ReLU\"") !=
          std::string::npos);
    check_same(conv_layer, u, k, bias);
  }
  // Not taken in when another node reads the MatMul's result.
  auto shared = [](xg::Tensor<float> u, xg::Tensor<float> v) {
    auto y = xg::matmul(u, v);
    auto r = xg::relu(y);
    return r + xg::sum(y);
  };
  CHECK(all_of(xg::jit(shared, only("fuse")).lower(x, w).ir()).find("ops=\"MatMul") == std::string::npos);
  // A value made before the MatMul and read after it: its op stays out of the group (a group
  // must not hold both ends of a path through an outside node), the MatMul and the Add fuse.
  auto around = [](xg::Tensor<float> u, xg::Tensor<float> v) {
    auto a = u * 2.0f;
    auto m = xg::matmul(a, v);
    return m + a;
  };
  auto named = only("fuse", "around");
  CHECK(body(xg::jit(around, named).lower(square, square).ir()) ==
        "  %2 : f32[] = Const() {value=2}\n"
        "  %3 : f32[4, 4] = Mul(%0, %2)\n"
        "  %4 : f32[4, 4] = Fused(%3, %1) {body=around.fused0, ops=\"MatMul, Add\"}\n"
        "  return %4\n");
  check_same(around, square, square);
}

TEST_CASE("passes: fuse recomputes cheap values where they are read instead of writing them out") {
  // GELU's gradient reads x / 2, erf(x / sqrt 2) and exp(-x^2 / 2). The backward's group (the
  // epilogue of g w2^T) recomputes them from x itself, so the forward's group writes x and
  // gelu(x), not four [16, 24] values, and the backward reads one of them, not three.
  auto w1 = xg::randn<float>({8, 24}, 5), w2 = xg::randn<float>({24, 4}, 6);
  auto step = [](xg::Tensor<float> x, xg::Tensor<float> u, xg::Tensor<float> v) {
    return xg::grad(
        [&](xg::Tensor<float> a) { return xg::sum(xg::square(xg::matmul(xg::gelu(xg::matmul(x, a)), v))); })(u);
  };
  auto x = xg::randn<float>({16, 8}, 7);
  const std::string ir = body(xg::jit(step).lower(x, w1, w2).ir());
  const std::string forward = "= Fused(%0, %1, ";
  const auto at = ir.find(forward);
  INFO(ir);
  REQUIRE(at != std::string::npos);
  const std::string line = ir.substr(ir.rfind('\n', at) + 1, ir.find('\n', at) - ir.rfind('\n', at) - 1);
  CHECK(line.find("ops=\"MatMul, Mul, Mul, Erf, Fma\"") != std::string::npos);
  const std::string results = line.substr(0, line.find(" = "));
  CHECK(results.find(": f32[16, 24], %") != std::string::npos);  // two results, x and gelu(x)
  CHECK(results.find(": f32[16, 24], %", results.find(": f32[16, 24], %") + 1) == std::string::npos);
  CHECK(ir.find("ops=\"MatMul, Mul, Mul, Erf, ") != ir.rfind("ops=\"MatMul, Mul, Mul, Erf, "));  // both groups
  // Exact (so in strict mode too): the recomputed ops run the kernels the forward's ran.
  auto jitted = xg::jit(step, {.strict = true})(x, w1, w2).to_vector(), eager = step(x, w1, w2).to_vector();
  REQUIRE(jitted.size() == eager.size());
  CHECK(std::memcmp(jitted.data(), eager.data(), jitted.size() * sizeof(float)) == 0);
  std::istringstream strict_ir(body(xg::jit(step, {.strict = true}).lower(x, w1, w2).ir()));
  bool recomputed = false;
  for (std::string node; std::getline(strict_ir, node);)
    recomputed |= node.find("MatMul, Mul, Mul, Erf") != std::string::npos && node.find("Exp") != std::string::npos;
  CHECK(recomputed);
  // Not when it would only spare the reader a read: d is written for another reader anyway.
  auto f = [](xg::Tensor<float> x) {
    auto d = xg::exp(x) + 1.0f;
    return d * xg::sum(d) + x;
  };
  CHECK(all_of(xg::jit(f, only("fuse")).lower(x).ir()).find("ops=\"Exp, Add, Mul, Add\"") == std::string::npos);
}

TEST_CASE("passes: fuse runs a layer norm or a softmax as one row group, each row's reductions and ops in one pass") {
  auto ln = [](xg::Tensor<float> x, xg::Tensor<float> g, xg::Tensor<float> b) { return xg::layer_norm(x, g, b, 1e-5); };
  auto x = xg::randn<float>({6, 40}, 8), g = xg::randn<float>({40}, 9), b = xg::randn<float>({40}, 10);
  CHECK(optimized(ln, only("fuse", "ln"), x, g, b) ==
        "  %3 : f32[] = Const() {value=40}\n"
        "  %4 : f32[] = Const() {value=40}\n"
        "  %5 : f32[] = Const() {value=1e-05}\n"
        "  %6 : f32[6, 40] = Fused(%0, %3, %4, %5, %1, %2) {body=ln.fused0, ops=\"SumTo, Div, Sub, Square, SumTo, Div, "
        "Add, Rsqrt, Mul, Fma\", merged=\"Add+Rsqrt\"}\n"
        "  return %6\n");
  // Each row is reduced by the loop the eager kernel runs on a row: eager's bits, at any number
  // of threads (blocks are whole rows).
  auto big = xg::randn<float>({300, 40}, 11);
  const auto eager = ln(big, g, b);
  CHECK(same_bits(xg::jit(ln, {.strict = true})(big, g, b), eager));
  {
    Threads two(2);
    CHECK(same_bits(xg::jit(ln, {.strict = true})(big, g, b), eager));
  }
  auto ln64 = [](xg::Tensor<double> x) { return xg::layer_norm(x, 1e-5); };
  auto big64 = xg::randn<double>({50, 33}, 12);
  CHECK(same_bits(xg::jit(ln64, {.strict = true})(big64), ln64(big64)));
  // No rows: nothing to run, the right shape.
  CHECK(xg::jit(ln)(xg::zeros<float>({0, 40}), g, b).shape() == xg::Shape{0, 40});

  // Softmax and its gradient: the row maximum, the exponentials, their sum and the scale, and
  // the backward's row sum of g * y, each one group; infinities and NaNs as eagerly.
  auto w = xg::randn<float>({6, 40}, 13);
  auto soft = [](xg::Tensor<float> u, xg::Tensor<float> v) {
    return xg::grad([&](xg::Tensor<float> a) { return xg::sum(xg::softmax(a, -1) * v); })(u);
  };
  const std::string soft_ir = body(xg::jit(soft).lower(x, w).ir());
  CHECK(soft_ir.find("ops=\"ReduceMax, Sub, Exp, SumTo, Div, Mul, SumTo, Div, Mul, Neg, Fma, Mul\"") !=
        std::string::npos);
  CHECK(soft_ir.find("= ReduceMax(") == std::string::npos);
  CHECK(soft_ir.find("= SumTo(") == std::string::npos);
  auto odd = x.to_vector();
  odd[3] = std::numeric_limits<float>::infinity();
  odd[45] = std::numeric_limits<float>::quiet_NaN();
  odd[90] = -std::numeric_limits<float>::infinity();
  const auto special = xg::tensor<float>(odd, {6, 40});
  CHECK(same_bits(xg::jit(soft, {.strict = true})(special, w), soft(special, w)));
  CHECK(same_bits(xg::jit(soft, {.strict = true})(x, w), soft(x, w)));

  // A value per row read outside the group is written, of its own shape.
  auto stats = [](xg::Tensor<float> u) {
    auto mean = xg::mean(u, {-1}, true);
    return std::make_tuple(xg::exp(u - mean), mean * 2.0f);
  };
  const std::string stats_ir = body(xg::jit(stats, only("fuse")).lower(x).ir());
  CHECK(stats_ir.find("= SumTo(") == std::string::npos);
  CHECK(stats_ir.find("= Fused(") == stats_ir.rfind("= Fused("));    // one group
  CHECK(stats_ir.find(" : f32[6, 1]") < stats_ir.find("= Fused("));  // writing the mean (per row) too
  auto [je, jm] = xg::jit(stats, {.strict = true})(x);
  auto [ee, em] = stats(x);
  CHECK(same_bits(je, ee));
  CHECK(same_bits(jm, em));

  // Rows of a block each (999 or 1000 floats: a block holds at least one whole row): the ops
  // along a row read its maximum, sum or a per-row input where it is, not repeated along the
  // row; a row's tail (not a whole vector) as eagerly.
  for (const std::int64_t length : {999, 1000}) {
    CAPTURE(length);
    auto u = xg::randn<float>({7, length}, 15), v = xg::randn<float>({7, length}, 16);
    auto scale = xg::randn<float>({7, 1}, 17);
    CHECK(body(xg::jit(soft).lower(u, v).ir()).find("ops=\"ReduceMax, Sub, Exp, SumTo, Div, Mul, SumTo") !=
          std::string::npos);
    CHECK(same_bits(xg::jit(soft, {.strict = true})(u, v), soft(u, v)));
    auto shifted = [](xg::Tensor<float> a, xg::Tensor<float> r) {
      return xg::exp(a * r - xg::max(a, {-1}, true)) + xg::sum(a, {-1}, true) * r;
    };
    CHECK(same_bits(xg::jit(shifted, {.strict = true})(u, scale), shifted(u, scale)));
    Threads two(2);
    CHECK(same_bits(xg::jit(soft, {.strict = true})(u, v), soft(u, v)));
  }

  // Rows longer than a row group takes: the reductions run on their own.
  auto long_rows = xg::randn<float>({2, 10000}, 14);
  auto plain = [](xg::Tensor<float> u) { return xg::softmax(u, -1); };
  CHECK(all_of(xg::jit(plain, only("fuse")).lower(long_rows).ir()).find("= ReduceMax(") != std::string::npos);
  CHECK(same_bits(xg::jit(plain, {.strict = true})(long_rows), plain(long_rows)));
#if defined(XGRAD_WITH_THRUST)
  // On Device::thrust a row group runs its body node by node, each on its own device kernel.
  const auto on_device = xg::jit(ln)(big.to(xg::Device::thrust), g.to(xg::Device::thrust), b.to(xg::Device::thrust));
  CHECK(same_bits(
      on_device.to(xg::Device::cpu),
      ln(big.to(xg::Device::thrust), g.to(xg::Device::thrust), b.to(xg::Device::thrust)).to(xg::Device::cpu)));
#endif
}

TEST_CASE("plan_memory: buffers reused and written in place, shown before running; calls allocate only results") {
  // A small train step: its backward pass has many same-shaped temporaries that die young.
  xg::Parameter<float> w(xg::randn<float>({16, 32}, 1) * 0.1f, "w"), b(xg::zeros<float>({32}), "b");
  auto step = small_train_step(w, b);
  auto x = xg::randn<float>({64, 16}, 2);
  auto jitted = xg::jit(step, {.name = "step"});
  auto lowered = jitted.lower(x);
  const xg::backend::MemoryPlan* plan = lowered.memory_plan();
  REQUIRE(plan != nullptr);
  CHECK(lowered.peak_arena_bytes() == plan->arena_bytes);
  CHECK(plan->arena_bytes > 0);
  CHECK(plan->arena_bytes < plan->unplanned_bytes);
  CHECK(plan->num_reused > 0);
  CHECK(plan->num_in_place > 0);
  const std::string ir = lowered.ir();
  CHECK(ir.rfind("# memory plan: arena ", 0) == 0);
  CHECK(ir.find("in place of %") != std::string::npos);
  CHECK(ir.find("reused") != std::string::npos);
  // Unplanned below O2 and with the pass off.
  CHECK(xg::jit(step, {.level = xg::JitLevel::O1}).lower(x).memory_plan() == nullptr);
  CHECK(xg::jit(step, {.disabled_passes = {"plan_memory"}}).lower(x).peak_arena_bytes() == 0);

  // After the first call, a call makes one buffer: the loss it returns (next_serial() itself
  // takes a number too).
  auto first = jitted(x);
  const float first_loss = first.item();
  const auto before = xg::Storage::next_serial();
  auto second = jitted(x);
  CHECK(xg::Storage::next_serial() - before == 2);
  // What a call returned is the caller's: the next call does not write over it.
  jitted(x);
  CHECK(first.item() == first_loss);
  CHECK(second.item() < first_loss);
}

TEST_CASE("plan_memory: a result that passes an arena buffer through is copied out") {
  // max over a size-1 axis returns its input's elements: the result must not be the arena buffer.
  auto f = [](xg::Tensor<float> x) { return xg::max(xg::exp(x) * 2.0f, {1}); };
  auto x = xg::randn<float>({6, 1}, 4);
  auto jitted = xg::jit(f);
  auto first = jitted(x);
  auto kept = first.to_vector();
  jitted(x * 3.0f);
  CHECK(first.to_vector() == kept);
  CHECK(kept == f(x).to_vector());
}

namespace {

/// The stage (index into stages) node k of `g` runs in.
std::size_t stage_of(std::span<const xg::backend::Stage> stages, std::size_t k) {
  for (std::size_t s = 0; s < stages.size(); ++s)
    if (k >= stages[s].begin && k < stages[s].end) return s;
  return stages.size();
}

/// The position in g.nodes of the node whose first input is `a` and second `b`.
std::size_t position_of_node(const xg::ir::Graph& g, const xg::ir::Value* a, const xg::ir::Value* b) {
  for (std::size_t k = 0; k < g.nodes.size(); ++k)
    if (g.nodes[k]->inputs.size() >= 2 && g.nodes[k]->inputs[0] == a && g.nodes[k]->inputs[1] == b) return k;
  return g.nodes.size();
}

}  // namespace

TEST_CASE("schedule: cheap independent nodes meet in a stage that runs at once; large ones run alone") {
  // Two small products (102k and 320k multiply-adds: one thread each; the second is past the
  // GEMM's own threshold for splitting, 2^17, but two threads split it for little gain) around
  // a large one (2M).
  auto f = [](xg::Tensor<float> a, xg::Tensor<float> b, xg::Tensor<float> x, xg::Tensor<float> w) {
    auto small1 = xg::matmul(a, b);
    auto large = xg::matmul(x, w);
    auto small2 = xg::matmul(b, a);
    return xg::sum(small1) + xg::sum(large) + xg::sum(small2);
  };
  auto a = xg::randn<float>({32, 100}, 1), b = xg::randn<float>({100, 32}, 2);
  auto x = xg::randn<float>({128, 128}, 3), w = xg::randn<float>({128, 128}, 4);
  auto with = [&](xg::JitConfig config) { return xg::jit(f, config).lower(a, b, x, w); };
  const auto scheduled = with(only("schedule"));
  const xg::ir::Graph& g = scheduled.graph();
  const auto& in = g.inputs;
  const std::size_t k1 = position_of_node(g, in[0], in[1]), k2 = position_of_node(g, in[1], in[0]),
                    kl = position_of_node(g, in[2], in[3]);
  REQUIRE(kl < g.nodes.size());
  // The second small product moved before the large one, beside the first.
  CHECK(k1 + 1 == k2);
  CHECK(k2 < kl);
  const auto stages = xg::backend::stages(g);
  CHECK(stage_of(stages, k1) == stage_of(stages, k2));
  CHECK(stages[stage_of(stages, k1)].size() == 2);
  CHECK(stages[stage_of(stages, kl)].size() == 1);
  CHECK(scheduled.ir().find("[stage " + std::to_string(stage_of(stages, k1)) + " of 2 nodes]") != std::string::npos);
  // Without the pass the order is the program's, and the large product splits the small ones.
  const auto unscheduled = with(only("none"));
  const xg::ir::Graph& u = unscheduled.graph();
  CHECK(position_of_node(u, u.inputs[1], u.inputs[0]) > position_of_node(u, u.inputs[2], u.inputs[3]));
  CHECK(unscheduled.ir().find("[stage ") == std::string::npos);
  // The same result on one thread and on two.
  const float eager = f(a, b, x, w).item();
  for (int threads : {1, 2}) {
    Threads guard(threads);
    CHECK(xg::jit(f)(a, b, x, w).item() == doctest::Approx(eager).epsilon(1e-5));
  }
}

TEST_CASE("plan_memory: nodes run at once never write over a buffer another of them reads") {
  // u and v both read t and run at once; v reads it last, so alone it would take t's buffer.
  auto f = [](xg::Tensor<float> x) {
    auto t = xg::exp(x);
    auto u = xg::tanh(t);
    auto v = xg::sin(t);
    return xg::sum(u * v);
  };
  auto x = xg::randn<float>({64, 64}, 5);
  xg::JitConfig config = only("schedule");
  config.disabled_passes.erase(
      std::find(config.disabled_passes.begin(), config.disabled_passes.end(), std::string("plan_memory")));
  const auto lowered = xg::jit(f, config).lower(x);
  const xg::ir::Graph& g = lowered.graph();
  INFO(lowered.ir());
  REQUIRE(g.nodes.size() >= 4);
  const auto stages = xg::backend::stages(g);
  REQUIRE(stages.size() >= 3);
  CHECK(stages[1].size() == 2);  // tanh and sin
  const xg::backend::MemoryPlan* plan = lowered.memory_plan();
  REQUIRE(plan != nullptr);
  const int t = g.nodes[0]->outputs[0]->id;
  for (std::size_t k = 1; k <= 2; ++k) {
    const auto id = static_cast<std::size_t>(g.nodes[k]->outputs[0]->id);
    CHECK(plan->in_place_of[id] != t);
    CHECK(plan->offset[id] != plan->offset[static_cast<std::size_t>(t)]);
  }
  // The product after them still writes over one of its operands.
  CHECK(plan->num_in_place == 1);
  // Freed buffers poisoned, run again and again on two threads: eager's bits every time.
  config.poison_freed_buffers = true;
  auto jitted = xg::jit(f, config);
  const float eager = f(x).item();
  Threads guard(2);
  for (int call = 0; call < 20; ++call) CHECK(jitted(x).item() == eager);
}

TEST_CASE("plan_memory: an optimizer's update is written straight into the parameter it updates") {
  auto run = [](const std::vector<std::string>& disabled, int calls) {
    xg::Parameter<float> w(xg::randn<float>({16, 32}, 1) * 0.1f, "w"), b(xg::zeros<float>({32}), "b");
    auto step = small_train_step(w, b);
    auto jitted = xg::jit(step, {.disabled_passes = disabled});
    auto x = xg::randn<float>({64, 16}, 2);
    const auto lowered = jitted.lower(x);
    // Per effect (w's, then b's): the input its value is written into, or -1.
    std::vector<int> written;
    for (const auto& e : lowered.graph().effects)
      written.push_back(
          lowered.memory_plan() ? lowered.memory_plan()->written_into[static_cast<std::size_t>(e.value->id)] : -1);
    const auto w_before = w.to_vector();
    for (int call = 0; call < calls; ++call) jitted(x);
    return std::make_tuple(written, lowered.ir(), w_before, w.to_vector(), b.to_vector());
  };
  const auto [written, ir, w0, w, b] = run({}, 3);
  const std::string& text = ir;  // INFO captures it, which a structured binding cannot be (clang 14)
  INFO(text);
  REQUIRE(written.size() == 2);
  // Each update reads its parameter element by element before writing it. w's runs as the
  // epilogue of the product x^T g, which fusion then writes into a buffer of its own, not
  // into the update's output.
  CHECK(written[0] >= 0);
  CHECK(written[1] >= 0);
  CHECK(ir.find("2 written into the inputs they update") != std::string::npos);
  CHECK(ir.find(", written into %" + std::to_string(written[1]) + "]") != std::string::npos);
  CHECK(w != w0);
  // The same parameters as without a memory plan, where each update is copied in when the call ends.
  const auto [unplanned, unplanned_ir, w0_again, w_copied, b_copied] = run({"plan_memory"}, 3);
  CHECK(unplanned == std::vector<int>{-1, -1});
  CHECK(w0_again == w0);
  CHECK(w == w_copied);
  CHECK(b == b_copied);
}

TEST_CASE("background: an update nothing reads runs beside the nodes after it, with one thread's bits") {
  // w's update, fused with its gradient's product (16 x 128 x 128), is cheap and no node reads
  // what it makes; the large product after it splits among the threads. On two threads a worker
  // runs the update while the caller goes on, and joins the large product when done.
  auto run = [](int threads, bool plan, bool inspect) {
    Threads guard(threads);
    xg::Parameter<float> w(xg::randn<float>({128, 128}, 1) * 0.1f, "w"), b(xg::zeros<float>({128}), "b");
    auto step = [&](xg::Tensor<float> x, xg::Tensor<float> big_a, xg::Tensor<float> big_b) {
      auto [loss, grads] = xg::value_and_grad([&] { return xg::mean(xg::square(xg::tanh(xg::matmul(x, w) + b))); },
                                              std::vector<xg::Tensor<float>>{w, b})();
      xg::no_grad off;
      w -= grads[0] * 0.1f;
      b -= grads[1] * 0.1f;
      return loss + xg::mean(xg::matmul(big_a * loss, big_b));
    };
    xg::JitConfig config{.name = "step"};
    config.poison_freed_buffers = true;
    if (!plan) config.disabled_passes = {"plan_memory"};
    auto jitted = xg::jit(step, config);
    auto x = xg::randn<float>({16, 128}, 2), big_a = xg::randn<float>({128, 256}, 3),
         big_b = xg::randn<float>({256, 128}, 4);
    if (inspect) {
      const auto lowered = jitted.lower(x, big_a, big_b);
      const xg::ir::Graph& g = lowered.graph();
      INFO(lowered.ir());
      const std::vector<bool> background = xg::backend::background_nodes(g);
      REQUIRE(std::count(background.begin(), background.end(), true) == 1);
      const auto k =
          static_cast<std::size_t>(std::find(background.begin(), background.end(), true) - background.begin());
      // It is w's update, and the large product comes after it.
      CHECK(g.nodes[k]->outputs[0]->shape == xg::Shape{128, 128});
      CHECK(std::any_of(g.nodes.begin() + static_cast<std::ptrdiff_t>(k) + 1, g.nodes.end(),
                        [](const auto& n) { return n->op() == "MatMul"; }));
      CHECK(lowered.ir().find("[background]") != std::string::npos);
      // What it reads in the arena stays its own to the call's end: no later output takes it.
      const xg::backend::MemoryPlan& mp = *lowered.memory_plan();
      for (const xg::ir::Value* in : g.nodes[k]->inputs) {
        const std::ptrdiff_t at = mp.offset[static_cast<std::size_t>(in->id)];
        if (at == xg::backend::MemoryPlan::kNotPlanned) continue;
        const auto end = at + static_cast<std::ptrdiff_t>(in->shape.numel() * 4);
        for (std::size_t later = k + 1; later < g.nodes.size(); ++later)
          for (const xg::ir::Value* out : g.nodes[later]->outputs) {
            const std::ptrdiff_t o = mp.offset[static_cast<std::size_t>(out->id)];
            if (o == xg::backend::MemoryPlan::kNotPlanned || g.nodes[later]->traits.view) continue;
            CAPTURE(later);
            CHECK((o + static_cast<std::ptrdiff_t>(out->shape.numel() * 4) <= at || o >= end));
          }
      }
    }
    std::vector<float> losses;
    for (int call = 0; call < 4; ++call) losses.push_back(jitted(x, big_a, big_b).item());
    return std::make_tuple(losses, xg::Tensor<float>(w).to_vector(), xg::Tensor<float>(b).to_vector());
  };
  const auto one_thread = run(1, true, true);
  CHECK(run(2, true, true) == one_thread);
  CHECK(run(2, false, false) == one_thread);
  CHECK(run(3, true, false) == one_thread);
}

TEST_CASE("plan_memory: an update is not written into its parameter while a node in the background reads it") {
  // v's update reads w and runs in the background (a large product follows); w's update, after
  // the product, must not write into w while v's may still be reading it.
  auto run = [](int threads) {
    Threads guard(threads);
    xg::Parameter<float> w(xg::randn<float>({128, 128}, 1), "w"), v(xg::randn<float>({128, 128}, 2), "v");
    auto f = [&](xg::Tensor<float> x, xg::Tensor<float> y) {
      xg::no_grad off;
      v -= w * 0.1f;
      auto s = xg::mean(xg::matmul(x, y));
      w.assign(w * s);
      return s;
    };
    auto x = xg::randn<float>({128, 256}, 3), y = xg::randn<float>({256, 128}, 4);
    auto jitted = xg::jit(f);
    const auto lowered = jitted.lower(x, y);
    const xg::ir::Graph& g = lowered.graph();
    INFO(lowered.ir());
    const std::vector<bool> background = xg::backend::background_nodes(g);
    REQUIRE(std::count(background.begin(), background.end(), true) == 1);
    const std::size_t k =
        static_cast<std::size_t>(std::find(background.begin(), background.end(), true) - background.begin());
    REQUIRE(lowered.memory_plan() != nullptr);
    for (const auto& e : g.effects) {
      const int into = lowered.memory_plan()->written_into[static_cast<std::size_t>(e.value->id)];
      if (e.value->producer == g.nodes[k].get())
        CHECK(into == g.inputs[e.input]->id);  // v's own update still writes into v
      else
        CHECK(into == -1);
    }
    for (int call = 0; call < 3; ++call) jitted(x, y);
    return std::make_pair(xg::Tensor<float>(w).to_vector(), xg::Tensor<float>(v).to_vector());
  };
  CHECK(run(2) == run(1));
}

TEST_CASE("plan_memory: an update is not written into its parameter while a later node still reads it") {
  // The update of w is cheap and moves (schedule) beside tanh(y), before the product that reads
  // the old w: writing it into w then would change the product.
  xg::Parameter<float> w(xg::randn<float>({128, 128}, 3), "w");
  auto f = [&](xg::Tensor<float> x, xg::Tensor<float> y, xg::Tensor<float> g) {
    auto t = xg::tanh(y);
    auto product = xg::matmul(x, w);
    xg::no_grad off;
    w -= g * 0.5f;
    return xg::sum(product) + xg::sum(t);
  };
  auto x = xg::randn<float>({128, 128}, 4), y = xg::randn<float>({64, 64}, 5), g = xg::randn<float>({128, 128}, 6);
  const auto w0 = xg::Tensor<float>(w).to_vector();
  auto jitted = xg::jit(f);
  const auto lowered = jitted.lower(x, y, g);
  const xg::ir::Graph& graph = lowered.graph();
  std::size_t update = graph.nodes.size(), product = graph.nodes.size();
  for (std::size_t k = 0; k < graph.nodes.size(); ++k) {
    if (graph.nodes[k]->op() == "MatMul") product = k;
    if (!graph.nodes[k]->outputs.empty() && graph.nodes[k]->outputs[0] == graph.effects.at(0).value) update = k;
  }
  REQUIRE(update < product);  // the order that makes writing into w wrong
  REQUIRE(lowered.memory_plan() != nullptr);
  CHECK(lowered.memory_plan()->num_written_into == 0);
  const float result = jitted(x, y, g).item();
  const auto w1 = xg::Tensor<float>(w).to_vector();
  // Eager, from the same w.
  w = xg::Parameter<float>(xg::tensor<float>(w0, {128, 128}), "w");
  CHECK(f(x, y, g).item() == doctest::Approx(result).epsilon(1e-5));
  CHECK(xg::Tensor<float>(w).to_vector() == w1);
}

TEST_CASE("plan_memory: a node that writes before it has read the tensor it updates writes into the arena") {
  // A product reads all of w for each element it writes: it cannot write into w.
  xg::Parameter<float> w(xg::randn<float>({16, 16}, 7), "w");
  auto f = [&](xg::Tensor<float> m) {
    xg::no_grad off;
    w.assign(xg::matmul(w, m));
    return xg::sum(m);
  };
  auto m = xg::randn<float>({16, 16}, 8);
  const auto w0 = xg::Tensor<float>(w).to_vector();
  auto jitted = xg::jit(f);
  const auto lowered = jitted.lower(m);
  REQUIRE(lowered.memory_plan() != nullptr);
  CHECK(lowered.memory_plan()->num_written_into == 0);
  jitted(m);
  const auto expected = xg::matmul(xg::tensor<float>(w0, {16, 16}), m).to_vector();
  CHECK(xg::Tensor<float>(w).to_vector() == expected);
}
