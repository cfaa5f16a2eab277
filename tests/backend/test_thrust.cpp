// Device::thrust: transfers, device checks, factories on the default device, and every op-table
// row whose ops have a Thrust kernel against the cpu backend. Built with XGRAD_WITH_THRUST
// (scripts/test.sh: OMP in the optimized build, CPP under the sanitizers); without it, the
// tests check that Device::thrust says it is not built in.
#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <sstream>
#include <string>

#include "ops/op_table.hpp"
#include "test_support.hpp"

namespace xg = xgrad;
using xgrad::testing::message_of;

namespace {

/// Restores the default device when a test ends.
struct DefaultDevice {
  explicit DefaultDevice(xg::Device d) { xg::set_default_device(d); }
  ~DefaultDevice() { xg::set_default_device(xg::Device::cpu); }
};

/// |a - b| within rel of max(1, |b|): the Thrust kernels compute each element with the op's
/// scalar body, the cpu backend with xsimd batches, and the two may differ in the last bits
/// of a transcendental. NaN matches NaN.
template <class T> bool close(T a, T b, double rel) {
  if (std::isnan(static_cast<double>(a)) || std::isnan(static_cast<double>(b)))
    return std::isnan(static_cast<double>(a)) && std::isnan(static_cast<double>(b));
  const double x = static_cast<double>(a), y = static_cast<double>(b);
  return std::abs(x - y) <= rel * std::max(1.0, std::abs(y));
}

}  // namespace

TEST_CASE("thrust: to() inside jit says to move the inputs instead") {
  auto f = xg::jit([](const xg::Tensor<float>& t) { return t.to(xg::Device::thrust) * 2.0f; });
  const std::string why = xgrad::testing::message_of<xg::ValueError>([&] { (void)f(xg::tensor<float>({1, 2})); });
  CHECK(why.find("to: moving a tensor to thrust inside jit is not supported") == 0);
}

TEST_CASE("thrust: without the backend, Device::thrust says how to get it") {
  if constexpr (xg::thrust_available()) {
    CHECK(xg::tensor<float>({1, 2}).to(xg::Device::thrust).device() == xg::Device::thrust);
  } else {
    const std::string why = message_of<xg::ValueError>([] { (void)xg::tensor<float>({1, 2}).to(xg::Device::thrust); });
    CHECK(why.find("Device::thrust is not built in") != std::string::npos);
    CHECK(why.find("-DXGRAD_THRUST_SYSTEM=OMP") != std::string::npos);
    CHECK(message_of<xg::ValueError>([] { xg::set_default_device(xg::Device::thrust); }).find("set_default_device") ==
          0);
  }
}

#if defined(XGRAD_WITH_THRUST)

TEST_CASE("thrust: tensors move to the device and back unchanged, of every dtype") {
  auto f = xg::randn<float>({3, 5}, 1);
  auto d = xg::tensor<double>({{1.5, -2.25}, {3.0, 4.0}});
  auto i = xg::tensor<std::int32_t>({7, -8, 9});
  auto l = xg::tensor<std::int64_t>({std::int64_t{1} << 40, -3});
  auto b = xg::tensor<bool>({true, false, true});
  auto f_on = f.to(xg::Device::thrust);
  CHECK(f_on.device() == xg::Device::thrust);
  CHECK(f_on.shape() == f.shape());
  CHECK(f_on.to_vector() == f.to_vector());  // read back through a device-to-host copy
  CHECK(f_on.to(xg::Device::cpu).to_vector() == f.to_vector());
  CHECK(d.to(xg::Device::thrust).to(xg::Device::cpu).to_vector() == d.to_vector());
  CHECK(i.to(xg::Device::thrust).to_vector() == i.to_vector());
  CHECK(l.to(xg::Device::thrust).to_vector() == l.to_vector());
  CHECK(b.to(xg::Device::thrust).to_vector() == b.to_vector());
  CHECK(xg::scalar<float>(2.5f).to(xg::Device::thrust).item() == 2.5f);
  CHECK(f.to(xg::Device::cpu).impl() == f.impl());  // already there: the same tensor
  CHECK(xg::zeros<float>({0, 4}).to(xg::Device::thrust).numel() == 0);
  std::ostringstream on_cpu, on_device;
  on_cpu << d;
  on_device << d.to(xg::Device::thrust);
  CHECK(on_device.str() == on_cpu.str());
}

