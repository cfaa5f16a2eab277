// Analysis rows: the LeNet5 train step's slowest kernels alone, one thread (the step itself is
// the suite's lenet5_step, suite_xgrad.cpp).
//   BM_LeNet5Kernel/<kernel>/<activation>: max pooling forward (MaxPool: the argmax, then the
//   take), its gradient (MaxPoolPut, given the forward's argmax) and ReLU's gradient
//   where(y > 0, g, 0) (Greater then Select), eagerly on the two ReLU activations of the step.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <utility>

#include <xgrad/xgrad.hpp>

#include "bench_support.hpp"
#include "workloads.hpp"

namespace xg = xgrad;

namespace {

using namespace xgrad::bench;

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
  const auto argmax = xg::detail::max_pool_argmax(y, geo, xg::SourceLoc::current());
  for (auto _ : state) {
    switch (kernel) {
      case Kernel::max_pool: {
        auto out = xg::max_pool2d(y, 2, 2);
        benchmark::DoNotOptimize(out.data());
        break;
      }
      case Kernel::max_pool_grad: {
        auto out = xg::detail::max_pool_put(argmax, gy, geo, xg::SourceLoc::current());
        benchmark::DoNotOptimize(out.data());
        break;
      }
      case Kernel::relu_grad: {
        auto out = xg::where(y > 0.0f, g, 0.0f);
        benchmark::DoNotOptimize(out.data());
        break;
      }
    }
    benchmark::ClobberMemory();
  }
}

const bool kLeNetRegistered = [] {
  for (const auto& [name, kernel] :
       {std::pair{"MaxPool", Kernel::max_pool}, std::pair{"MaxPoolPut", Kernel::max_pool_grad},
        std::pair{"ReluGrad", Kernel::relu_grad}})
    for (const Activation& a : {kRelu1, kRelu2})
      benchmark::RegisterBenchmark((std::string("BM_LeNet5Kernel/") + name + "/" + a.name).c_str(), lenet_kernel,
                                   kernel, a)
          ->Unit(benchmark::kMicrosecond);
  return true;
}();

}  // namespace
