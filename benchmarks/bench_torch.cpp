// LibTorch counterparts of bench_eager.cpp, compiled only when CMake finds LibTorch
// (XGRAD_BENCH_HAVE_TORCH). The names mirror the xgrad ones with impl "torch" (one intra-op
// thread) or "torch_mt" (default threads, real time), so each pair lines up in the output.
// The LeNet5 train step is here too (lenet_step_torch); bench_lenet.cpp registers it.
// LibTorch's headers are heavy, so they live in this file alone.
#if defined(XGRAD_BENCH_HAVE_TORCH)

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <thread>

#include "bench_support.hpp"
#include "torch_lenet5.hpp"

namespace {

using namespace xgrad::bench;

/// Sets LibTorch's intra-op thread count for one benchmark and restores it afterwards;
/// threads <= 0 means one per hardware thread.
class TorchThreadScope {
 public:
  explicit TorchThreadScope(int threads) : m_saved(torch::get_num_threads()) {
    if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    torch::set_num_threads(threads);
  }
  ~TorchThreadScope() { torch::set_num_threads(m_saved); }
  TorchThreadScope(const TorchThreadScope&) = delete;
  TorchThreadScope& operator=(const TorchThreadScope&) = delete;

 private:
  int m_saved;
};

torch::Tensor random_vector(std::int64_t n, std::uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randn({n}, torch::kFloat32);
}

// ---- dispatch overhead ---------------------------------------------------------------------

void dispatch_add(benchmark::State& state, bool grad) {
  TorchThreadScope threads(kOneThread);
  const std::int64_t n = state.range(0);
  auto a = random_vector(n, 1);
  auto b = random_vector(n, 2);
  if (grad) a.set_requires_grad(true);
  for (auto _ : state) {
    auto c = torch::add(a, b);
    benchmark::DoNotOptimize(c.data_ptr());
    benchmark::ClobberMemory();
  }
  set_elementwise_counters(state, n, 3);
}

BENCHMARK_CAPTURE(dispatch_add, plain, false)->Name("BM_dispatch_add/torch")->Arg(1)->Arg(1000);
BENCHMARK_CAPTURE(dispatch_add, grad, true)->Name("BM_dispatch_add_grad/torch")->Arg(1)->Arg(1000);

// ---- single elementwise ops on 1e6 floats (out of place) ------------------------------------

enum class Op { add, mul, exp, relu };

torch::Tensor run(Op op, const torch::Tensor& a, const torch::Tensor& b) {
  switch (op) {
    case Op::add:
      return torch::add(a, b);
    case Op::mul:
      return torch::mul(a, b);
    case Op::exp:
      return torch::exp(a);
    case Op::relu:
      return torch::relu(a);
  }
  return {};
}

void elementwise(benchmark::State& state, Op op, int threads) {
  TorchThreadScope scope(threads);
  const std::int64_t n = state.range(0);
  auto a = random_vector(n, 1);
  auto b = random_vector(n, 2);
  run(op, a, b);  // warm-up
  FaultCounter faults;
  for (auto _ : state) {
    auto y = run(op, a, b);
    benchmark::DoNotOptimize(y.data_ptr());
    benchmark::ClobberMemory();
  }
  const bool binary = op == Op::add || op == Op::mul;
  faults.report(state);
  set_elementwise_counters(state, n, binary ? 3 : 2);
}

// ---- the 6-op chain, eagerly ------------------------------------------------------------------

void chain(benchmark::State& state, int threads) {
  TorchThreadScope scope(threads);
  const std::int64_t n = state.range(0);
  auto x = random_vector(n, 3);
  torch::relu((x * 2.0f + 1.0f) * x - 0.5f) / 3.0f;  // warm-up
  FaultCounter faults;
  for (auto _ : state) {
    auto y = torch::relu((x * 2.0f + 1.0f) * x - 0.5f) / 3.0f;
    benchmark::DoNotOptimize(y.data_ptr());
    benchmark::ClobberMemory();
  }
  faults.report(state);
  set_elementwise_counters(state, n, 2);
}

// ---- conv2d at the LeNet5 shapes (ConvCase, kConv1, kConv2: bench_support.hpp) ---------------

void conv_forward(benchmark::State& state, ConvCase c, int threads) {
  TorchThreadScope scope(threads);
  torch::manual_seed(5);
  auto x = torch::randn({c.batch, c.in_channels, c.height, c.width});
  auto w = torch::randn({c.out_channels, c.in_channels, c.kernel, c.kernel});
  for (auto _ : state) {
    auto y = torch::conv2d(x, w);  // no bias, stride 1, no padding: "valid"
    benchmark::DoNotOptimize(y.data_ptr());
    benchmark::ClobberMemory();
  }
  set_conv_counters(state, conv_forward_flops(c));
}

void conv_forward_backward(benchmark::State& state, ConvCase c, int threads) {
  TorchThreadScope scope(threads);
  torch::manual_seed(5);
  auto x = torch::randn({c.batch, c.in_channels, c.height, c.width});
  auto w = torch::randn({c.out_channels, c.in_channels, c.kernel, c.kernel});
  w.set_requires_grad(true);
  if (c.input_grad) x.set_requires_grad(true);
  for (auto _ : state) {
    w.mutable_grad().reset();  // like xgrad's zero_grad(): forget, don't accumulate
    if (c.input_grad) x.mutable_grad().reset();
    auto y = torch::conv2d(x, w);
    y.sum().backward();
    benchmark::DoNotOptimize(w.grad().data_ptr());
    benchmark::ClobberMemory();
  }
  set_conv_counters(state, conv_forward_flops(c) * (c.input_grad ? 3.0 : 2.0));
}

const bool kTorchRegistered = [] {
  const std::pair<const char*, Op> ops[] = {
      {"BM_binary_add", Op::add}, {"BM_binary_mul", Op::mul}, {"BM_unary_exp", Op::exp}, {"BM_unary_relu", Op::relu}};
  for (const auto& [name, op] : ops) {
    const std::string base = name;
    benchmark::RegisterBenchmark((base + "/torch").c_str(), elementwise, op, kOneThread)->Arg(1000000);
    benchmark::RegisterBenchmark((base + "/torch_mt").c_str(), elementwise, op, kDefaultThreads)
        ->Arg(1000000)
        ->UseRealTime();
  }
  for (std::int64_t n : {1000000, 10000000}) {
    benchmark::RegisterBenchmark("BM_chain6/torch", chain, kOneThread)->Arg(n)->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("BM_chain6/torch_mt", chain, kDefaultThreads)
        ->Arg(n)
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
  }
  register_conv("torch", conv_forward, conv_forward_backward, kConv1);
  register_conv("torch", conv_forward, conv_forward_backward, kConv2);
  return true;
}();

}  // namespace

// ---- the LeNet5 train step (bench_lenet.cpp registers it beside the xgrad rows) -------------

void xgrad::bench::lenet_step_torch(benchmark::State& state, int threads, const std::string& key) {
  TorchThreadScope scope(threads);
  torch::manual_seed(1);
  TorchLeNet5 net(/*conv_bias=*/false);
  torch::optim::SGD opt(net.parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  const auto images = torch::randn({kLeNetBatch, 1, 32, 32});
  const auto labels = torch::randint(0, 10, {kLeNetBatch}, torch::kLong);
  auto step = [&] {
    opt.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(net.forward(images), labels);  // mean over the batch
    loss.backward();
    opt.step();
    return loss.item<float>();
  };
  step();  // warm-up
  FaultCounter faults;
  LoopClock clock(threads > 1);
  float value = 0;
  for (auto _ : state) {
    value = step();
    benchmark::DoNotOptimize(value);
  }
  state.counters["ms/step"] = clock.ns_per_iteration(state) * 1e-6;
  record_reference(state, clock, key);
  faults.report(state);
  if (!(value == value && value < 1e30f)) state.SkipWithError("LibTorch LeNet5 step: loss is not finite");
}

#endif  // XGRAD_BENCH_HAVE_TORCH
