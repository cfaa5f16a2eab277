// The accuracy reference for examples/lenet5_fashion_mnist.cpp (issue 5): LeNet5 trained with the
// same recipe in LibTorch, on the very batches xgrad's pipeline makes (same shuffle, resize and
// normalization), so the only differences left are the library and, with --init torch, the
// initialization. Built only when CMake finds LibTorch.
//
//   lenet5_torch_accuracy [--data DIR] [--seed N] [--epochs N] [--init torch|xgrad] [--threads N]
//
// --init xgrad: the weights of a fresh xg::models::LeNet5 after xg::init::set_seed(seed), the
//   start of the example's runs (convolutions without bias, dense weights N(0, 0.02^2)).
// --init torch: LibTorch's default initialization after torch::manual_seed(seed), convolutions
//   with bias, as a LeNet5 written for PyTorch usually has.
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <xgrad/backend/cpu/thread_pool.hpp>
#include <xgrad/data/mnist.hpp>
#include <xgrad/models/lenet5.hpp>
#include <xgrad/xgrad.hpp>

#include "lenet5_support.hpp"
#include "torch_lenet5.hpp"

namespace xg = xgrad;

namespace {

struct Options {
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::uint64_t seed = 1;  // of the shuffle and the initial weights
  int epochs = 3;
  bool xgrad_init = false;
  int threads = 1;
};

Options parse(int argc, char** argv) {
  const xg::examples::Flags flags("lenet5_torch_accuracy",
                                  "[--data DIR] [--seed N] [--epochs N] [--init torch|xgrad] [--threads N]");
  Options o;
  flags.parse(argc, argv, [&](const std::string& flag, const std::string& value) {
    if (flag == "--data")
      o.data = value;
    else if (flag == "--seed")
      o.seed = static_cast<std::uint64_t>(flags.positive(flag, value));
    else if (flag == "--epochs")
      o.epochs = static_cast<int>(flags.positive(flag, value));
    else if (flag == "--threads")
      o.threads = static_cast<int>(flags.positive(flag, value));
    else if (flag == "--init") {
      if (value != "torch" && value != "xgrad") flags.fail("--init is torch or xgrad");
      o.xgrad_init = value == "xgrad";
    } else
      return false;
    return true;
  });
  return o;
}

/// The batch as torch tensors that own their data (the xgrad buffers go when the batch does).
std::pair<torch::Tensor, torch::Tensor> to_torch(const xg::data::Batch& batch) {
  const auto& s = batch.images.shape();
  std::vector<std::int64_t> shape(s.begin(), s.end());
  auto images = torch::from_blob(const_cast<float*>(batch.images.data()), shape, torch::kFloat32).clone();
  auto labels =
      torch::from_blob(const_cast<std::int32_t*>(batch.labels.data()), {batch.labels.shape()[0]}, torch::kInt32)
          .to(torch::kLong);
  return {images, labels};
}

/// Copies every parameter of `from` into the LibTorch parameter of the same name
/// (conv1.weight, fc1.bias, ...; both libraries lay the weights out [out, in, ...]).
void copy_weights(const xg::nn::Module& from, xgrad::bench::TorchLeNet5& to) {
  torch::NoGradGuard no_grad;
  auto params = to.named_parameters();
  if (static_cast<std::size_t>(params.size()) != from.named_parameters().size()) {
    std::cerr << "lenet5_torch_accuracy: the networks have different parameter counts\n";
    std::exit(1);
  }
  for (const auto& [name, base] : from.named_parameters()) {
    const xg::Tensor<float> p(base);
    torch::Tensor* target = params.find(name);
    const auto& s = p.shape();
    if (target == nullptr || target->sizes() != torch::IntArrayRef(std::vector<std::int64_t>(s.begin(), s.end()))) {
      std::cerr << "lenet5_torch_accuracy: no LibTorch parameter " << name << " of shape " << p.shape() << "\n";
      std::exit(1);
    }
    target->copy_(torch::from_blob(const_cast<float*>(p.data()), target->sizes(), torch::kFloat32));
  }
}

/// Fraction of correct predictions over the batches of one epoch of `ds`.
double accuracy(xgrad::bench::TorchLeNet5& net, const xg::data::Dataset& ds) {
  torch::NoGradGuard no_grad;
  std::int64_t correct = 0, total = 0;
  for (const auto& batch : ds.epoch(0)) {
    const auto [images, labels] = to_torch(batch);
    correct += net.forward(images).argmax(1).eq(labels).sum().item<std::int64_t>();
    total += labels.size(0);
  }
  return static_cast<double>(correct) / static_cast<double>(total);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  torch::set_num_threads(o.threads);
  xg::cpu::set_num_threads(o.threads);
  const auto train = xg::examples::fashion_mnist(o.data, xg::data::Split::train, 32, o.seed);
  const auto test = xg::examples::fashion_mnist(o.data, xg::data::Split::test, 32, o.seed);
  // Every test image, for an accuracy that no dropped remainder changes.
  const auto test_all = xg::data::MnistDataset(o.data, xg::data::Split::test)
                            .map(xg::data::Resize(32), xg::data::Rescale(1.0 / 255.0),
                                 xg::data::Normalize(0.1307, 0.3081), xg::data::HWC2CHW())
                            .batch(1000);

  torch::manual_seed(o.seed);
  xgrad::bench::TorchLeNet5 net(/*conv_bias=*/!o.xgrad_init);
  if (o.xgrad_init) {
    xg::init::set_seed(o.seed);
    xg::models::LeNet5 reference;
    copy_weights(reference, net);
    // The copy is only right if both networks compute the same function: compare their outputs
    // on the first training batch.
    const auto first = *train.epoch(0).begin();
    const auto mine = net.forward(to_torch(first).first).detach();
    const xg::Tensor<float> theirs = reference(first.images);
    const auto theirs_t = torch::from_blob(const_cast<float*>(theirs.data()), mine.sizes(), torch::kFloat32);
    std::printf("initial logits, max |LibTorch - xgrad|: %.3g\n", (mine - theirs_t).abs().max().item<double>());
  }
  std::printf("LibTorch LeNet5 on %s, seed %llu, init %s, %d thread(s), %lld train batches of 32\n", o.data.c_str(),
              static_cast<unsigned long long>(o.seed), o.xgrad_init ? "xgrad" : "torch", o.threads,
              static_cast<long long>(train.size()));

  torch::optim::SGD opt(net.parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    const auto start = std::chrono::steady_clock::now();
    float last = 0;
    std::int64_t steps = 0;
    // epoch(e) is the shuffle xg::Model::train's e-th epoch of a fresh Dataset uses.
    for (const auto& batch : train.epoch(epoch)) {
      const auto [images, labels] = to_torch(batch);
      opt.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(net.forward(images), labels);  // mean over the batch
      loss.backward();
      opt.step();
      last = loss.item<float>();
      ++steps;
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::printf("epoch: %d step: %lld, loss is %.6f, epoch time %.0f ms (%.3f ms per step)\n", epoch + 1,
                static_cast<long long>(steps), last, ms, ms / static_cast<double>(steps));
  }
  std::printf("test accuracy %.4f (the example's evaluation: %lld batches of 32); all 10000 images: %.4f\n",
              accuracy(net, test), static_cast<long long>(test.size()), accuracy(net, test_all));
}
