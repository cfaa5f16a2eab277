// Losses: SoftmaxCrossEntropy (sparse int32 labels or dense per-class targets) and MSELoss.
// A loss takes the network's output and the batch's labels, whose dtype depends on the loss,
// so labels come as a TensorBase checked against what the loss expects. As with modules, a
// subclass defines forward; calling a loss names the caller's line in its errors.
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
  /// The loss of `output` against `labels`; `loc`, the caller's line, is what errors name.
  Tensor<float> operator()(const Tensor<float>& output, const TensorBase& labels,
                           SourceLoc loc = SourceLoc::current()) const {
    const std::string op = name();
    xgrad::detail::OpScope scope(op, loc, {output, labels});
    return forward(output, labels, loc);
  }
  virtual std::string name() const = 0;

 protected:
  virtual Tensor<float> forward(const Tensor<float>& output, const TensorBase& labels, SourceLoc loc) const = 0;
};

namespace detail {
inline Tensor<float> reduce(const Tensor<float>& per_element, Reduction reduction, SourceLoc loc) {
  switch (reduction) {
    case Reduction::none:
      return per_element;
    case Reduction::sum:
      return sum(per_element, {}, false, loc);
    case Reduction::mean:
      break;
  }
  return mean(per_element, {}, false, loc);
}
inline void check_labels_dtype(const std::string& loss, const TensorBase& labels, DType expected, SourceLoc loc) {
  if (labels.dtype() != expected)
    throw_shape_error(loss, loc, "labels must be ", dtype_name(expected), ", got ", dtype_name(labels.dtype()),
                      labels.shape());
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

  std::string name() const override { return "SoftmaxCrossEntropy"; }

 protected:
  Tensor<float> forward(const Tensor<float>& logits, const TensorBase& labels, SourceLoc loc) const override {
    if (m_options.sparse) {
      detail::check_labels_dtype(name(), labels, DType::int32, loc);
      return softmax_cross_entropy(logits, Tensor<std::int32_t>(labels, loc), m_options.reduction, loc);
    }
    detail::check_labels_dtype(name(), labels, DType::float32, loc);
    if (labels.shape() != logits.shape())
      throw_shape_error(name(), loc, "dense labels must have the logits' shape ", logits.shape(), ", got ",
                        labels.shape());
    return detail::reduce(
        neg(sum(mul(Tensor<float>(labels, loc), log_softmax(logits, -1, loc), loc), {-1}, false, loc), loc),
        m_options.reduction, loc);
  }

 private:
  SoftmaxCrossEntropyOptions m_options;
};

/// (output - labels)^2 per element, reduced (mean by default, as MindSpore's MSELoss).
class MSELoss : public Loss {
 public:
  explicit MSELoss(Reduction reduction = Reduction::mean) : m_reduction(reduction) {}

  std::string name() const override { return "MSELoss"; }

 protected:
  Tensor<float> forward(const Tensor<float>& output, const TensorBase& labels, SourceLoc loc) const override {
    detail::check_labels_dtype(name(), labels, DType::float32, loc);
    // Broadcasting would compare every output with every label ([N, 1] against [N] gives [N, N]).
    if (labels.shape() != output.shape())
      throw_shape_error(name(), loc, "labels ", labels.shape(), " must have the output's shape ", output.shape(),
                        "; reshape one of them");
    return detail::reduce(square(sub(output, Tensor<float>(labels, loc), loc), loc), m_reduction, loc);
  }

 private:
  Reduction m_reduction;
};

}  // namespace xgrad::nn
