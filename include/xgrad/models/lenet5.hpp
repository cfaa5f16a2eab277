// LeNet5 as the seed notebook defines it (MindSpore's model zoo): two valid 5x5 convolutions with
// ReLU and 2x2 max pooling, then dense layers of 120, 84 and num_class units, for 32x32 images.
#pragma once

#include <cstdint>

#include "xgrad/core/config.hpp"
#include "xgrad/nn/layers.hpp"

namespace xgrad::models {

class LeNet5 : public nn::Module {
 public:
  XGRAD_API explicit LeNet5(std::int64_t num_class = 10, std::int64_t num_channel = 1);

  XGRAD_API Tensor<float> forward(Tensor<float> x) override;

  nn::Conv2d conv1, conv2;
  nn::Dense fc1, fc2, fc3;
};

}  // namespace xgrad::models

#if !defined(XGRAD_COMPILED)
#include "xgrad/models/lenet5-inl.hpp"
#endif
