// xgrad benchmarks: jit costs, each next to its eager reference in the same run.
//   (a) BM_JitCallMul1 / BM_EagerMul1: a cache-hit call of jit(x * y) against the eager x * y,
//       both on 1-element float tensors (the target: under 2 us per cache-hit call);
//   (b) BM_JitTraceMlpStep: trace + verify + build of a whole MLP train step (a fresh
//       xg::jit per iteration, then lower(x, y)), with the graph's node count;
//   (c) BM_JitMlpStep / BM_EagerMlpStep: the steady-state call of that jitted step against the
//       same step run eagerly.
// Every row runs on one xgrad thread. The jit rows report `x_eager`: their CPU time per call
// divided by that of their eager row (BM_EagerMul1, BM_EagerMlpStep of the same size), which
// is registered, and so run, just before them; the counter is absent when the eager row was
// filtered out.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <map>
#include <string>
#include <vector>

#include <xgrad/xgrad.hpp>

#include "bench_support.hpp"

namespace xg = xgrad;

namespace {

using namespace xgrad::bench;

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

/// CPU ns per iteration of the last run of each eager reference row, by key.
std::map<std::string, double>& eager_ns() {
  static std::map<std::string, double> table;
  return table;
}

/// Times a benchmark loop with the thread CPU clock (what Google Benchmark reports as CPU time),
/// so a jit row can divide its time by its eager row's.
class LoopClock {
 public:
  LoopClock() : m_start(thread_cpu_seconds()) {}
  double ns_per_iteration(const benchmark::State& state) const {
    const double iterations = static_cast<double>(std::max<benchmark::IterationCount>(state.iterations(), 1));
    return (thread_cpu_seconds() - m_start) * 1e9 / iterations;
  }

 private:
  double m_start;
};

void record_eager(const benchmark::State& state, const LoopClock& clock, const std::string& key) {
  eager_ns()[key] = clock.ns_per_iteration(state);
}

/// Sets `x_eager` (this row's CPU time / its eager row's) and returns this row's ns per call.
double report_against_eager(benchmark::State& state, const LoopClock& clock, const std::string& key) {
  const double ns = clock.ns_per_iteration(state);
  if (auto it = eager_ns().find(key); it != eager_ns().end() && it->second > 0)
    state.counters["x_eager"] = ns / it->second;
  return ns;
}

// ---- (a) cache-hit call overhead on 1-element tensors ----------------------------------------

void eager_mul1(benchmark::State& state) {
  ThreadScope threads(1);
  auto x = xg::tensor<float>({1.5f}), y = xg::tensor<float>({2.0f});
  LoopClock clock;
  for (auto _ : state) {
    auto z = x * y;
    benchmark::DoNotOptimize(z.data());
    benchmark::ClobberMemory();
  }
  record_eager(state, clock, "mul1");
}

void jit_call_mul1(benchmark::State& state) {
  ThreadScope threads(1);
  auto x = xg::tensor<float>({1.5f}), y = xg::tensor<float>({2.0f});
  auto mul = xg::jit([](auto a, auto b) { return a * b; }, {.name = "mul1"});
  if (mul(x, y).to_vector() != std::vector<float>{3.0f}) {  // the one trace, outside the timing
    state.SkipWithError("jit(x * y) gave a wrong value");
    return;
  }
  LoopClock clock;
  {
    xg::expect_cache_hit guard;  // a retrace inside the loop would throw
    for (auto _ : state) {
      auto z = mul(x, y);
      benchmark::DoNotOptimize(z.data());
      benchmark::ClobberMemory();
    }
  }
  const double ns = report_against_eager(state, clock, "mul1");
  state.counters["cache_size"] = static_cast<double>(mul.cache_size());
  state.SetLabel(ns < 2000.0 ? "target < 2 us/call: met" : "target < 2 us/call: missed");
}

// ---- (b, c) an MLP train step: relu hidden layer, softmax cross-entropy, momentum SGD -------

struct MlpSize {
  const char* name;
  std::int64_t in, hidden, out, batch;
};
constexpr MlpSize kMnist{"784-128-10", 784, 128, 10, 32};
constexpr MlpSize kSmall{"64-64-10", 64, 64, 10, 32};

/// The train step of tests/jit/test_jit.cpp (struct Mlp) at benchmark sizes: the same code runs
/// eagerly and under jit. Learning rate 0.01 and momentum 0.9 keep the weights far from
/// denormals over the millions of steps a benchmark takes.
struct Mlp {
  xg::Parameter<float> w1, b1, w2, b2;
  std::vector<xg::Tensor<float>> velocity;
  Mlp(const MlpSize& s, std::uint64_t seed)
      : w1(xg::randn<float>({s.in, s.hidden}, seed) * 0.05f, "w1"),
        b1(xg::zeros<float>({s.hidden}), "b1"),
        w2(xg::randn<float>({s.hidden, s.out}, seed + 1) * 0.1f, "w2"),
        b2(xg::zeros<float>({s.out}), "b2") {
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
      ps[i] -= velocity[i] * 0.01f;
    }
    return loss;
  }
};

