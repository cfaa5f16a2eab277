// LeNet5 in LibTorch, the counterpart of xgrad::models::LeNet5 for suite_libtorch.cpp (the train
// step's speed) and lenet5_torch_accuracy.cpp (its accuracy): valid 5x5 convolutions, ReLU and
// 2x2 max pooling, then dense layers of 120, 84 and 10 units.
#pragma once

#include <torch/torch.h>

namespace xgrad::bench {

struct TorchLeNet5 : torch::nn::Module {
  /// conv_bias false is xgrad's (and MindSpore's) Conv2d default; PyTorch's has a bias.
  explicit TorchLeNet5(bool conv_bias)
      : conv1(torch::nn::Conv2dOptions(1, 6, 5).bias(conv_bias)),
        conv2(torch::nn::Conv2dOptions(6, 16, 5).bias(conv_bias)),
        fc1(16 * 5 * 5, 120),
        fc2(120, 84),
        fc3(84, 10) {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1(x)), 2, 2);
    x = torch::max_pool2d(torch::relu(conv2(x)), 2, 2);
    x = torch::relu(fc1(x.flatten(1)));
    x = torch::relu(fc2(x));
    return fc3(x);
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2, fc3;
};

}  // namespace xgrad::bench
