// jit: tracing, the signature cache, Parameters by reference and assign effects, whole
// train steps, nested jit, concurrent calls, run-time errors.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <thread>

#include <xgrad/xgrad.hpp>

#include "jit/jit_support.hpp"
#include "test_support.hpp"

namespace xg = xgrad;
using namespace xgrad::testing;

TEST_CASE("jit: the seeds' examples give the eager results") {
  auto x = xg::tensor<float>({1, 2, 3}), y = xg::tensor<float>({4, 5, 6});
  auto add = xg::jit([](auto a, auto b) { return a + b; });
  auto mul = xg::jit([](auto a, auto b) { return a * b; });
  CHECK(add(x, y).to_vector() == std::vector<float>{5, 7, 9});
  CHECK(mul(x, y).to_vector() == std::vector<float>{4, 10, 18});

  // GradNetWrtX: the gradient of sum(matmul(x * z, y)) with respect to x, traced whole.
  auto gx = xg::tensor<float>({{0.5, 0.6, 0.4}, {1.2, 1.3, 1.1}});
  auto gy = xg::tensor<float>({{0.01, 0.3, 1.1}, {0.1, 0.2, 1.3}, {2.1, 1.2, 3.3}});
  auto z = xg::tensor<float>({1.0f});
  auto net = [&](xg::Tensor<float> a, xg::Tensor<float> b) { return xg::matmul(a * z, b); };
  auto grad_net = xg::jit([&](auto a, auto b) { return xg::grad(net)(a, b); });
  CHECK(same_bits(grad_net(gx, gy), xg::grad(net)(gx, gy)));

  // A C++ loop unrolls while tracing.
  auto loop = xg::jit([](xg::Tensor<float> v) {
    for (int i = 0; i < 3; ++i) v = v + 1.0f;
    return v;
  });
  CHECK(loop(x).to_vector() == std::vector<float>{4, 5, 6});
  // Three adds of one constant (CSE merged the three 1s), fused into one kernel at O2.
  CHECK(loop.lower(x).ir().find("Fused(%0, %1) {body=jit@test_jit.cpp:33.fused0, ops=\"Add, Add, Add\"}") !=
        std::string::npos);
  CHECK(loop.lower(x).num_nodes() == 2);
}

TEST_CASE("jit: a cached signature does not trace again; a new shape traces once more") {
  int traces = 0;
  auto f = xg::jit([&traces](xg::Tensor<float> v) {
    ++traces;  // runs only while tracing
    return xg::exp(v) * 2.0f;
  });
  auto a = xg::ones<float>({3}), b = xg::ones<float>({4});
  f(a);
  {
    xg::expect_cache_hit guard;
    for (int i = 0; i < 5; ++i) f(a);
  }
  CHECK(traces == 1);
  CHECK(f.cache_size() == 1);
  LogCapture log;
  f(b);
  CHECK(traces == 2);
  CHECK(f.cache_size() == 2);
  REQUIRE(log.lines.size() == 1);
  CHECK(log.lines[0].find("argument 0: f32[3] -> f32[4]") != std::string::npos);
  f(a);
  f(b);
  CHECK(traces == 2);
  // A new dtype is a new signature too, and copies share one cache.
  auto copy = f;
  copy(xg::tensor<float>({{1, 2}, {3, 4}}));
  CHECK(f.cache_size() == 3);
}

TEST_CASE("jit: expect_cache_hit and max_retraces turn a retrace into an error that says why") {
  auto f = xg::jit([](xg::Tensor<float> v, float scale) { return v * scale; }, {.max_retraces = 1, .name = "scaled"});
  f(xg::ones<float>({2}), 2.0f);
  auto msg = message_of<xg::RetraceError>([&] {
    xg::expect_cache_hit guard;
    f(xg::ones<float>({5}), 2.0f);
  });
  CHECK(msg.find("jit 'scaled'") != std::string::npos);
  CHECK(msg.find("expect_cache_hit") != std::string::npos);
  CHECK(msg.find("argument 0: f32[2] -> f32[5]") != std::string::npos);
  {
    LogCapture quiet;
    f(xg::ones<float>({2}), 3.0f);  // a new static value: the one retrace allowed
  }
  auto limit = message_of<xg::RetraceError>([&] { f(xg::ones<float>({7}), 2.0f); });
  CHECK(limit.find("max_retraces is 1") != std::string::npos);
  CHECK(limit.find("argument 0: f32[2] -> f32[7]") != std::string::npos);
  CHECK(f(xg::ones<float>({2}), 3.0f).to_vector() == std::vector<float>{3, 3});
}