struct Batch {
  xg::Tensor<float> x;
  xg::Tensor<std::int32_t> labels;
};

Batch make_batch(const MlpSize& s) {
  std::vector<std::int32_t> labels(static_cast<std::size_t>(s.batch));
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>((i * 7) % s.out);
  return {xg::randn<float>({s.batch, s.in}, 42), xg::tensor<std::int32_t>(labels)};
}

auto jit_step(Mlp& mlp) {
  return xg::jit([&mlp](xg::Tensor<float> x, xg::Tensor<std::int32_t> y) { return mlp.step(x, y); },
                 {.name = "mlp_step"});
}

bool finite_loss(const xg::Tensor<float>& loss) {
  const float v = loss.to_vector().at(0);
  return v == v && v < 1e30f;
}

// The MLP rows report "faults/iter" (bench_support.hpp): the [784, 128] temporaries (392 KiB)
// are below the 1 MiB BufferCache threshold, so whether malloc maps them afresh (and the kernel
// zero-fills every page) depends on the allocation pattern.

void eager_mlp_step(benchmark::State& state, MlpSize s) {
  ThreadScope threads(1);
  Mlp mlp(s, 1);
  Batch b = make_batch(s);
  mlp.step(b.x, b.labels);  // warm-up
  FaultCounter faults;
  LoopClock clock;
  xg::Tensor<float> loss;
  for (auto _ : state) {
    loss = mlp.step(b.x, b.labels);
    benchmark::DoNotOptimize(loss.data());
    benchmark::ClobberMemory();
  }
  record_eager(state, clock, std::string("mlp/") + s.name);
  faults.report(state);
  if (!finite_loss(loss)) state.SkipWithError("eager MLP step: loss is not finite");
}

void jit_mlp_step(benchmark::State& state, MlpSize s) {
  ThreadScope threads(1);
  Mlp mlp(s, 1);
  Batch b = make_batch(s);
  auto step = jit_step(mlp);
  step(b.x, b.labels);  // the one trace, outside the timing
  FaultCounter faults;
  LoopClock clock;
  xg::Tensor<float> loss;
  {
    xg::expect_cache_hit guard;
    for (auto _ : state) {
      loss = step(b.x, b.labels);
      benchmark::DoNotOptimize(loss.data());
      benchmark::ClobberMemory();
    }
  }
  report_against_eager(state, clock, std::string("mlp/") + s.name);
  faults.report(state);
  state.counters["nodes"] = static_cast<double>(step.lower(b.x, b.labels).num_nodes());
  if (!finite_loss(loss)) state.SkipWithError("jitted MLP step: loss is not finite");
}

/// A fresh jit every iteration, lowered once: trace, verify, build the program (and, when the
/// jit goes out of scope, free the graph). Parameters are not changed: effects apply on calls.
void jit_trace_mlp_step(benchmark::State& state, MlpSize s) {
  ThreadScope threads(1);
  Mlp mlp(s, 1);
  Batch b = make_batch(s);
  std::size_t nodes = 0;
  for (auto _ : state) {
    auto step = jit_step(mlp);
    auto lowered = step.lower(b.x, b.labels);
    nodes = lowered.num_nodes();
    benchmark::DoNotOptimize(nodes);
  }
  state.counters["nodes"] = static_cast<double>(nodes);
}

const bool kRegistered = [] {
  benchmark::RegisterBenchmark("BM_EagerMul1", eager_mul1);
  benchmark::RegisterBenchmark("BM_JitCallMul1", jit_call_mul1);
  for (const MlpSize& s : {kMnist, kSmall}) {
    const std::string size = s.name;
    benchmark::RegisterBenchmark(("BM_JitTraceMlpStep/" + size).c_str(), jit_trace_mlp_step, s)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("BM_EagerMlpStep/" + size).c_str(), eager_mlp_step, s)->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("BM_JitMlpStep/" + size).c_str(), jit_mlp_step, s)->Unit(benchmark::kMicrosecond);
  }
  return true;
}();

}  // namespace
