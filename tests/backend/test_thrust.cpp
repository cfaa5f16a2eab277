// Device::thrust: transfers, device checks, factories on the default device, and every op-table
// row whose ops have a Thrust kernel against the cpu backend. Built with XGRAD_WITH_THRUST
// (scripts/test.sh: OMP in the optimized build, CPP under the sanitizers); without it, the
// tests check that Device::thrust says it is not built in.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>

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

/// A row's inputs at float and double on the cpu, and their copies on Device::thrust; input(k)
/// gives the values of input k.
struct DeviceRowInputs {
  std::vector<xg::Tensor<float>> f_cpu, f_dev;
  std::vector<xg::Tensor<double>> d_cpu, d_dev;
};
template <class Input> DeviceRowInputs device_row_inputs(std::size_t count, Input input) {
  DeviceRowInputs in;
  for (std::size_t k = 0; k < count; ++k) {
    const xgrad::testing::Ref r = input(k);
    in.f_cpu.push_back(xgrad::testing::to_tensor<float>(r));
    in.d_cpu.push_back(xgrad::testing::to_tensor<double>(r));
    in.f_dev.push_back(in.f_cpu.back().to(xg::Device::thrust));
    in.d_dev.push_back(in.d_cpu.back().to(xg::Device::thrust));
  }
  return in;
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

TEST_CASE("thrust: ops refuse tensors on two devices") {
  auto x = xg::randn<float>({2, 3}, 2);
  auto y = x.to(xg::Device::thrust);
  const std::string mixed = message_of<xg::ValueError>([&] { (void)(x + y); });
  CHECK(mixed.find("Add: inputs on different devices (input 0 on cpu, input 1 on thrust)") == 0);
  CHECK(mixed.find("move them with .to(device)") != std::string::npos);
  // A scalar (a one-element cpu tensor) goes with any device.
  CHECK((y * 2.0f).device() == xg::Device::thrust);
  CHECK((y + xg::scalar<float>(1.0f)).to_vector() == (x + 1.0f).to_vector());
  // Labels on the cpu with logits on the device: refused, as any op's inputs.
  const auto labels = xg::tensor<std::int32_t>({0, 2});
  const std::string xent = message_of<xg::ValueError>([&] { (void)xg::softmax_cross_entropy(y, labels); });
  CHECK(xent.find("inputs on different devices (input 0 on thrust, input 1 on cpu)") != std::string::npos);
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

TEST_CASE("thrust: every op-table row runs on Device::thrust and matches the cpu backend") {
  // The rows run with the device as the default device, so what a row makes itself (labels,
  // random keys, constants) is made there too.
  using namespace xgrad::testing;
  std::size_t ran = 0;
  for (const OpCase& c : op_table()) {
    CAPTURE(c.name);
    const auto [f_cpu, f_dev, d_cpu, d_dev] = device_row_inputs(
        c.shapes.size(), [&](std::size_t k) { return random_input(c.shapes[k], c.domains[k], 31 + 97 * k); });
    const std::vector<float> f_want = c.f32(f_cpu).to_vector();
    const std::vector<double> d_want = c.f64(d_cpu).to_vector();
    DefaultDevice on(xg::Device::thrust);
    const xg::Tensor<float> f_got = c.f32(f_dev);
    const std::vector<float> f_vals = f_got.to_vector();
    const std::vector<double> d_vals = c.f64(d_dev).to_vector();
    ++ran;
    CHECK(f_got.device() == xg::Device::thrust);
    REQUIRE(f_vals.size() == f_want.size());
    REQUIRE(d_vals.size() == d_want.size());
    for (std::size_t i = 0; i < f_vals.size(); ++i) {
      CAPTURE(i);
      CHECK(close(f_vals[i], f_want[i], 1e-6));
      CHECK(close(d_vals[i], d_want[i], 1e-14));
    }
  }
  MESSAGE(ran << " op-table rows ran on Device::thrust");
  CHECK(ran == op_table().size());
}

TEST_CASE("thrust: gradients of every differentiable op-table row on Device::thrust match the cpu backend's") {
  using namespace xgrad::testing;
  std::size_t ran = 0, differentiable = 0;
  for (const OpCase& c : op_table()) {
    if (!c.differentiable) continue;
    ++differentiable;
    CAPTURE(c.name);
    // The gradients of sum(op(inputs) * weights) with respect to every input, on `device`.
    auto gradients = [&](xg::Device device) {
      DefaultDevice on(device);
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
    const auto on_device = gradients(xg::Device::thrust);
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
  CHECK(ran == differentiable);
}

namespace {

/// On the device and equal to `want`: bit for bit when `bitwise`, else within rel of the
/// largest magnitude (non-strict rewrites change rounding). NaN matches NaN.
template <class T> void check_device_result(const xg::Tensor<T>& got, const xg::Tensor<T>& want, bool bitwise) {
  CHECK(got.device() == xg::Device::thrust);
  REQUIRE(got.shape() == want.shape());
  const auto g = got.to_vector(), w = want.to_vector();
  double scale = 1;
  for (T v : w)
    if (std::isfinite(v)) scale = std::max(scale, std::abs(static_cast<double>(v)));
  const double rel = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const bool same = bitwise ? std::memcmp(&g[i], &w[i], sizeof(T)) == 0
                              : close(g[i] / static_cast<T>(scale), w[i] / static_cast<T>(scale), rel);
    if (!same && mismatches++ == 0) MESSAGE("element " << i << ": " << g[i] << " vs " << w[i]);
  }
  CHECK(mismatches == 0);
}

/// Runs row c through jit on the device with `config` and checks values and gradients against
/// eager on the device.
template <class T> void check_row_jit_on_device(const xgrad::testing::OpCase& c, const xg::JitConfig& config) {
  using namespace xgrad::testing;
  const auto& f = row_fn<T>(c);
  DefaultDevice on(xg::Device::thrust);
  std::vector<xg::Tensor<T>> in;
  for (std::size_t k = 0; k < c.shapes.size(); ++k)
    in.push_back(to_tensor<T>(random_input(c.shapes[k], c.domains[k], 71 + 97 * k)).to(xg::Device::thrust));
  const xg::Tensor<T> eager = f(in);
  const bool bitwise = config.strict || config.level == xg::JitLevel::O0;
  auto jitted = xg::jit([&f](std::vector<xg::Tensor<T>> xs) { return f(xs); }, config);
  check_device_result(jitted(in), eager, bitwise);
  if (!c.differentiable) return;
  auto weights = xg::randn<T>(eager.shape(), 73).to(xg::Device::thrust);
  auto want = xgrad::testing::loss_and_grads<T>(f, in, weights);
  auto got = xg::jit(
      [&f](std::vector<xg::Tensor<T>> xs, xg::Tensor<T> w) { return xgrad::testing::loss_and_grads<T>(f, xs, w); },
      config)(in, weights);
  check_device_result(got.first, want.first, bitwise);
  REQUIRE(got.second.size() == want.second.size());
  for (std::size_t k = 0; k < want.second.size(); ++k) check_device_result(got.second[k], want.second[k], bitwise);
}

}  // namespace

TEST_CASE("thrust: every op-table row through jit on Device::thrust, at each level, equals eager on the device") {
  using namespace xgrad::testing;
  const std::vector<std::pair<std::string, xg::JitConfig>> configs{
      {"O0", {.level = xg::JitLevel::O0}},
      {"O1 strict", {.level = xg::JitLevel::O1, .strict = true}},
      {"O2 strict, freed buffers poisoned", {.level = xg::JitLevel::O2, .strict = true, .poison_freed_buffers = true}},
      {"O2", {.level = xg::JitLevel::O2}}};
  for (const auto& entry : configs) {  // no structured binding: clang 14 cannot capture one in CAPTURE
    const std::string& name = entry.first;
    const xg::JitConfig& config = entry.second;
    CAPTURE(name);
    for (const OpCase& c : op_table()) {
      CAPTURE(c.name);
      check_row_jit_on_device<float>(c, config);
      check_row_jit_on_device<double>(c, config);
    }
  }
}

TEST_CASE("thrust: op-table rows with NaN, ±inf, ±0 and denormal inputs match the cpu backend, eager and compiled") {
  // NaN propagation, integer and pow semantics live in the ops' apply bodies, which the device
  // runs as scalars inside its functors: the same NaNs and infinities as the cpu's batches.
  using namespace xgrad::testing;
  auto same_special = [](auto got, auto want, double rel) {
    if (std::isinf(static_cast<double>(got)) || std::isinf(static_cast<double>(want))) return got == want;
    return close(got, want, rel);  // NaN matches NaN
  };
  for (const OpCase& c : op_table()) {
    CAPTURE(c.name);
    for (int phase = 0; phase < kSpecialPhases; phase += 4) {
      CAPTURE(phase);
      const auto [f_cpu, f_dev, d_cpu, d_dev] = device_row_inputs(c.shapes.size(), [&](std::size_t k) {
        return special_input(c.shapes[k], c.domains[k], 31 + 97 * k, k, phase);
      });
      const std::vector<float> f_want = c.f32(f_cpu).to_vector();
      const std::vector<double> d_want = c.f64(d_cpu).to_vector();
      DefaultDevice on(xg::Device::thrust);
      const std::vector<float> f_got = c.f32(f_dev).to_vector();
      const xg::Tensor<double> d_eager = c.f64(d_dev);
      const std::vector<double> d_got = d_eager.to_vector();
      REQUIRE(f_got.size() == f_want.size());
      REQUIRE(d_got.size() == d_want.size());
      std::size_t mismatches = 0;
      for (std::size_t i = 0; i < f_got.size(); ++i)
        if (!same_special(f_got[i], f_want[i], 1e-5) && mismatches++ == 0)
          MESSAGE("float element " << i << ": " << f_got[i] << " vs " << f_want[i]);
      for (std::size_t i = 0; i < d_got.size(); ++i)
        if (!same_special(d_got[i], d_want[i], 1e-12) && mismatches++ == 0)
          MESSAGE("double element " << i << ": " << d_got[i] << " vs " << d_want[i]);
      CHECK(mismatches == 0);
      // Compiled at O2 (strict: fused functors, folded constants) on the device: eager's numbers.
      const auto jitted = xg::jit([&c](std::vector<xg::Tensor<double>> xs) { return c.f64(xs); },
                                  {.level = xg::JitLevel::O2, .strict = true})(d_dev)
                              .to_vector();
      REQUIRE(jitted.size() == d_got.size());
      std::size_t differ = 0;
      for (std::size_t i = 0; i < d_got.size(); ++i)
        if (!(std::memcmp(&jitted[i], &d_got[i], sizeof(double)) == 0 ||
              (std::isnan(jitted[i]) && std::isnan(d_got[i]))))
          ++differ;
      CHECK(differ == 0);
    }
  }
}

TEST_CASE("thrust: a compiled graph runs on its inputs' device; two devices at once are refused") {
  // The table is made while tracing: a constant of the graph, made on the cpu and moved to the
  // device of the call (eagerly it would meet device tensors and be refused).
  auto f = xg::jit([](xg::Tensor<float> x) { return xg::tanh(x * xg::tensor<float>({1, 2, 3, 4}) + 1.0f) * x; });
  const auto x = xg::tensor<float>({0.5f, -1, 2, 0.25f});
  const auto on_cpu = f(x), on_device = f(x.to(xg::Device::thrust));
  CHECK(on_cpu.device() == xg::Device::cpu);
  CHECK(on_device.device() == xg::Device::thrust);
  for (std::size_t i = 0; i < 4; ++i) CHECK(close(on_device.to_vector()[i], on_cpu.to_vector()[i], 1e-6));
  // A tensor the function reads by reference is an input of the graph like its arguments.
  const auto weights = xg::tensor<float>({1, 2, 3, 4});
  auto g = xg::jit([&](xg::Tensor<float> a) { return a * weights; });
  const std::string why = message_of<xg::ValueError>([&] { (void)g(x.to(xg::Device::thrust)); });
  CAPTURE(why);
  CHECK(why.find("input 0 (arg0: f32[4]) is on thrust but input 1 (f32[4]) is on cpu") != std::string::npos);
  CHECK(why.find("a compiled graph runs on one device") != std::string::npos);
}

TEST_CASE("thrust: a fused group runs on the device as one functor, bit for bit as eager there") {
  // A dense layer's epilogue (bias, ReLU) and a chain after it with a broadcast bias, a cpu
  // scalar, a comparison and a select, two outputs.
  auto step = [](xg::Tensor<float> x, xg::Tensor<float> w, xg::Tensor<float> b) {
    auto h = xg::relu(xg::matmul(x, w) + b);
    auto y = xg::tanh(h * 1.5f + b) * xg::sigmoid(h) + xg::where(h > b, h, h * 0.1f);
    return std::pair{y, h * h};
  };
  // x [5, 2] is no operand of the group ([5, 4]): read as one, it would be read out of bounds.
  const auto x = xg::randn<float>({5, 2}, 81), w = xg::randn<float>({2, 4}, 82), b = xg::randn<float>({4}, 83);
  auto jitted = xg::jit(step, {.level = xg::JitLevel::O2, .strict = true});
  const std::string ir = jitted.lower(x, w, b).ir();
  CAPTURE(ir);
  CHECK(ir.find("Fused(") != std::string::npos);
  const auto on = [](const xg::Tensor<float>& t) { return t.to(xg::Device::thrust); };
  const auto [y, hh] = jitted(on(x), on(w), on(b));
  const auto [ey, ehh] = step(on(x), on(w), on(b));
  CHECK(y.device() == xg::Device::thrust);
  CHECK(y.to_vector() == ey.to_vector());
  CHECK(hh.to_vector() == ehh.to_vector());

  // Integer values: the group runs op by op, with the same results.
  auto ints = xg::jit([](xg::Tensor<std::int32_t> a, xg::Tensor<std::int32_t> c) { return (a + c) * a - c; });
  const auto a = xg::tensor<std::int32_t>({1, -2, 3, 40}), c = xg::tensor<std::int32_t>({5, 6, -7, 8});
  const auto got = ints(a.to(xg::Device::thrust), c.to(xg::Device::thrust));
  CHECK(got.device() == xg::Device::thrust);
  CHECK(got.to_vector() == ints(a, c).to_vector());
}

TEST_CASE("thrust: cond, fori_loop and while_loop run on the device, eagerly and compiled, with gradients") {
  using T = xg::Tensor<double>;
  const auto program = xgrad::testing::control_flow_program;
  auto gradients = xg::grad(program, xg::argnums<0, 1>);
  auto jitted = xg::jit(program);
  auto jitted_gradients = xg::jit(gradients);
  const auto w = xg::tensor<double>({1.5, 0.5, -0.7});
  auto check = [](const T& got, const T& want) {
    CHECK(got.device() == xg::Device::thrust);
    const auto g = got.to_vector(), e = want.to_vector();
    REQUIRE(g.size() == e.size());
    for (std::size_t i = 0; i < g.size(); ++i) CHECK(close(g[i], e[i], 1e-12));
  };
  for (const auto& x : {xg::tensor<double>({0.3, -0.1, 0.5}), xg::tensor<double>({-0.3, -0.1, -0.5})}) {
    CAPTURE(x.to_vector());
    const auto xd = x.to(xg::Device::thrust), wd = w.to(xg::Device::thrust);
    const auto want = program(x, w);
    const auto [gx, gw] = gradients(x, w);
    check(program(xd, wd), want);
    check(jitted(xd, wd), want);
    const auto [ex, ew] = gradients(xd, wd);
    check(ex, gx);
    check(ew, gw);
    const auto [jx, jw] = jitted_gradients(xd, wd);
    check(jx, gx);
    check(jw, gw);
  }
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
  // model is built), the batches moved there; in eager mode op by op, in graph mode as one
  // compiled train step.
  const xg::Mode saved_mode = xg::get_mode();
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
  for (const xg::Mode mode : {xg::Mode::eager, xg::Mode::graph}) {
    CAPTURE((mode == xg::Mode::graph ? "graph mode" : "eager mode"));
    xg::set_mode(mode);
    const auto on_cpu = train(xg::Device::cpu), on_device = train(xg::Device::thrust);
    REQUIRE(on_device.size() == on_cpu.size());
    CHECK(on_cpu.back() < 0.5f * on_cpu.front());  // it learns the four labels
    for (std::size_t i = 0; i < on_cpu.size(); ++i) {
      CAPTURE(i);
      CHECK(close(on_device[i], on_cpu[i], 1e-4));
    }
  }
  xg::set_mode(saved_mode);
}

TEST_CASE("thrust: reductions over long segments, cut into chunks reduced in parallel, match the cpu backend") {
  // Few outputs over long axes take the two-pass path; the sums differ from the cpu's in
  // rounding only, the extrema not at all.
  const auto x = xg::randn<double>({3, 5000, 2}, 7);
  const auto xd = x.to(xg::Device::thrust);
  auto same = [](const auto& on_device, const auto& on_cpu, double rel) {
    CHECK(on_device.device() == xg::Device::thrust);
    REQUIRE(on_device.shape() == on_cpu.shape());
    const auto d = on_device.to_vector(), c = on_cpu.to_vector();
    for (std::size_t i = 0; i < c.size(); ++i) CHECK(close(d[i], c[i], rel));
  };
  same(xg::sum(xd, {1}), xg::sum(x, {1}), 1e-12);
  same(xg::mean(xd, {1}), xg::mean(x, {1}), 1e-12);
  same(xg::max(xd, {1}), xg::max(x, {1}), 0);
  same(xg::min(xd, {0, 1}), xg::min(x, {0, 1}), 0);
  same(xg::sum(xd, {2}), xg::sum(x, {2}), 1e-12);  // short segments: one pass
  const auto ones = xg::ones<std::int32_t>({2, 1000});
  same(xg::sum(ones.to(xg::Device::thrust), {1}), xg::sum(ones, {1}), 0);
}

TEST_CASE("thrust: a convolution whose im2col matrix exceeds the scratch budget runs in chunks of images") {
  // 16 x 4 x 4 taps over 182 x 182 positions: 8.5M elements of col per image, over half the 2^24
  // budget, so each of the 3 images is its own chunk (the weight gradient sums across chunks).
  auto run = [](xg::Device device) {
    DefaultDevice on(device);
    auto x = xg::randn<double>({3, 16, 185, 185}, 11).to(device).set_requires_grad(true);
    auto w = xg::randn<double>({2, 16, 4, 4}, 12).to(device).set_requires_grad(true);
    auto y = xg::conv2d(x, w);
    xg::sum(y * xg::randn<double>(y.shape(), 13).to(device)).backward();
    return std::vector<std::vector<double>>{y.to_vector(), x.grad().to_vector(), w.grad().to_vector()};
  };
  const auto on_device = run(xg::Device::thrust), on_cpu = run(xg::Device::cpu);
  for (std::size_t k = 0; k < on_cpu.size(); ++k) {
    CAPTURE(k);
    REQUIRE(on_device[k].size() == on_cpu[k].size());
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < on_cpu[k].size(); ++i) mismatches += !close(on_device[k][i], on_cpu[k][i], 1e-10);
    CHECK(mismatches == 0);
  }
}

#endif  // XGRAD_WITH_THRUST
