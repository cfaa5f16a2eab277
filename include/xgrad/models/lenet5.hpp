// LeNet5 as the seed notebook defines it (MindSpore's model zoo): two valid 5x5 convolutions with
// ReLU and 2x2 max pooling, then dense layers of 120, 84 and num_class units, for 32x32 images.
#pragma once

#include <cstdint>

#include "xgrad/nn/layers.hpp"

namespace xgrad::models {

class LeNet5 : public nn::Module {
 public:
  explicit LeNet5(std::int64_t num_class = 10, std::int64_t num_channel = 1)
      : conv1(num_channel, 6, 5, {.pad_mode = PadMode::valid}),
        conv2(6, 16, 5, {.pad_mode = PadMode::valid}),
        fc1(16 * 5 * 5, 120, {.weight_init = init::normal(0.02)}),
        fc2(120, 84, {.weight_init = init::normal(0.02)}),
        fc3(84, num_class, {.weight_init = init::normal(0.02)}) {
    register_modules({{"conv1", &conv1}, {"conv2", &conv2}, {"fc1", &fc1}, {"fc2", &fc2}, {"fc3", &fc3}});
  }

  Tensor<float> forward(Tensor<float> x) override {
    const SourceLoc at = call_site();  // errors inside name the line that called the network
    x = max_pool2d(relu(conv1(x, at), at), 2, 2, PadMode::valid, at);
    x = max_pool2d(relu(conv2(x, at), at), 2, 2, PadMode::valid, at);
    x = flatten(x, at);
    x = relu(fc1(x, at), at);
    x = relu(fc2(x, at), at);
    return fc3(x, at);
  }

  nn::Conv2d conv1, conv2;
  nn::Dense fc1, fc2, fc3;
};

}  // namespace xgrad::models
