// Metrics Model::eval accumulates over a data set: accuracy and the mean loss.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include "xgrad/core/config.hpp"
#include "xgrad/core/tensor.hpp"

namespace xgrad::metrics {

class Metric {
 public:
  virtual ~Metric() = default;
  virtual void reset() = 0;
  /// Adds one batch: the network's output, the labels and the batch's loss.
  virtual void update(const Tensor<float>& output, const TensorBase& labels, float loss) = 0;
  virtual double value() const = 0;
  /// value() as a sum over samples and their count, which data-parallel evaluation adds over
  /// the ranks before dividing. The default, {value(), 1}, averages the ranks' values.
  virtual std::pair<double, double> totals() const { return {value(), 1.0}; }
};

/// The fraction of samples whose highest output is their label (int32 class indices [N]) or,
/// for per-class targets [N, C], the argmax of the targets.
class Accuracy : public Metric {
 public:
  void reset() override { m_correct = m_total = 0; }
  XGRAD_API void update(const Tensor<float>& output, const TensorBase& labels, float loss) override;
  double value() const override {
    return m_total ? static_cast<double>(m_correct) / static_cast<double>(m_total) : 0.0;
  }
  std::pair<double, double> totals() const override {
    return {static_cast<double>(m_correct), static_cast<double>(m_total)};
  }

 private:
  std::int64_t m_correct = 0, m_total = 0;
};

/// The mean of the batches' losses.
class MeanLoss : public Metric {
 public:
  void reset() override { m_sum = 0, m_batches = 0; }
  XGRAD_API void update(const Tensor<float>& output, const TensorBase& labels, float loss) override;
  double value() const override { return m_batches ? m_sum / static_cast<double>(m_batches) : 0.0; }
  std::pair<double, double> totals() const override { return {m_sum, static_cast<double>(m_batches)}; }

 private:
  double m_sum = 0;
  std::int64_t m_batches = 0;
};

inline std::shared_ptr<Metric> accuracy() { return std::make_shared<Accuracy>(); }
inline std::shared_ptr<Metric> loss() { return std::make_shared<MeanLoss>(); }

}  // namespace xgrad::metrics

#if !defined(XGRAD_COMPILED)
#include "xgrad/nn/metrics-inl.hpp"
#endif
