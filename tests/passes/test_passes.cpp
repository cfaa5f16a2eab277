// Each pass on small traced graphs: golden IR text before and after, and the values the
// optimized graph computes against eager.
#include <doctest/doctest.h>

#include <cstring>

#include <xgrad/xgrad.hpp>

#include "test_support.hpp"

namespace xg = xgrad;
using xgrad::testing::message_of;

namespace {

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

xg::JitConfig only(const std::string& pass) {
  xg::JitConfig config{.level = xg::JitLevel::O1};
  for (const auto& p : xg::passes::all_passes())
    if (p.name != pass) config.disabled_passes.emplace_back(p.name);
  return config;
}

template <class F, class... Args> std::string optimized(F f, xg::JitConfig config, const Args&... args) {
  return body(xg::jit(f, config).lower(args...).ir());
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
