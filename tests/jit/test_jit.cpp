// jit: tracing, the signature cache, Parameters by reference and assign effects, whole
// train steps, diagnostics (the seeds' BiasAdd report), print, and concurrent calls.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include <xgrad/xgrad.hpp>

#include "test_support.hpp"

namespace xg = xgrad;
using xgrad::testing::message_of;

namespace {

template <class T> bool same_bits(const xg::Tensor<T>& a, const xg::Tensor<T>& b) {
  if (!(a.shape() == b.shape())) return false;
  auto x = a.to_vector(), y = b.to_vector();
  return std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
}

/// Collects jit's log lines while alive.
struct LogCapture {
  std::mutex mutex;
  std::vector<std::string> lines;
  LogCapture() {
    xg::set_jit_log([this](const std::string& line) {
      std::lock_guard lock(mutex);
      lines.push_back(line);
    });
  }
  ~LogCapture() {
    xg::set_jit_log([](const std::string& line) { std::cerr << line << '\n'; });
  }
};

/// Captures standard output while alive.
struct CoutCapture {
  std::ostringstream text;
  std::streambuf* previous;
  CoutCapture() : previous(std::cout.rdbuf(text.rdbuf())) {}
  ~CoutCapture() { std::cout.rdbuf(previous); }
};

}  // namespace

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
  CHECK(loop.lower(x).num_nodes() == 4);  // three adds of one constant (CSE merged the three 1s)
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
  auto step = xg::jit([&compiled](xg::Tensor<float> x, xg::Tensor<std::int32_t> y) { return compiled.step(x, y); });
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

TEST_CASE("jit: the seeds' BiasAdd failure reads like analyze_fail.dat (golden)") {
  xg::Parameter<float> weight(xg::randn<float>({32, 8}, 1), "weight");
  xg::Parameter<float> bias(xg::zeros<float>({4}), "bias");
  auto net = xg::jit(
      [&](xg::Tensor<float> x1) {
        auto x = xg::matmul(x1, weight);
        return xg::bias_add(x, bias);
      },
      {.name = "Net"});
  const int line = __LINE__ - 4;  // the matmul; bias_add is on the next line
  auto x = xg::reshape(xg::arange<float>(3 * 32), {3, 32});
  std::string file = "test_jit.cpp:";
  auto at = [&](int l) { return file + std::to_string(l); };
  std::string expected =
      "BiasAdd: bias must have shape [C] where C is axis 1 of x, which needs at least 2 axes (inputs x: Float32[3, 8], "
      "bias: Float32[4]) (at " +
      at(line + 1) +
      ")\n"
      "\n"
      "jit 'Net' stopped tracing at BiasAdd (" +
      at(line + 1) +
      "). The graph traced so far, the failing node marked:\n"
      "\n"
      "graph Net(\n"
      "    %0 : f32[3, 32]  # arg0\n"
      "    %1 : Ref[f32[32, 8]]  # weight\n"
      "    %3 : Ref[f32[4]]  # bias\n"
      ") {\n"
      "  %2 : f32[3, 8] = MatMul(%0, %1) {transpose_a=false, transpose_b=false}  # " +
      at(line) +
      "\n"
      "#------------------------> failed here\n"
      "  BiasAdd(%2, %3)  # (f32[3, 8], Ref[f32[4]])  # " +
      at(line + 1) +
      "\n"
      "}\n"
      "\n"
      "The failing node's inputs:\n"
      "  %2 : f32[3, 8]  made by MatMul at " +
      at(line) +
      "\n"
      "  %3 : Ref[f32[4]]  a tensor read by reference 'bias'\n";
  auto msg = message_of<xg::TraceError>([&] { net(x); });
  CHECK(msg == expected);
  // A TraceError is a ShapeError, so code that catches shape errors in eager mode still works.
  CHECK_THROWS_AS(net(x), xg::ShapeError);
}

