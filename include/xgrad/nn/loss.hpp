// Losses: SoftmaxCrossEntropy (sparse int32 labels or dense per-class targets) and MSELoss.
// A loss takes the network's output and the batch's labels, whose dtype depends on the loss,
// so labels come as a TensorBase checked against what the loss expects. As with modules, a
// subclass defines forward; calling a loss names the caller's line in its errors.
#pragma once

#include <cstdint>
#include <string>

#include "xgrad/core/config.hpp"
#include "xgrad/core/tensor.hpp"
#include "xgrad/ops/nn.hpp"

namespace xgrad::nn {

class Loss {
 public:
  virtual ~Loss() = default;
  /// The loss of `output` against `labels`; `loc`, the caller's line, is what errors name.
  XGRAD_API Tensor<float> operator()(const Tensor<float>& output, const TensorBase& labels,
                                     SourceLoc loc = SourceLoc::current()) const;
  virtual std::string name() const = 0;

 protected:
  virtual Tensor<float> forward(const Tensor<float>& output, const TensorBase& labels, SourceLoc loc) const = 0;
};

struct SoftmaxCrossEntropyOptions {
  bool sparse = false;  // labels are class indices [N] (int32) rather than per-class targets [N, C]
  Reduction reduction = Reduction::none;
};

/// -sum_c labels_c * log softmax(logits)_c per sample (MindSpore's SoftmaxCrossEntropyWithLogits,
/// whose defaults are sparse = false and reduction none).
class SoftmaxCrossEntropy : public Loss {
 public:
  explicit SoftmaxCrossEntropy(SoftmaxCrossEntropyOptions options = {}) : m_options(options) {}

  std::string name() const override { return "SoftmaxCrossEntropy"; }

 protected:
  XGRAD_API Tensor<float> forward(const Tensor<float>& logits, const TensorBase& labels, SourceLoc loc) const override;

 private:
  SoftmaxCrossEntropyOptions m_options;
};

/// (output - labels)^2 per element, reduced (mean by default, as MindSpore's MSELoss).
class MSELoss : public Loss {
 public:
  explicit MSELoss(Reduction reduction = Reduction::mean) : m_reduction(reduction) {}

  std::string name() const override { return "MSELoss"; }

 protected:
  XGRAD_API Tensor<float> forward(const Tensor<float>& output, const TensorBase& labels, SourceLoc loc) const override;

 private:
  Reduction m_reduction;
};

}  // namespace xgrad::nn

#if !defined(XGRAD_COMPILED)
#include "xgrad/nn/loss-inl.hpp"
#endif
