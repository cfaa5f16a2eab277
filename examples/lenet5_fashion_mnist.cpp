// The seed notebook's run, in C++: LeNet5 trained on Fashion-MNIST for 3 epochs eagerly, then 3
// epochs with the whole train step compiled (graph mode), printing what MindSpore prints, then
// each model's test accuracy, step time, images/s and share of this machine's measured FMA peak,
// and the eager / graph step-time ratio. It also writes the loss
// curves of both runs as an SVG chart and the compiled train step's graph as Graphviz dot.
// With --distributed, under mpirun, it trains data-parallel: each rank takes its shard of the
// data and batch / world_size samples a step, so the global batch stays --batch; rank 0
// prints and writes (docs/DISTRIBUTED.md).
//
//   lenet5_fashion_mnist [--data DIR] [--epochs N] [--batch N] [--mode eager|graph|both]
//                        [--threads N] [--seed N] [--out DIR] [--distributed]
//   mpirun -np 2 lenet5_fashion_mnist --distributed
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>
#include <xgrad/backend/cpu/peak.hpp>
#include <xgrad/backend/cpu/thread_pool.hpp>
#include <xgrad/data/mnist.hpp>
#include <xgrad/models/lenet5.hpp>
#include <xgrad/nn/model.hpp>
#include <xgrad/xgrad.hpp>

#include "lenet5_support.hpp"

namespace xg = xgrad;
namespace fs = std::filesystem;

namespace {

struct Options {
  std::string data = "/usr/share/datasets/fashion-mnist";
  int epochs = 3;
  std::int64_t batch = 32;
  std::string mode = "both";
  int threads = 0;         // 0: the library's default
  std::uint64_t seed = 1;  // of the initial weights and the shuffle
  std::string out = ".";
  bool distributed = false;
};

Options parse(int argc, char** argv) {
  const xg::examples::Flags flags("lenet5_fashion_mnist",
                                  "[--data DIR] [--epochs N] [--batch N] [--mode eager|graph|both] [--threads N] "
                                  "[--seed N] [--out DIR] [--distributed]");
  Options o;
  auto handle = [&](const std::string& flag, const std::string& value) {
    if (flag == "--data")
      o.data = value;
    else if (flag == "--epochs")
      o.epochs = static_cast<int>(flags.positive(flag, value));
    else if (flag == "--batch")
      o.batch = flags.positive(flag, value);
    else if (flag == "--threads")
      o.threads = static_cast<int>(flags.positive(flag, value));
    else if (flag == "--seed")
      o.seed = static_cast<std::uint64_t>(flags.positive(flag, value));
    else if (flag == "--out")
      o.out = value;
    else if (flag == "--distributed")
      o.distributed = true;
    else if (flag == "--mode") {
      if (value != "eager" && value != "graph" && value != "both") flags.fail("--mode is eager, graph or both");
      o.mode = value;
    } else
      return false;
    return true;
  };
  flags.parse(argc, argv, handle, {"--distributed"});
  return o;
}

/// The multiply-add FLOPs (two each) of one LeNet5 train step on `batch` images: conv1 forward and
/// its weights' gradient, conv2 forward and its weights' and input's gradients, the dense
/// 400-120-84-10 layers forward and their weights' and inputs' gradients (pooling and activations
/// aside): about 72 MFLOP at batch 32.
double lenet5_step_flops(std::int64_t batch) {
  const double b = static_cast<double>(batch);
  const double conv1 = 2 * b * 6 * 28 * 28 * (1 * 5 * 5), conv2 = 2 * b * 16 * 10 * 10 * (6 * 5 * 5);
  const double dense = 2 * b * (400 * 120 + 120 * 84 + 84 * 10);
  return 2 * conv1 + 3 * conv2 + 3 * dense;
}

/// Keeps every step's loss and time.
struct Recorder : xg::callbacks::Callback {
  std::vector<float> losses;
  std::vector<double> step_ms;
  std::chrono::steady_clock::time_point start;
  void on_step_begin(const xg::callbacks::RunContext&) override { start = std::chrono::steady_clock::now(); }
  void on_step_end(const xg::callbacks::RunContext& ctx) override {
    step_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    losses.push_back(ctx.loss);
  }
  /// The median: the mean would carry graph mode's first step (its compile) and the bursts of a
  /// shared machine.
  double ms_per_step() const {
    if (step_ms.empty()) return 0;
    std::vector<double> sorted = step_ms;
    const auto middle = sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2);
    std::nth_element(sorted.begin(), middle, sorted.end());
    return *middle;
  }
};

