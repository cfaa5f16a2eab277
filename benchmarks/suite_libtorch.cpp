// The suite's LibTorch rows (impl `libtorch`): the workloads of suite_xgrad.cpp, same shapes and
// thread counts, eagerly in LibTorch C++. Compiled only when CMake finds LibTorch
// (XGRAD_BENCH_HAVE_TORCH); its headers are heavy, so they live in this file alone.
#if defined(XGRAD_BENCH_HAVE_TORCH)

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "suite.hpp"
#include "torch_lenet5.hpp"

namespace {

using namespace xgrad::bench;

torch::Tensor random_tensor(std::vector<std::int64_t> shape, std::uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randn(shape, torch::kFloat32);
}

/// Registers "<suite>/<workload>/libtorch" on `threads` intra-op threads.
void torch_row(const std::string& suite, const std::string& workload, int threads, std::function<Call()> prepare) {
  register_row(suite, workload, "libtorch", threads, [threads, prepare] {
    torch::set_num_threads(threads);
    return prepare();
  });
}

/// A call that computes f() and keeps its result from being optimized away.
template <class F> Call result_of(F f) {
  return [f] { benchmark::DoNotOptimize(f()); };
}

torch::Tensor chain7(const torch::Tensor& x) { return torch::tanh(x * 1.5f + 0.25f) * torch::sigmoid(x) + x * x; }

/// The MLP train step of workloads.hpp (Mlp) in LibTorch: relu hidden layers, cross-entropy,
/// momentum SGD (lr 0.01, momentum 0.9) on every weight and bias.
struct TorchMlp {
  std::vector<torch::Tensor> params;  // w1, b1, w2, b2, ...
  std::unique_ptr<torch::optim::SGD> opt;
  TorchMlp(const std::vector<std::int64_t>& widths) {
    for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
      const float scale = l + 2 < widths.size() ? 0.05f : 0.1f;
      params.push_back((random_tensor({widths[l], widths[l + 1]}, 1 + l) * scale).requires_grad_());
      params.push_back(torch::zeros({widths[l + 1]}).requires_grad_());
    }
    opt = std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.01).momentum(0.9));
  }
  torch::Tensor step(const torch::Tensor& x, const torch::Tensor& labels) {
    opt->zero_grad();
    torch::Tensor h = x;
    for (std::size_t i = 0; i + 2 < params.size(); i += 2) h = torch::relu(torch::addmm(params[i + 1], h, params[i]));
    auto loss = torch::nn::functional::cross_entropy(torch::addmm(params.back(), h, params[params.size() - 2]), labels);
    loss.backward();
    opt->step();
    return loss;
  }
};