TEST_CASE("jit: Parameters are read by reference on every call") {
  xg::Parameter<float> w(xg::tensor<float>({1, 2}), "w");
  auto f = xg::jit([&w](xg::Tensor<float> x) { return x * w; });
  auto x = xg::tensor<float>({10, 10});
  CHECK(f(x).to_vector() == std::vector<float>{10, 20});
  {
    xg::no_grad off;
    w.assign(xg::tensor<float>({3, 4}));
  }
  CHECK(f(x).to_vector() == std::vector<float>{30, 40});
  auto text = f.lower(x).ir();
  CHECK(text.find("Ref[f32[2]]  # w") != std::string::npos);
}

TEST_CASE("jit: an assignment to a Parameter is an effect applied when the call finishes") {
  xg::Parameter<float> w(xg::tensor<float>({1, 2}), "w");
  xg::Parameter<float> v(xg::tensor<float>({5, 6}), "v");
  auto step = xg::jit([&](xg::Tensor<float> x) {
    xg::no_grad off;
    auto before = w * 1.0f;
    w -= x;  // later reads see the new value
    auto after = w * 1.0f;
    return before + after;
  });
  auto out = step(xg::tensor<float>({1, 1}));
  CHECK(out.to_vector() == std::vector<float>{1, 3});  // 1 + 0, 2 + 1
  CHECK(w.to_vector() == std::vector<float>{0, 1});
  step(xg::tensor<float>({1, 1}));
  CHECK(w.to_vector() == std::vector<float>{-1, 0});
  CHECK(step.lower(xg::tensor<float>({1, 1})).ir().find("effect: %") != std::string::npos);

  // A swap: each write sees the values from before the call.
  auto swap = xg::jit([&] {
    xg::no_grad off;
    auto old_w = w * 1.0f;
    w.assign(v);
    v.assign(old_w);
  });
  swap();
  CHECK(w.to_vector() == std::vector<float>{5, 6});
  CHECK(v.to_vector() == std::vector<float>{-1, 0});
}

namespace {

/// A 4-16-3 MLP trained by momentum SGD; the step is the same code eagerly and under jit.
struct Mlp {
  xg::Parameter<float> w1, b1, w2, b2;
  std::vector<xg::Tensor<float>> velocity;
  explicit Mlp(std::uint64_t seed)
      : w1(xg::randn<float>({4, 16}, seed) * 0.5f, "w1"),
        b1(xg::zeros<float>({16}), "b1"),
        w2(xg::randn<float>({16, 3}, seed + 1) * 0.5f, "w2"),
        b2(xg::zeros<float>({3}), "b2") {
    for (const auto& p : params()) velocity.push_back(xg::zeros_like(p));
  }
  std::vector<xg::Tensor<float>> params() const { return {w1, b1, w2, b2}; }

  xg::Tensor<float> step(const xg::Tensor<float>& x, const xg::Tensor<std::int32_t>& labels) {
    auto loss_fn = [&] {
      auto h = xg::relu(xg::bias_add(xg::matmul(x, w1), b1));
      return xg::softmax_cross_entropy(xg::bias_add(xg::matmul(h, w2), b2), labels);
    };
    auto [loss, grads] = xg::value_and_grad(loss_fn, params())();
    xg::no_grad off;
    auto ps = params();
    for (std::size_t i = 0; i < ps.size(); ++i) {
      velocity[i].assign(velocity[i] * 0.9f + grads[i]);
      ps[i] -= velocity[i] * 0.1f;
    }
    return loss;
  }
};

}  // namespace

TEST_CASE("jit: a whole train step updates Parameters exactly as the eager step, over 20 steps") {
  Mlp eager(3), compiled(3);
  // Strict: the default O2 would make each momentum update v * 0.9 + g one fma, rounded once.
  auto step = xg::jit([&compiled](xg::Tensor<float> x, xg::Tensor<std::int32_t> y) { return compiled.step(x, y); },
                      {.strict = true});
  for (int i = 0; i < 20; ++i) {
    auto x = xg::randn<float>({8, 4}, 100 + i);
    auto y = xg::tensor<std::int32_t>(std::vector<std::int32_t>{0, 1, 2, 0, 1, 2, 1, 0});
    auto expected = eager.step(x, y);
    auto got = step(x, y);
    CHECK(same_bits(got, expected));
    for (std::size_t p = 0; p < 4; ++p) CHECK(same_bits(compiled.params()[p], eager.params()[p]));
  }
  CHECK(step.cache_size() == 1);
}
TEST_CASE("jit: lower gives the IR text, Graphviz dot and the node count; nested jit inlines") {
  auto inner = xg::jit([](xg::Tensor<float> a) { return xg::tanh(a); });
  // At O1: at O2 fusion would make the two nodes one.
  auto outer = xg::jit([&inner](xg::Tensor<float> a, xg::Tensor<float> b) { return inner(xg::matmul(a, b)); },
                       {.level = xg::JitLevel::O1});
  auto low = outer.lower(xg::ones<float>({2, 3}), xg::ones<float>({3, 4}));
  CHECK(low.num_nodes() == 2);
  CHECK(low.ir().find("%2 : f32[2, 4] = MatMul(%0, %1)") != std::string::npos);
  CHECK(low.ir().find("%3 : f32[2, 4] = Tanh(%2)") != std::string::npos);
  CHECK(low.dot().rfind("digraph", 0) == 0);
  CHECK(inner.cache_size() == 0);
}

