// Transforms composing with jit, and nn::Module switching between eager and graph mode.
#include <doctest/doctest.h>

#include <xgrad/xgrad.hpp>

#include "jit/jit_support.hpp"
#include "test_support.hpp"

namespace xg = xgrad;
using namespace xgrad::testing;

TEST_CASE("jit: transforms compose and agree with eager") {
  auto f = [](xg::Tensor<double> x, xg::Tensor<double> y) { return xg::sum(xg::tanh(xg::matmul(x, y)) * x); };
  auto x = xg::randn<double>({3, 3}, 1), y = xg::randn<double>({3, 3}, 2);
  auto [ex, ey] = xg::grad(f, xg::argnums<0, 1>)(x, y);

  auto [jx, jy] = xg::jit(xg::grad(f, xg::argnums<0, 1>))(x, y);  // jit(grad(f))
  CHECK(same_bits(jx, ex));
  CHECK(same_bits(jy, ey));

  auto jf = xg::jit(f);
  auto [gx, gy] = xg::grad(jf, xg::argnums<0, 1>)(x, y);  // grad(jit(f)): the backward is compiled too
  CHECK(same_bits(gx, ex));
  CHECK(same_bits(gy, ey));

  // grad(grad(f)): eagerly, inside jit, and through a jitted f.
  auto second = [&](auto g) { return [g, y](xg::Tensor<double> v) { return xg::sum(xg::grad(g)(v, y)); }; };
  auto eager2 = xg::grad(second(f))(x);
  CHECK(same_bits(xg::jit(xg::grad(second(f)))(x), eager2));
  auto through = xg::grad(second(jf))(x);
  auto a = through.to_vector(), b = eager2.to_vector();
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-12));

  // value_and_grad of a jitted function, and backward() after a jitted call, reach Parameters.
  xg::Parameter<double> w(xg::randn<double>({3, 3}, 5), "w");
  auto net = [&](xg::Tensor<double> v) { return xg::sum(xg::exp(xg::matmul(v, w))); };
  auto jnet = xg::jit(net);
  auto [v1, g1] = xg::value_and_grad(jnet, std::vector<xg::Tensor<double>>{w})(x);
  auto [v2, g2] = xg::value_and_grad(net, std::vector<xg::Tensor<double>>{w})(x);
  CHECK(same_bits(v1, v2));
  CHECK(same_bits(g1[0], g2[0]));
  jnet(x).backward();
  CHECK(same_bits(w.grad(), g2[0]));
}

namespace {

struct Dense2 : xg::nn::Module {
  xg::Parameter<float> weight, bias;
  Dense2(std::int64_t in, std::int64_t out, std::uint64_t seed)
      : weight(xg::randn<float>({in, out}, seed) * 0.3f, "weight"), bias(xg::zeros<float>({out}), "bias") {
    register_parameter("weight", weight);
    register_parameter("bias", bias);
  }
  xg::Tensor<float> forward(xg::Tensor<float> x) override { return xg::bias_add(xg::matmul(x, weight), bias); }
};

struct TwoLayer : xg::nn::Module {
  Dense2 fc1{4, 8, 1}, fc2{8, 2, 2};
  int traces = 0;
  TwoLayer() { register_modules({{"fc1", &fc1}, {"fc2", &fc2}}); }
  xg::Tensor<float> forward(xg::Tensor<float> x) override {
    ++traces;
    return fc2(xg::relu(fc1(x)));
  }
};

}  // namespace

TEST_CASE("nn::Module: named parameters, and one line switches between eager and compiled") {
  TwoLayer net;
  std::vector<std::string> names;
  for (const auto& [name, p] : net.named_parameters()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"});
  CHECK(net.parameters().size() == 4);
  CHECK(net.parameters()[2].name() == "fc2.weight");
  CHECK(net.name() == "TwoLayer");

  auto x = xg::randn<float>({3, 4}, 9);
  auto eager = net(x);
  CHECK(net.traces == 1);
  xg::mode_scope graph(xg::Mode::graph);  // eager again after the test, even when a check fails
  auto compiled = net(x);
  net(x);
  CHECK(net.traces == 2);  // traced once, then cached
  CHECK(same_bits(compiled, eager));

  // Gradients reach the parameters through the compiled forward, as they do eagerly.
  auto params = net.parameters();
  auto loss = [&](xg::Tensor<float> v) { return xg::sum(net(v)); };
  auto [value, grads] = xg::value_and_grad(loss, params)(x);
  xg::set_mode(xg::Mode::eager);
  auto [value_eager, grads_eager] = xg::value_and_grad(loss, params)(x);
  CHECK(same_bits(value, value_eager));
  for (std::size_t i = 0; i < grads.size(); ++i) CHECK(same_bits(grads[i], grads_eager[i]));
}

TEST_CASE("nn::Module: traced nodes carry the module path and the user's lines") {
  TwoLayer net;
  auto f = xg::jit([&net](xg::Tensor<float> v) { return net(v); });
  auto ir = f.lower(xg::ones<float>({2, 4})).ir();
  CHECK(ir.find("MatMul(%0, %1)") != std::string::npos);
  CHECK(ir.find("@TwoLayer/fc1") != std::string::npos);
  CHECK(ir.find("@TwoLayer/fc2") != std::string::npos);
  CHECK(ir.find("Ref[f32[4, 8]]  # fc1.weight") != std::string::npos);
  CHECK(ir.find("test_jit_modes.cpp:") != std::string::npos);
}
