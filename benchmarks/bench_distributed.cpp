// The data_parallel suite: a train step with Model's data parallelism on as many ranks as the
// launch gave. run_suite.py runs these rows twice: alone (1 process x 2 threads, a group of one)
// and under `mpirun -np 2` (2 processes x 1 thread), with the same global batch split over the
// ranks, so the two sides compare the same work. Besides the time, each row reports comm_share:
// the part of the step this rank spent in collectives (distributed::stats()), waiting included.
// The ranks must run the same number of steps, so the rows have a fixed iteration count.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <xgrad/models/lenet5.hpp>
#include <xgrad/nn/model.hpp>
#include <xgrad/xgrad.hpp>

#include "suite.hpp"
#include "workloads.hpp"

namespace xg = xgrad;
namespace dist = xgrad::distributed;

namespace {

using namespace xgrad::bench;

constexpr int kThreadsInAll = 2;  // per machine: 1 process x 2 threads, or 2 x 1
constexpr int kSteps = 100;

/// The MLP of the mlp_step suite's deep row as a Module, for Model.
struct MlpNet : xg::nn::Module {
  std::vector<std::unique_ptr<xg::nn::Dense>> layers;
  explicit MlpNet(const std::vector<std::int64_t>& widths) {
    for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
      layers.push_back(std::make_unique<xg::nn::Dense>(widths[i], widths[i + 1]));
      register_module("fc" + std::to_string(i + 1), *layers.back());
    }
  }
  xg::Tensor<float> forward(xg::Tensor<float> x) override {
    for (std::size_t i = 0; i < layers.size(); ++i)
      x = i + 1 < layers.size() ? xg::relu((*layers[i])(x)) : (*layers[i])(x);
    return x;
  }
};

/// A network with its Model (data parallel, graph mode's compiled step) and this rank's part of
/// the global batch.
struct Replica {
  std::unique_ptr<xg::nn::Module> net;
  xg::nn::SoftmaxCrossEntropy loss{{.sparse = true, .reduction = xg::Reduction::mean}};
  std::unique_ptr<xg::optim::Momentum> opt;
  std::unique_ptr<xg::Model> model;
  xg::Tensor<float> images;
  xg::Tensor<std::int32_t> labels;

  Replica(std::unique_ptr<xg::nn::Module> network, const xg::Tensor<float>& all_images,
          const xg::Tensor<std::int32_t>& all_labels)
      : net(std::move(network)) {
    opt = std::make_unique<xg::optim::Momentum>(net->parameters(), 0.01f, 0.9f);
    model = std::make_unique<xg::Model>(*net, loss, *opt, xg::Metrics{}, xg::ModelOptions{.data_parallel = true});
    const std::int64_t share = all_images.shape()[0] / dist::world_size(), first = share * dist::rank();
    std::vector<std::int64_t> begin(static_cast<std::size_t>(all_images.ndim()), 0), size(begin.size(), -1);
    begin[0] = first, size[0] = share;
    images = xg::slice(all_images, begin, size);
    labels = xg::slice(all_labels, {first}, {share});
  }
  void step() { benchmark::DoNotOptimize(model->train_step(images, labels)); }
};

void register_data_parallel(const std::string& workload, std::function<std::unique_ptr<Replica>()> make) {
  const std::string name = "data_parallel/" + workload + "/jit_O2";
  benchmark::RegisterBenchmark(name.c_str(),
                               [make](benchmark::State& state) {
                                 dist::init();
                                 const int world = dist::world_size();
                                 const int threads = std::max(1, kThreadsInAll / world);
                                 ThreadScope thread_scope(threads);
                                 xg::mode_scope graph(xg::Mode::graph);
                                 try {
                                   std::unique_ptr<Replica> replica = make();
                                   replica->step();  // compiles, and takes rank 0's parameters
                                   const dist::Stats before = dist::stats();
                                   const auto start = std::chrono::steady_clock::now();
                                   for (auto _ : state) replica->step();
                                   const double wall =
                                       std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
                                   state.counters["comm_share"] = (dist::stats().seconds - before.seconds) / wall;
                                   state.counters["processes"] = world;
                                   state.counters["threads"] = threads;
                                 } catch (const std::exception& error) {
                                   state.SkipWithError(error.what());
                                 }
                               })
      ->Iterations(kSteps)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
}

const bool kRegistered = [] {
  register_data_parallel("lenet5_b32", [] {
    xg::init::set_seed(1);
    return std::make_unique<Replica>(std::make_unique<xg::models::LeNet5>(),
                                     xg::tensor<float>(lenet_batch().images, {kLeNetBatch, 1, 32, 32}),
                                     xg::tensor<std::int32_t>(lenet_batch().labels));
  });
  register_data_parallel("mlp_784-256-256-10_b64", [] {
    xg::init::set_seed(1);
    std::vector<std::int32_t> classes(64);
    for (std::size_t i = 0; i < classes.size(); ++i) classes[i] = static_cast<std::int32_t>(i % 10);
    return std::make_unique<Replica>(std::make_unique<MlpNet>(std::vector<std::int64_t>{784, 256, 256, 10}),
                                     xg::randn<float>({64, 784}, 3), xg::tensor(classes));
  });
  return true;
}();

}  // namespace
