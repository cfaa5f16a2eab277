// Losses: SoftmaxCrossEntropy (sparse int32 labels or dense per-class targets) and MSELoss.
// A loss takes the network's output and the batch's labels, whose dtype depends on the loss,
// so labels come as a TensorBase checked against what the loss expects.
#pragma once

#include <cstdint>
#include <string>

#include "xgrad/ops/elementwise.hpp"
#include "xgrad/ops/nn.hpp"
#include "xgrad/ops/reduce.hpp"

namespace xgrad::nn {

class Loss {
 public:
  virtual ~Loss() = default;
  virtual Tensor<float> operator()(const Tensor<float>& output, const TensorBase& labels) const = 0;
  virtual std::string name() const = 0;
};

namespace detail {
inline Tensor<float> reduce(const Tensor<float>& per_element, Reduction reduction) {
  switch (reduction) {
    case Reduction::none:
      return per_element;
    case Reduction::sum:
      return sum(per_element);
    case Reduction::mean:
      break;
  }
  return mean(per_element);
}
inline void check_labels_dtype(const std::string& loss, const TensorBase& labels, DType expected) {
  if (labels.dtype() != expected)
    throw ShapeError(xgrad::detail::concat(loss, ": labels must be ", dtype_name(expected), ", got ",
                                           dtype_name(labels.dtype()), labels.shape()));
}
}  // namespace detail

struct SoftmaxCrossEntropyOptions {
  bool sparse = false;  // labels are class indices [N] (int32) rather than per-class targets [N, C]
  Reduction reduction = Reduction::none;
};

/// -sum_c labels_c * log softmax(logits)_c per sample (MindSpore's SoftmaxCrossEntropyWithLogits,
/// whose defaults are sparse = false and reduction none).
class SoftmaxCrossEntropy : public Loss {
 public:
  explicit SoftmaxCrossEntropy(SoftmaxCrossEntropyOptions options = {}) : m_options(options) {}

  Tensor<float> operator()(const Tensor<float>& logits, const TensorBase& labels) const override {
    if (m_options.sparse) {
      detail::check_labels_dtype(name(), labels, DType::int32);
      return softmax_cross_entropy(logits, Tensor<std::int32_t>(labels), m_options.reduction);
    }
    detail::check_labels_dtype(name(), labels, DType::float32);
    if (labels.shape() != logits.shape())
      throw ShapeError(xgrad::detail::concat(name(), ": dense labels must have the logits' shape ", logits.shape(),
                                             ", got ", labels.shape()));
    return detail::reduce(-sum(Tensor<float>(labels) * log_softmax(logits, -1), {-1}), m_options.reduction);
  }
  std::string name() const override { return "SoftmaxCrossEntropy"; }

 private:
  SoftmaxCrossEntropyOptions m_options;
};

/// (output - labels)^2 per element, reduced (mean by default, as MindSpore's MSELoss).
class MSELoss : public Loss {
 public:
  explicit MSELoss(Reduction reduction = Reduction::mean) : m_reduction(reduction) {}

  Tensor<float> operator()(const Tensor<float>& output, const TensorBase& labels) const override {
    detail::check_labels_dtype(name(), labels, DType::float32);
    // Broadcasting would compare every output with every label ([N, 1] against [N] gives [N, N]).
    if (labels.shape() != output.shape())
      throw ShapeError(xgrad::detail::concat(name(), ": labels ", labels.shape(), " must have the output's shape ",
                                             output.shape(), "; reshape one of them"));
    return detail::reduce(square(output - Tensor<float>(labels)), m_reduction);
  }
  std::string name() const override { return "MSELoss"; }

 private:
  Reduction m_reduction;
};

}  // namespace xgrad::nn