TEST_CASE("jit: set_save_graphs writes the failure report (text and JSON) and the IR at each stage") {
  auto dir = std::filesystem::temp_directory_path() / ("xgrad_graphs_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  xg::set_save_graphs(dir.string(), 2);
  auto bad = xg::jit([](xg::Tensor<float> a, xg::Tensor<float> b) { return xg::matmul(a, b); }, {.name = "bad mm"});
  CHECK_THROWS_AS(bad(xg::ones<float>({2, 3}), xg::ones<float>({2, 3})), xg::TraceError);
  auto good = xg::jit([](xg::Tensor<float> a) { return a * 2.0f; }, {.name = "good"});
  good(xg::ones<float>({2}));
  xg::set_save_graphs("", 0);

  auto read = [](const std::filesystem::path& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  auto report = read(dir / "bad_mm.analyze_fail.ir");
  CHECK(report.find("failed here") != std::string::npos);
  auto json = read(dir / "bad_mm.analyze_fail.json");
  CHECK(json.find("\"failing_node\": {\"op\": \"MatMul\"") != std::string::npos);
  CHECK(json.find("\"shape\": [2, 3]") != std::string::npos);
  int stages = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    auto name = entry.path().filename().string();
    if (name.rfind("good_", 0) == 0) {
      ++stages;
      if (entry.path().extension() == ".dot") CHECK(read(entry.path()).rfind("digraph", 0) == 0);
    }
    CHECK(name.find(".tmp") == std::string::npos);  // written through a rename: nothing half-written
  }
  CHECK(stages == 2);  // the traced graph, as text and as dot
  std::filesystem::remove_all(dir);
}

TEST_CASE("jit: print runs when the graph runs, not while it is traced") {
  auto f = xg::jit([](xg::Tensor<float> v) {
    auto y = v * 2.0f;
    xg::print("doubled:", y);
    return y + 1.0f;
  });
  auto x = xg::tensor<float>({1, 2});
  {
    CoutCapture out;
    f.lower(x);  // traces only
    CHECK(out.text.str().empty());
  }
  CoutCapture out;
  f(x);
  f(x);
  CHECK(out.text.str() ==
        "doubled: Tensor(shape=[2], dtype=Float32, value=[2, 4])\n"
        "doubled: Tensor(shape=[2], dtype=Float32, value=[2, 4])\n");
}

TEST_CASE("jit: reading a traced value, or keeping a traced tensor past its function, is a clear error") {
  auto read = xg::jit([](xg::Tensor<float> v) { return v * v.item(); });
  auto msg = message_of<xg::ValueError>([&] { read(xg::ones<float>({1})); });
  CHECK(msg.find("not known while jit traces") != std::string::npos);
  CHECK(msg.find("xg::cond") != std::string::npos);

  xg::Tensor<float> kept;
  auto keep = xg::jit([&kept](xg::Tensor<float> v) {
    kept = v * 2.0f;
    return v;
  });
  keep(xg::ones<float>({2}));
  auto use = xg::jit([&kept](xg::Tensor<float> v) { return v + kept; });
  auto escaped = message_of<xg::ValueError>([&] { use(xg::ones<float>({2})); });
  CHECK(escaped.find("escaped") != std::string::npos);
}

TEST_CASE("jit: lower gives the IR text, Graphviz dot and the node count; nested jit inlines") {
  auto inner = xg::jit([](xg::Tensor<float> a) { return xg::tanh(a); });
  auto outer = xg::jit([&inner](xg::Tensor<float> a, xg::Tensor<float> b) { return inner(xg::matmul(a, b)); });
  auto low = outer.lower(xg::ones<float>({2, 3}), xg::ones<float>({3, 4}));
  CHECK(low.num_nodes() == 2);
  CHECK(low.ir().find("%2 : f32[2, 4] = MatMul(%0, %1)") != std::string::npos);
  CHECK(low.ir().find("%3 : f32[2, 4] = Tanh(%2)") != std::string::npos);
  CHECK(low.dot().rfind("digraph", 0) == 0);
  CHECK(inner.cache_size() == 0);
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

/// Restores eager mode even when a check fails.
struct GraphMode {
  GraphMode() { xg::set_mode(xg::Mode::graph); }
  ~GraphMode() { xg::set_mode(xg::Mode::eager); }
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
  GraphMode graph;
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
  CHECK(ir.find("test_jit.cpp:") != std::string::npos);
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
  CHECK(msg.find("OneHot: label 3 at index 1 is outside [0, 3)") != std::string::npos);
}