struct RunResult {
  std::string mode;
  std::vector<float> losses;
  double ms_per_step = 0;
  double accuracy = 0;
};

/// Trains and evaluates one model. The datasets come by value: each run starts at their epoch 0,
/// so both modes see the same batches.
RunResult run(xg::Mode mode, const Options& o, xg::data::Dataset train, xg::data::Dataset test, std::ostream& out) {
  xg::set_mode(mode);
  xg::init::set_seed(o.seed);
  const std::string name = mode == xg::Mode::eager ? "eager" : "graph";
  out << "\n=== " << name << " mode ===\n";
  xg::models::LeNet5 net;
  xg::nn::SoftmaxCrossEntropy loss({.sparse = true, .reduction = xg::Reduction::mean});
  xg::optim::Momentum opt(net.parameters(), 0.01f, 0.9f);
  xg::Model model(net, loss, opt, {{"Accuracy", xg::metrics::accuracy()}}, {.data_parallel = o.distributed});
  Recorder recorder;
  const std::int64_t steps = train.size();
  model.train(o.epochs, train,
              {xg::callbacks::ModelCheckpoint("lenet5_" + name, (fs::path(o.out) / "checkpoint").string(),
                                              {.save_steps = steps, .keep_max = 10}),
               xg::callbacks::LossMonitor(steps), xg::callbacks::TimeMonitor(steps), xg::callbacks::ProgressBar(),
               std::ref(recorder)});
  if (mode == xg::Mode::graph && (!o.distributed || xg::distributed::rank() == 0)) {
    const auto first = *train.epoch(0).begin();
    const fs::path dot = fs::path(o.out) / "lenet5_train_step.dot";
    std::ofstream(dot) << model.lower_train_step(first.images, first.labels).dot();
    out << "compiled train step's graph: " << dot.string() << "\n";
  }
  const auto metrics = model.eval(test);  // over every rank's shard when distributed
  out << "\nEvaluation (" << name << "): {'Accuracy': " << metrics.at("Accuracy") << "}\n";
  return {name, recorder.losses, recorder.ms_per_step(), metrics.at("Accuracy")};
}