TEST_CASE("thrust: ops refuse tensors on two devices, and name ops without a Thrust kernel") {
  auto x = xg::randn<float>({2, 3}, 2);
  auto y = x.to(xg::Device::thrust);
  const std::string mixed = message_of<xg::ValueError>([&] { (void)(x + y); });
  CHECK(mixed.find("Add: inputs on different devices (input 0 on cpu, input 1 on thrust)") == 0);
  CHECK(mixed.find("move them with .to(device)") != std::string::npos);
  // A scalar (a one-element cpu tensor) goes with any device.
  CHECK((y * 2.0f).device() == xg::Device::thrust);
  CHECK((y + xg::scalar<float>(1.0f)).to_vector() == (x + 1.0f).to_vector());
  auto images = xg::randn<float>({1, 1, 4, 4}, 3).to(xg::Device::thrust);
  const std::string no_kernel = message_of<xg::ValueError>([&] { (void)xg::resize_bilinear(images, 8, 8); });
  CHECK(no_kernel.find("ResizeBilinear: no Device::thrust kernel yet") == 0);
  auto f = xg::jit([](const xg::Tensor<float>& t) { return t * t; });
  CHECK(message_of<xg::ValueError>([&] { (void)f(y); }).find("compiled graphs run on the cpu backend so far") !=
        std::string::npos);
}

TEST_CASE("thrust: factories follow the default device; *_like follow their argument") {
  {
    DefaultDevice on(xg::Device::thrust);
    CHECK(xg::default_device() == xg::Device::thrust);
    CHECK(xg::zeros<float>({2, 2}).device() == xg::Device::thrust);
    CHECK(xg::tensor<float>({{1, 2}, {3, 4}}).device() == xg::Device::thrust);
    CHECK(xg::randn<double>({3}, 4).device() == xg::Device::thrust);
    CHECK(xg::eye<float>(3).to_vector() == std::vector<float>{1, 0, 0, 0, 1, 0, 0, 0, 1});
    CHECK(xg::arange<std::int32_t>(3).device() == xg::Device::thrust);
    CHECK(xg::scalar<float>(1.0f).device() == xg::Device::cpu);  // scalars go with any device
  }
  CHECK(xg::zeros<float>({2}).device() == xg::Device::cpu);
  auto on_device = xg::randn<float>({4}, 5).to(xg::Device::thrust);
  CHECK(xg::ones_like(on_device).device() == xg::Device::thrust);
  CHECK(xg::ones_like(on_device).to_vector() == std::vector<float>(4, 1.0f));
}

TEST_CASE("thrust: every op-table row whose ops run on Device::thrust matches the cpu backend") {
  using namespace xgrad::testing;
  int ran = 0;
  std::set<std::string> not_yet;
  for (const OpCase& c : op_table()) {
    CAPTURE(c.name);
    std::vector<xg::Tensor<float>> f_cpu, f_dev;
    std::vector<xg::Tensor<double>> d_cpu, d_dev;
    for (std::size_t k = 0; k < c.shapes.size(); ++k) {
      Ref r = random_input(c.shapes[k], c.domains[k], 31 + 97 * k);
      f_cpu.push_back(to_tensor<float>(r));
      d_cpu.push_back(to_tensor<double>(r));
      f_dev.push_back(f_cpu.back().to(xg::Device::thrust));
      d_dev.push_back(d_cpu.back().to(xg::Device::thrust));
    }
    xg::Tensor<float> f_got;
    try {
      f_got = c.f32(f_dev);
    } catch (const xg::ValueError& e) {
      // Only a missing Thrust kernel may stop a row, or a row that makes a cpu tensor itself
      // (labels, random numbers) meeting its device inputs; anything else is a failure.
      const std::string why = e.what();
      REQUIRE((why.find("no Device::thrust kernel yet") != std::string::npos ||
               why.find("inputs on different devices") != std::string::npos));
      not_yet.insert(c.name);
      continue;
    }
    ++ran;
    const auto f_want = c.f32(f_cpu).to_vector(), f_vals = f_got.to_vector();
    const auto d_want = c.f64(d_cpu).to_vector(), d_vals = c.f64(d_dev).to_vector();
    CHECK(f_got.device() == xg::Device::thrust);
    REQUIRE(f_vals.size() == f_want.size());
    REQUIRE(d_vals.size() == d_want.size());
    for (std::size_t i = 0; i < f_vals.size(); ++i) {
      CAPTURE(i);
      CHECK(close(f_vals[i], f_want[i], 1e-6));
      CHECK(close(d_vals[i], d_want[i], 1e-14));
    }
  }
  // Every row runs but resize's, random_uniform's and those that make cpu labels themselves.
  MESSAGE(ran << " op-table rows ran on Device::thrust; " << not_yet.size() << " wait for Thrust kernels");
  CHECK(ran >= 175);
  for (const char* runs :
       {"add",    "mul",         "tanh",      "where",        "fma",        "sum",        "mean",
        "max",    "argmax",      "transpose", "broadcast_to", "slice",      "concat",     "cast",
        "matmul", "log_softmax", "softmax",   "conv2d",       "max_pool2d", "avg_pool2d", "bias_add"})
    for (const std::string& name : not_yet) {
      CAPTURE(name);
      CHECK_FALSE((name == runs || name.rfind(std::string(runs) + "/", 0) == 0));
    }
}

