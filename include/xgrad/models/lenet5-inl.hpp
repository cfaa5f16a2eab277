// Definitions of models/lenet5.hpp: included by it when header-only, compiled once into the
// library (src/models.cpp) otherwise.
#pragma once

#include "xgrad/models/lenet5.hpp"

namespace xgrad::models {

XGRAD_API LeNet5::LeNet5(std::int64_t num_class, std::int64_t num_channel)
    : conv1(num_channel, 6, 5, {.pad_mode = PadMode::valid}),
      conv2(6, 16, 5, {.pad_mode = PadMode::valid}),
      fc1(16 * 5 * 5, 120, {.weight_init = init::normal(0.02)}),
      fc2(120, 84, {.weight_init = init::normal(0.02)}),
      fc3(84, num_class, {.weight_init = init::normal(0.02)}) {
  register_modules({{"conv1", &conv1}, {"conv2", &conv2}, {"fc1", &fc1}, {"fc2", &fc2}, {"fc3", &fc3}});
}

XGRAD_API Tensor<float> LeNet5::forward(Tensor<float> x) {
  const SourceLoc at = call_site();  // errors inside name the line that called the network
  x = max_pool2d(relu(conv1(x, at), at), 2, 2, PadMode::valid, at);
  x = max_pool2d(relu(conv2(x, at), at), 2, 2, PadMode::valid, at);
  x = flatten(x, at);
  x = relu(fc1(x, at), at);
  x = relu(fc2(x, at), at);
  return fc3(x, at);
}

}  // namespace xgrad::models
