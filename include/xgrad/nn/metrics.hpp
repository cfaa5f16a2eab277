// Metrics Model::eval accumulates over a data set: accuracy and the mean loss.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "xgrad/core/tensor.hpp"
#include "xgrad/ops/reduce.hpp"

namespace xgrad::metrics {

class Metric {
 public:
  virtual ~Metric() = default;
  virtual void reset() = 0;
  /// Adds one batch: the network's output, the labels and the batch's loss.
  virtual void update(const Tensor<float>& output, const TensorBase& labels, float loss) = 0;
  virtual double value() const = 0;
};

/// The fraction of samples whose highest output is their label (int32 class indices [N]) or,
/// for per-class targets [N, C], the argmax of the targets.
class Accuracy : public Metric {
 public:
  void reset() override { m_correct = m_total = 0; }
  void update(const Tensor<float>& output, const TensorBase& labels, float) override {
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
  double value() const override {
    return m_total ? static_cast<double>(m_correct) / static_cast<double>(m_total) : 0.0;
  }

 private:
  std::int64_t m_correct = 0, m_total = 0;
};

/// The mean of the batches' losses.
class MeanLoss : public Metric {
 public:
  void reset() override { m_sum = 0, m_batches = 0; }
  void update(const Tensor<float>&, const TensorBase&, float loss) override {
    m_sum += loss;
    ++m_batches;
  }
  double value() const override { return m_batches ? m_sum / static_cast<double>(m_batches) : 0.0; }

 private:
  double m_sum = 0;
  std::int64_t m_batches = 0;
};

inline std::shared_ptr<Metric> accuracy() { return std::make_shared<Accuracy>(); }
inline std::shared_ptr<Metric> loss() { return std::make_shared<MeanLoss>(); }

}  // namespace xgrad::metrics
