// Runs under mpirun for tests/distributed/test_faults.py, which checks what each scenario leaves:
//
//   xgrad_distributed_faults hang DIR      rank 1 stops answering; the others' collective times out
//   xgrad_distributed_faults train DIR TAG [--kill-at STEP] [--resume]
//       data-parallel LeNet5, 10 steps of one epoch, a checkpoint every 2 steps in DIR; rank 1
//       kills itself (SIGKILL) before step STEP; --resume first loads DIR's latest checkpoint and
//       trains the steps after it. Rank 0 writes the final parameters to DIR/final-TAG.bin.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>
#include <xgrad/xgrad.hpp>

namespace xg = xgrad;
namespace dist = xgrad::distributed;
namespace fs = std::filesystem;

namespace {

constexpr int kSteps = 10;

/// Kills this process (as a crash would) before step `at` when it is rank `rank`.
struct KillAt : xg::callbacks::Callback {
  KillAt(int rank, std::int64_t at) : rank(rank), at(at) {}
  int rank;
  std::int64_t at;
  void on_step_begin(const xg::callbacks::RunContext& ctx) override {
    if (dist::rank() == rank && ctx.step == at) ::kill(::getpid(), SIGKILL);
  }
};

/// The step DIR's latest checkpoint was saved after ("lenet5-1_6.ckpt": 6), and its path.
std::pair<int, fs::path> latest_checkpoint(const fs::path& dir) {
  std::pair<int, fs::path> best{0, {}};
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("lenet5-1_") || !name.ends_with(".ckpt")) continue;
    const int step = std::stoi(name.substr(9));
    if (step > best.first) best = {step, entry.path()};
  }
  return best;
}

int train(const fs::path& dir, const std::string& tag, std::int64_t kill_at, bool resume) {
  const int rank = dist::rank(), world = dist::world_size();
  const auto images = xg::randn<float>({kSteps * 8, 1, 32, 32}, 11);
  std::vector<std::int32_t> classes(kSteps * 8);
  for (std::size_t i = 0; i < classes.size(); ++i) classes[i] = static_cast<std::int32_t>(i % 10);
  const auto data = xg::data::TensorDataset(images, xg::tensor(classes))
                        .shuffle(2)
                        .shard(rank, world)
                        .batch(8 / world, true)
                        .prefetch(0);
  xg::init::set_seed(5);
  xg::models::LeNet5 net;
  xg::nn::SoftmaxCrossEntropy loss({.sparse = true, .reduction = xg::Reduction::mean});
  xg::optim::Momentum opt(net.parameters(), 0.01f, 0.9f);
  xg::Model model(net, loss, opt, {}, {.data_parallel = true});
  if (resume) {
    const auto [done, file] = latest_checkpoint(dir);
    if (done == 0) throw std::runtime_error("no checkpoint to resume from in " + dir.string());
    xg::load_checkpoint(net, opt, file.string());  // every rank reads the same file
    if (rank == 0) std::cout << "resumed from " << file.filename().string() << '\n';
    int step = 0;
    for (const auto& batch : data.epoch(0))
      if (++step > done) model.train_step(batch.images, batch.labels);
  } else {
    model.train(1, data,
                {xg::callbacks::ModelCheckpoint("lenet5", dir.string(), {.save_steps = 2, .keep_max = 10}),
                 KillAt(1, kill_at)});
  }
  if (rank == 0) {
    std::ofstream out(dir / ("final-" + tag + ".bin"), std::ios::binary);
    for (const auto& p : net.parameters()) {
      const std::vector<float> v = p.to_vector();
      out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
    }
  }
  return 0;
}

int hang() {
  dist::barrier();
  if (dist::rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(120));  // stops answering; mpirun ends it
    return 0;
  }
  try {
    (void)dist::all_reduce(xg::ones<float>({4}));
  } catch (const xg::DistributedError& e) {
    std::cerr << "rank " << dist::rank() << ": DistributedError: " << e.what() << std::endl;
    return 3;  // finalize() at exit ends the job (MPI_Abort), the sleeping rank with it
  }
  std::cerr << "rank " << dist::rank() << ": the collective finished without rank 1" << std::endl;
  return 4;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() < 2) {
    std::cerr << "usage: xgrad_distributed_faults hang DIR | train DIR TAG [--kill-at STEP] [--resume]\n";
    return 2;
  }
  dist::init({.timeout = std::chrono::seconds(3)});
  if (args[0] == "hang") return hang();
  std::int64_t kill_at = -1;
  bool resume = false;
  for (std::size_t i = 3; i < args.size(); ++i) {
    if (args[i] == "--kill-at" && i + 1 < args.size())
      kill_at = std::stoll(args[++i]);
    else if (args[i] == "--resume")
      resume = true;
  }
  return train(args[1], args.size() > 2 ? args[2] : "run", kill_at, resume);
}