TEST_CASE("thrust: gradients of every op-table row that runs on Device::thrust match the cpu backend's") {
  using namespace xgrad::testing;
  int ran = 0;
  for (const OpCase& c : op_table()) {
    if (!c.differentiable) continue;
    CAPTURE(c.name);
    // The gradients of sum(op(inputs) * weights) with respect to every input, on `device`.
    auto gradients = [&](xg::Device device) {
      std::vector<xg::Tensor<double>> in;
      for (std::size_t k = 0; k < c.shapes.size(); ++k) {
        auto x = to_tensor<double>(random_input(c.shapes[k], c.domains[k], 41 + 97 * k)).to(device);
        in.push_back(x.set_requires_grad(true));
      }
      auto out = c.f64(in);
      auto weights = xg::randn<double>(out.shape(), 43).to(device);
      xg::sum(out * weights).backward();
      std::vector<std::vector<double>> grads;
      for (auto& x : in) grads.push_back(x.grad().defined() ? x.grad().to_vector() : std::vector<double>{});
      return grads;
    };
    std::vector<std::vector<double>> on_device;
    try {
      on_device = gradients(xg::Device::thrust);
    } catch (const xg::ValueError& e) {
      const std::string why = e.what();
      REQUIRE((why.find("no Device::thrust kernel yet") != std::string::npos ||
               why.find("inputs on different devices") != std::string::npos));
      continue;
    }
    ++ran;
    const auto on_cpu = gradients(xg::Device::cpu);
    REQUIRE(on_device.size() == on_cpu.size());
    for (std::size_t k = 0; k < on_cpu.size(); ++k) {
      CAPTURE(k);
      REQUIRE(on_device[k].size() == on_cpu[k].size());
      for (std::size_t i = 0; i < on_cpu[k].size(); ++i) CHECK(close(on_device[k][i], on_cpu[k][i], 1e-12));
    }
  }
  MESSAGE(ran << " op-table rows have their gradients checked on Device::thrust");
  CHECK(ran >= 150);
}

TEST_CASE("thrust: gradients flow through .to() and through elementwise ops on the device") {
  auto x = xg::tensor<double>({0.5, -1.0, 2.0}).set_requires_grad(true);
  auto y = xg::tanh(x.to(xg::Device::thrust)) * 3.0;
  auto loss = xg::sum(y.to(xg::Device::cpu));
  loss.backward();
  REQUIRE(x.grad().defined());
  CHECK(x.grad().device() == xg::Device::cpu);
  const auto g = x.grad().to_vector();
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double t = std::tanh(x.to_vector()[i]);
    CHECK(g[i] == doctest::Approx(3.0 * (1.0 - t * t)).epsilon(1e-14));
  }
}

