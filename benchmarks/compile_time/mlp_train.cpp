// The compile-time benchmark's training program: an MLP trained by Model in graph mode on
// random data, with a checkpoint callback, then saved and loaded.
#include <filesystem>
#include <iostream>
#include <xgrad/xgrad.hpp>

namespace xg = xgrad;

int main() {
  xg::set_mode(xg::Mode::graph);
  xg::nn::Sequential net;
  net.emplace<xg::nn::Dense>(784, 128);
  net.emplace<xg::nn::ReLU>();
  net.emplace<xg::nn::Dense>(128, 10);
  auto images = xg::randn<float>({256, 784}, 1);
  auto labels = xg::cast<std::int32_t>(xg::uniform<float>({256}, 0, 10, 2));
  auto data = xg::data::TensorDataset(images, labels).shuffle(1).batch(32, true);
  xg::nn::SoftmaxCrossEntropy loss({.sparse = true, .reduction = xg::Reduction::mean});
  xg::optim::Momentum opt(net.parameters(), 0.01, 0.9);
  xg::Model model(net, loss, opt, {{"Accuracy", xg::metrics::accuracy()}});
  auto dir = std::filesystem::temp_directory_path() / "xgrad_mlp_train";
  model.train(2, data,
              {xg::callbacks::LossMonitor(8), xg::callbacks::ModelCheckpoint("mlp", dir.string(), {.save_steps = 8})});
  std::cout << "accuracy " << model.eval(data).at("Accuracy") << '\n';
  xg::save_checkpoint(net, (dir / "final.ckpt").string());
  xg::load_checkpoint(net, (dir / "final.ckpt").string());
}