TEST_CASE("jit: containers nest in any order in arguments and results (a vector of pairs of a tensor and a vector)") {
  using Parts = std::vector<std::pair<xg::Tensor<float>, std::vector<xg::Tensor<float>>>>;
  // Per part: its scale times each of its tensors, and the part's tensors summed.
  auto f = [](const Parts& parts) {
    Parts out;
    for (const auto& [scale, tensors] : parts) {
      std::vector<xg::Tensor<float>> scaled;
      xg::Tensor<float> total = xg::zeros_like(tensors[0]);
      for (const auto& t : tensors) {
        scaled.push_back(scale * t);
        total = total + t;
      }
      out.emplace_back(total, scaled);
    }
    return out;
  };
  const Parts parts{
      {xg::full<float>({}, 2.0f), {xg::tensor<float>({1, 2}), xg::tensor<float>({3, 4})}},
      {xg::full<float>({}, -1.0f), {xg::tensor<float>({5, 6}), xg::tensor<float>({7, 8}), xg::tensor<float>({9, 10})}}};
  const Parts eager = f(parts);
  const Parts compiled = xg::jit(f)(parts);
  REQUIRE(compiled.size() == 2);
  for (std::size_t p = 0; p < 2; ++p) {
    CHECK(compiled[p].first.to_vector() == eager[p].first.to_vector());
    REQUIRE(compiled[p].second.size() == eager[p].second.size());
    for (std::size_t i = 0; i < eager[p].second.size(); ++i)
      CHECK(compiled[p].second[i].to_vector() == eager[p].second[i].to_vector());
  }
  CHECK(compiled[1].first.to_vector() == std::vector<float>{21, 24});
  CHECK(compiled[0].second[1].to_vector() == std::vector<float>{6, 8});
}

TEST_CASE("jit: concurrent calls of one jitted function from 2 threads give correct results") {
  auto f = xg::jit([](xg::Tensor<float> a, xg::Tensor<float> b) { return xg::sum(xg::matmul(a, b) * 0.5f, {1}); });
  std::atomic<int> wrong{0};
  auto worker = [&](int id) {
    for (int i = 0; i < 200; ++i) {
      std::int64_t n = 2 + (i + id) % 3;  // three signatures, traced by whichever thread comes first
      auto a = xg::full<float>({n, 3}, static_cast<float>(id + 1));
      auto b = xg::full<float>({3, 2}, static_cast<float>(i % 5));
      auto out = f(a, b).to_vector();
      float expected = 0.5f * 3 * static_cast<float>(id + 1) * static_cast<float>(i % 5) * 2;
      for (float v : out) wrong += v != expected;
      wrong += out.size() != static_cast<std::size_t>(n);
    }
  };
  LogCapture quiet;
  std::thread t0(worker, 0), t1(worker, 1);
  t0.join();
  t1.join();
  CHECK(wrong == 0);
  CHECK(f.cache_size() == 3);
}
TEST_CASE("jit: an in-place update of an argument reaches the caller, as it does eagerly") {
  auto bump = [](xg::Tensor<float> v) {
    v += 1.0f;
    return v * 2.0f;
  };
  auto eager_x = xg::tensor<float>({1, 2}), jit_x = xg::tensor<float>({1, 2});
  auto expected = bump(eager_x);
  auto jitted = xg::jit(bump);
  CHECK(same_bits(jitted(jit_x), expected));
  CHECK(same_bits(jit_x, eager_x));
}

TEST_CASE("jit: errors that depend on values are raised when the graph runs, naming the op") {
  auto loss = xg::jit([](xg::Tensor<float> logits, xg::Tensor<std::int32_t> labels) {
    return xg::softmax_cross_entropy(logits, labels);
  });
  auto logits = xg::zeros<float>({2, 3});
  CHECK(loss(logits, xg::tensor<std::int32_t>(std::vector<std::int32_t>{0, 2})).item() ==
        doctest::Approx(std::log(3.0)));
  auto msg = message_of<xg::ValueError>([&] {
    loss(logits, xg::tensor<std::int32_t>(std::vector<std::int32_t>{0, 3}));
  });
  CHECK(msg.find("SoftmaxCrossEntropyWithLogits: label 3 at index 1 is outside [0, 3)") != std::string::npos);
}