TEST_CASE("thrust: an MLP trained with cross-entropy on Device::thrust follows the cpu run step for step") {
  // 16 samples of 8 features, 4 classes; a 8-32-4 ReLU network; 10 plain SGD steps. Every op of
  // the step (matmul, bias add, relu, the one-op cross-entropy and their gradients, the
  // in-place updates) runs on the device.
  const auto features = xg::randn<double>({16, 8}, 51);
  std::vector<std::int32_t> classes(16);
  for (std::size_t i = 0; i < classes.size(); ++i) classes[i] = static_cast<std::int32_t>((i * 7) % 4);
  const auto labels = xg::tensor<std::int32_t>(classes);
  auto train = [&](xg::Device device) {
    auto w1 = xg::randn<double>({8, 32}, 52).to(device), b1 = xg::zeros<double>({32}).to(device);
    auto w2 = xg::randn<double>({32, 4}, 53).to(device), b2 = xg::zeros<double>({4}).to(device);
    std::vector<xg::Tensor<double>*> params{&w1, &b1, &w2, &b2};
    for (auto* p : params) p->set_requires_grad(true);
    const auto x = features.to(device);
    const auto y = labels.to(device);
    std::vector<double> losses;
    for (int step = 0; step < 10; ++step) {
      auto hidden = xg::relu(xg::matmul(x, w1) + b1);
      auto loss = xg::softmax_cross_entropy(xg::matmul(hidden, w2) + b2, y);
      CHECK(loss.device() == device);
      loss.backward();
      losses.push_back(loss.item());
      xg::no_grad off;
      for (auto* p : params) {
        *p -= p->grad() * 0.1;
        p->zero_grad();
      }
    }
    return losses;
  };
  const auto on_device = train(xg::Device::thrust), on_cpu = train(xg::Device::cpu);
  REQUIRE(on_device.size() == on_cpu.size());
  CHECK(on_cpu.back() < on_cpu.front());  // it learns
  for (std::size_t i = 0; i < on_cpu.size(); ++i) {
    CAPTURE(i);
    CHECK(close(on_device[i], on_cpu[i], 1e-12));
  }
  // A label outside [0, classes) is refused on the device too.
  auto bad = xg::tensor<std::int32_t>({0, 9}).to(xg::Device::thrust);
  auto logits = xg::randn<double>({2, 4}, 54).to(xg::Device::thrust);
  CHECK(message_of<xg::ValueError>([&] { (void)xg::softmax_cross_entropy(logits, bad); }).find("label 9 at index 1") !=
        std::string::npos);
}

TEST_CASE("thrust: LeNet5 trains 100 steps on Device::thrust with the cpu run's losses (within 1e-4)") {
  // The parameters and optimizer state are made on the device (the default device while the
  // model is built), the batches moved there; the model runs eagerly (jit is cpu only so far).
  const xg::Mode saved_mode = xg::get_mode();
  xg::set_mode(xg::Mode::eager);
  const auto images = xg::randn<float>({4, 1, 32, 32}, 61);
  const auto labels = xg::tensor<std::int32_t>({1, 7, 3, 9});
  auto train = [&](xg::Device device) {
    DefaultDevice on(device);
    xg::init::set_seed(3);
    xg::models::LeNet5 net;
    xg::nn::SoftmaxCrossEntropy loss({.sparse = true, .reduction = xg::Reduction::mean});
    xg::optim::Momentum opt(net.parameters(), 0.01f, 0.9f);
    xg::Model model(net, loss, opt);
    for (const auto& p : net.parameters()) CHECK(p.device() == device);
    const auto x = images.to(device);
    const auto y = labels.to(device);
    std::vector<float> losses;
    for (int step = 0; step < 100; ++step) losses.push_back(model.train_step(x, y));
    return losses;
  };
  const auto on_cpu = train(xg::Device::cpu), on_device = train(xg::Device::thrust);
  xg::set_mode(saved_mode);
  REQUIRE(on_device.size() == on_cpu.size());
  CHECK(on_cpu.back() < 0.5f * on_cpu.front());  // it learns the four labels
  for (std::size_t i = 0; i < on_cpu.size(); ++i) {
    CAPTURE(i);
    CHECK(close(on_device[i], on_cpu[i], 1e-4));
  }
}

#endif  // XGRAD_WITH_THRUST
