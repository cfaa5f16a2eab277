// xgrad benchmarks: the LeNet5 train step (issue 5). Batch 32 of 1x32x32 images, 10 classes,
// SoftmaxCrossEntropy (sparse labels, mean), Momentum (lr 0.01, momentum 0.9): one call of
// Model::train_step per iteration, eagerly and as one compiled graph, at 1 and 2 threads, next
// to the same step in LibTorch (bench_torch.cpp) when it is built.
//   BM_LeNet5Step/torch/threads:N  LibTorch, N intra-op threads (the reference row, run first)
//   BM_LeNet5Step/eager/threads:N  xgrad in Mode::eager, xg::cpu::set_num_threads(N)
//   BM_LeNet5Step/graph/threads:N  xgrad in Mode::graph (traced before the timing)
// Every row reports "ms/step"; the graph row also "x_eager" (graph / eager) and "x_torch"
// (graph / torch), and its label says whether the targets are met: graph at least 1.5x
// faster than eager, and at most 0.7x LibTorch's step time. The 1-thread rows are timed by CPU
// time, the 2-thread rows by wall time (real time), ratios likewise.
//   BM_LeNet5Kernel/<kernel>/<activation>: the step's slowest kernels alone, one thread.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <utility>

#include <xgrad/models/lenet5.hpp>
#include <xgrad/nn/model.hpp>
#include <xgrad/xgrad.hpp>

#include "bench_support.hpp"

namespace xg = xgrad;

namespace {

using namespace xgrad::bench;

constexpr double kEagerSpeedupTarget = 1.5;  // graph at least 1.5x faster than eager
constexpr double kTorchRatioTarget = 0.7;    // graph step time at most 0.7x LibTorch's

std::string key(const char* impl, int threads) { return std::string("lenet/") + impl + "/" + std::to_string(threads); }

/// Restores the execution mode after a row.
class ModeScope {
 public:
  explicit ModeScope(xg::Mode mode) : m_saved(xg::get_mode()) { xg::set_mode(mode); }
  ~ModeScope() { xg::set_mode(m_saved); }
  ModeScope(const ModeScope&) = delete;
  ModeScope& operator=(const ModeScope&) = delete;