/// Loss per step of each run, smoothed over 50 steps, on one chart.
void write_loss_svg(const fs::path& path, const std::vector<RunResult>& runs) {
  constexpr double width = 720, height = 400, left = 60, right = 20, top = 30, bottom = 50;
  std::size_t steps = 0;
  double most = 0;
  std::vector<std::vector<double>> smooth;
  for (const auto& r : runs) {
    std::vector<double> s;
    double sum = 0;
    for (std::size_t i = 0; i < r.losses.size(); ++i) {
      sum += r.losses[i];
      if (i >= 50) sum -= r.losses[i - 50];
      s.push_back(sum / static_cast<double>(std::min<std::size_t>(i + 1, 50)));
      most = std::max(most, s.back());
    }
    steps = std::max(steps, s.size());
    smooth.push_back(std::move(s));
  }
  const double plot_w = width - left - right, plot_h = height - top - bottom;
  auto x_of = [&](std::size_t i) {
    return left + plot_w * static_cast<double>(i) / static_cast<double>(std::max<std::size_t>(steps - 1, 1));
  };
  auto y_of = [&](double v) { return top + plot_h * (1 - v / std::max(most, 1e-9)); };
  std::ofstream svg(path);
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << width / 2 << "\" y=\"18\" text-anchor=\"middle\">LeNet5 on Fashion-MNIST: training loss "
      << "(mean of the last 50 steps)</text>\n";
  svg << "<line x1=\"" << left << "\" y1=\"" << top + plot_h << "\" x2=\"" << left + plot_w << "\" y2=\""
      << top + plot_h << "\" stroke=\"black\"/>\n<line x1=\"" << left << "\" y1=\"" << top << "\" x2=\"" << left
      << "\" y2=\"" << top + plot_h << "\" stroke=\"black\"/>\n";
  for (int t = 0; t <= 4; ++t) {
    const double v = most * t / 4;
    svg << "<text x=\"" << left - 6 << "\" y=\"" << y_of(v) + 4 << "\" text-anchor=\"end\">" << std::fixed
        << std::setprecision(2) << v << "</text>\n";
  }
  svg << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << height - 12 << "\" text-anchor=\"middle\">step (of " << steps
      << ")</text>\n";
  const char* colors[] = {"#d62728", "#1f77b4"};
  for (std::size_t r = 0; r < smooth.size(); ++r) {
    svg << "<polyline fill=\"none\" stroke=\"" << colors[r % 2] << "\" stroke-width=\"1.5\" points=\"";
    for (std::size_t i = 0; i < smooth[r].size(); i += std::max<std::size_t>(smooth[r].size() / 600, 1))
      svg << x_of(i) << ',' << y_of(smooth[r][i]) << ' ';
    svg << "\"/>\n<text x=\"" << left + plot_w - 100 << "\" y=\"" << top + 16 + 16 * static_cast<double>(r)
        << "\" fill=\"" << colors[r % 2] << "\">" << runs[r].mode << " mode</text>\n";
  }
  svg << "</svg>\n";
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (o.threads > 0) xg::cpu::set_num_threads(o.threads);
  int rank = 0, world = 1;
  if (o.distributed) {
    xg::distributed::init();
    rank = xg::distributed::rank(), world = xg::distributed::world_size();
    if (o.batch % world != 0) {
      std::cerr << "lenet5_fashion_mnist: --batch " << o.batch << " does not split over " << world << " ranks\n";
      return 2;
    }
  }
  // Rank 0 alone prints and writes files; the others' lines would repeat its own.
  std::ostringstream quiet;
  std::ostream& out = rank == 0 ? std::cout : quiet;
  if (rank == 0) fs::create_directories(o.out);
  const std::int64_t batch = o.batch / world;
  const auto train = xg::examples::fashion_mnist(o.data, xg::data::Split::train, batch, o.seed, rank, world);
  const auto test = xg::examples::fashion_mnist(o.data, xg::data::Split::test, batch, o.seed, rank, world);
  out << "Fashion-MNIST from " << o.data << ": " << train.size() << " train batches, " << test.size()
      << " test batches of " << batch;
  if (o.distributed) out << " on each of " << world << " ranks (" << o.batch << " a step in all)";
  out << "\n";

  std::vector<RunResult> runs;
  if (o.mode != "graph") runs.push_back(run(xg::Mode::eager, o, train, test, out));
  if (o.mode != "eager") runs.push_back(run(xg::Mode::graph, o, train, test, out));
  if (rank != 0) return 0;

  // The roof: fused multiply-adds on this rank's threads, measured now (a few milliseconds).
  const int threads = xg::cpu::num_threads();
  const double peak = xg::cpu::measure_peak_flops(threads), flops = lenet5_step_flops(batch);
  std::cout << "\nSummary\n";
  for (const auto& r : runs) {
    const double seconds = r.ms_per_step / 1e3;
    std::printf(
        "  %-5s mode: test accuracy %.4f, %.3f ms per train step (median), %.0f images/s, %.1f GFLOP/s: "
        "%.0f%% of the measured FMA peak\n",
        r.mode.c_str(), r.accuracy, r.ms_per_step, static_cast<double>(o.batch) / seconds, flops / seconds / 1e9,
        100 * flops / seconds / peak);
  }
  std::printf("  (a step: %.1f MFLOP of convolutions and matmuls%s; peak: %.1f GFLOP/s on %d thread%s)\n", flops / 1e6,
              world > 1 ? " on each rank" : "", peak / 1e9, threads, threads == 1 ? "" : "s");
  if (runs.size() == 2)
    std::printf("  graph mode runs a train step %.2fx as fast as eager mode\n",
                runs[0].ms_per_step / runs[1].ms_per_step);
  const fs::path svg = fs::path(o.out) / "lenet5_loss.svg";
  write_loss_svg(svg, runs);
  std::cout << "  loss curves: " << svg.string() << "\n";
}