const bool kLibTorchRegistered = [] {
  for (std::int64_t n : {1, 1000})
    torch_row("dispatch", "add_" + std::to_string(n), 1, [n] {
      auto a = random_tensor({n}, 1), b = random_tensor({n}, 2);
      return result_of([a, b] { return a + b; });
    });
  torch_row("dispatch", "add_grad_1", 1, [] {
    auto a = random_tensor({1}, 1).requires_grad_(), b = random_tensor({1}, 2);
    return result_of([a, b] { return a + b; });
  });
  torch_row("cache_hit", "chain7_1", 1, [] {
    auto x = random_tensor({1}, 3);
    return result_of([x] { return chain7(x); });
  });

  constexpr std::int64_t million = 1000000;
  torch_row("elementwise", "add_1e6", 1, [] {
    auto a = random_tensor({million}, 1), b = random_tensor({million}, 2);
    return result_of([a, b] { return a + b; });
  });
  torch_row("elementwise", "exp_1e6", 1, [] {
    auto a = random_tensor({million}, 1);
    return result_of([a] { return torch::exp(a); });
  });
  for (std::int64_t n : {million, 10 * million})
    torch_row("elementwise", n == million ? "chain7_1e6" : "chain7_1e7", 1, [n] {
      auto x = random_tensor({n}, 1);
      return result_of([x] { return chain7(x); });
    });

  torch_row("reductions", "sum_1e7", 1, [] {
    auto x = random_tensor({10000000}, 1);
    return result_of([x] { return x.sum(); });
  });
  for (int axis : {0, 1})
    torch_row("reductions", "sum_axis" + std::to_string(axis) + "_1024x1024", 1, [axis] {
      auto x = random_tensor({1024, 1024}, 1);
      return result_of([x, axis] { return x.sum(axis); });
    });
  torch_row("reductions", "softmax_256x1000", 1, [] {
    auto x = random_tensor({256, 1000}, 1);
    return result_of([x] { return torch::softmax(x, -1); });
  });

  for (const auto& [n, threads] : {std::pair<std::int64_t, int>{64, 1}, {256, 1}, {1024, 1}, {1024, 2}})
    torch_row("gemm", "matmul_" + std::to_string(n) + (threads > 1 ? "_t" + std::to_string(threads) : ""), threads,
              [n = n] {
                auto a = torch::rand({n, n}) * 2 - 1, b = torch::rand({n, n}) * 2 - 1;
                return result_of([a, b] { return torch::matmul(a, b); });
              });

  for (const ConvCase& c : {kConv1, kConv2}) {
    torch_row("conv", std::string(c.name) + "_fwd", 1, [c] {
      auto x = random_tensor({c.batch, c.in_channels, c.height, c.width}, 5);
      auto w = random_tensor({c.out_channels, c.in_channels, c.kernel, c.kernel}, 6);
      return result_of([x, w] { return torch::conv2d(x, w); });  // no bias, stride 1, no padding: valid
    });
    torch_row("conv", std::string(c.name) + "_grad", 1, [c] {
      auto x = random_tensor({c.batch, c.in_channels, c.height, c.width}, 5).requires_grad_(c.input_grad);
      auto w = random_tensor({c.out_channels, c.in_channels, c.kernel, c.kernel}, 6).requires_grad_();
      std::vector<torch::Tensor> wrt = c.input_grad ? std::vector{x, w} : std::vector{w};
      return result_of([x, w, wrt] { return torch::autograd::grad({torch::conv2d(x, w).sum()}, wrt); });
    });
  }

  for (const auto& [widths, batch] :
       {std::pair<std::vector<std::int64_t>, std::int64_t>{{784, 128, 10}, 32}, {{784, 256, 256, 10}, 64}}) {
    std::string name;
    for (std::int64_t w : widths) {
      if (!name.empty()) name += '-';
      name += std::to_string(w);
    }
    torch_row("mlp_step", name + "_b" + std::to_string(batch), 1, [widths = widths, batch = batch] {
      auto mlp = std::make_shared<TorchMlp>(widths);
      auto x = random_tensor({batch, widths.front()}, 42);
      auto labels = torch::arange(batch, torch::kLong) * 7 % widths.back();
      return result_of([mlp, x, labels] { return mlp->step(x, labels); });
    });
  }

  for (int threads : {1, 2})
    torch_row("lenet5_step", "b32_t" + std::to_string(threads), threads, [] {
      torch::manual_seed(1);
      auto net = std::make_shared<TorchLeNet5>(/*conv_bias=*/false);
      auto opt = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
      const LeNetBatch& batch = lenet_batch();
      auto images = torch::tensor(batch.images).reshape({kLeNetBatch, 1, 32, 32});
      auto labels = torch::tensor(batch.labels).to(torch::kLong);
      return result_of([net, opt, images, labels] {
        opt->zero_grad();
        auto loss = torch::nn::functional::cross_entropy(net->forward(images), labels);  // mean over the batch
        loss.backward();
        opt->step();
        return loss.item<float>();
      });
    });
  return true;
}();

}  // namespace

#endif  // XGRAD_BENCH_HAVE_TORCH