 private:
  xg::Mode m_saved;
};

void lenet_step(benchmark::State& state, xg::Mode mode, int threads) {
  OnBenchDevice on_device;
  ThreadScope thread_scope(threads);
  ModeScope mode_scope(mode);
  xg::init::set_seed(1);
  xg::models::LeNet5 net;
  xg::nn::SoftmaxCrossEntropy loss({.sparse = true, .reduction = xg::Reduction::mean});
  xg::optim::Momentum opt(net.parameters(), 0.01f, 0.9f);
  xg::Model model(net, loss, opt);
  const auto images = xg::randn<float>({kLeNetBatch, 1, 32, 32}, 3);
  const auto labels = xg::cast<std::int32_t>(xg::uniform<float>({kLeNetBatch}, 0.f, 9.99f, 4));
  model.train_step(images, labels);  // warm-up; in graph mode the one trace
  const bool graph = mode == xg::Mode::graph;
  FaultCounter faults;
  LoopClock clock(threads > 1);
  float value = 0;
  for (auto _ : state) {
    value = model.train_step(images, labels);
    benchmark::DoNotOptimize(value);
  }
  const double ns = clock.ns_per_iteration(state);
  faults.report(state);
  state.counters["ms/step"] = ns * 1e-6;
  if (!(value == value && value < 1e30f)) state.SkipWithError("LeNet5 step: loss is not finite");
  if (!graph) {
    record_reference(state, clock, key("eager", threads));
    return;
  }
  const double x_eager = report_ratio(state, ns, key("eager", threads), "x_eager");
  const double x_torch = report_ratio(state, ns, key("torch", threads), "x_torch");
  std::string label;
  if (x_eager > 0) label += std::string(">= 1.5x faster than eager: ") + verdict(x_eager * kEagerSpeedupTarget <= 1.0);
  if (x_torch > 0)
    label += std::string(label.empty() ? "" : "; ") + "<= 0.7x torch: " + verdict(x_torch <= kTorchRatioTarget);
  state.SetLabel(label);
}

// ---- the step's slowest kernels, alone, one thread ----------------------------------------------
// BM_LeNet5Kernel/<kernel>/<activation>: max pooling forward (MaxPool), its gradient scatter
// (MaxPoolGrad, which finds each window's argmax again) and ReLU's gradient where(y > 0, g, 0)
// (Greater then Select), eagerly on the two ReLU activations of the step.

struct Activation {
  const char* name;
  std::int64_t channels, size;  // [32, channels, size, size]
};
constexpr Activation kRelu1{"relu1", 6, 28}, kRelu2{"relu2", 16, 10};

enum class Kernel { max_pool, max_pool_grad, relu_grad };

void lenet_kernel(benchmark::State& state, Kernel kernel, Activation a) {
  ThreadScope threads(1);
  const auto y = xg::relu(xg::randn<float>({kLeNetBatch, a.channels, a.size, a.size}, 5));
  const auto g = xg::randn<float>({kLeNetBatch, a.channels, a.size, a.size}, 6);
  const auto gy = xg::randn<float>({kLeNetBatch, a.channels, a.size / 2, a.size / 2}, 7);
  const xg::cpu::Pool2dGeometry geo{kLeNetBatch, a.channels, a.size, a.size, 2, 2, 2, 2, 0, 0, a.size / 2, a.size / 2};
  auto gx = xg::zeros<float>({kLeNetBatch, a.channels, a.size, a.size});
  for (auto _ : state) {
    switch (kernel) {
      case Kernel::max_pool: {
        auto out = xg::max_pool2d(y, 2, 2);
        benchmark::DoNotOptimize(out.data());
        break;
      }
      case Kernel::max_pool_grad:
        xg::cpu::max_pool2d_scatter(geo, y.data(), gy.data(), gx.data());
        break;
      case Kernel::relu_grad: {
        auto out = xg::where(y > 0.0f, g, 0.0f);
        benchmark::DoNotOptimize(out.data());
        break;
      }
    }
    benchmark::ClobberMemory();
  }
}

// Registered per thread count in the order torch, eager, graph: the graph row divides by both.
const bool kLeNetRegistered = [] {
  for (int threads : {1, 2}) {
    const std::string suffix = "/threads:" + std::to_string(threads);
    auto configure = [threads](benchmark::internal::Benchmark* b) {
      b->Unit(benchmark::kMillisecond);
      if (threads > 1) b->UseRealTime();
    };
#if defined(XGRAD_BENCH_HAVE_TORCH)
    configure(benchmark::RegisterBenchmark(("BM_LeNet5Step/torch" + suffix).c_str(), [threads](benchmark::State& s) {
      lenet_step_torch(s, threads, key("torch", threads));
    }));
#endif
    configure(
        benchmark::RegisterBenchmark(("BM_LeNet5Step/eager" + suffix).c_str(), lenet_step, xg::Mode::eager, threads));
    configure(
        benchmark::RegisterBenchmark(("BM_LeNet5Step/graph" + suffix).c_str(), lenet_step, xg::Mode::graph, threads));
  }
  for (const auto& [name, kernel] :
       {std::pair{"MaxPool", Kernel::max_pool}, std::pair{"MaxPoolGrad", Kernel::max_pool_grad},
        std::pair{"ReluGrad", Kernel::relu_grad}})
    for (const Activation& a : {kRelu1, kRelu2})
      benchmark::RegisterBenchmark((std::string("BM_LeNet5Kernel/") + name + "/" + a.name).c_str(), lenet_kernel,
                                   kernel, a)
          ->Unit(benchmark::kMicrosecond);
  return true;
}();

}  // namespace
