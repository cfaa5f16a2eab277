// Definitions of nn/metrics.hpp: included by it when header-only, compiled once into the library
// (src/nn.cpp) otherwise.
#pragma once

#include <vector>

#include "xgrad/nn/metrics.hpp"
#include "xgrad/ops/reduce.hpp"

namespace xgrad::metrics {

XGRAD_API void Accuracy::update(const Tensor<float>& output, const TensorBase& labels, float) {
  if (output.ndim() != 2)
    throw ShapeError(xgrad::detail::concat("Accuracy: expected an output [N, classes], got ", output.shape()));
  const bool dense = labels.dtype() == DType::float32;
  if (dense ? labels.shape() != output.shape()
            : labels.dtype() != DType::int32 || labels.ndim() != 1 || labels.shape()[0] != output.shape()[0])
    throw ShapeError(xgrad::detail::concat("Accuracy: labels ", dtype_name(labels.dtype()), labels.shape(),
                                           " do not match the output ", output.shape(),
                                           ": expected int32 class indices [N] or float32 targets [N, classes]"));
  const std::vector<std::int32_t> target =
      (dense ? argmax(Tensor<float>(labels), -1) : Tensor<std::int32_t>(labels)).to_vector();
  const std::vector<std::int32_t> predicted = argmax(output, -1).to_vector();
  for (std::size_t i = 0; i < target.size(); ++i) m_correct += predicted[i] == target[i];
  m_total += static_cast<std::int64_t>(target.size());
}

XGRAD_API void MeanLoss::update(const Tensor<float>&, const TensorBase&, float loss) {
  m_sum += loss;
  ++m_batches;
}

}  // namespace xgrad::metrics
