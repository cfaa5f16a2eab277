// Definitions of nn/loss.hpp: included by it when header-only, compiled once into the library
// (src/nn.cpp) otherwise.
#pragma once

#include "xgrad/nn/loss.hpp"
#include "xgrad/ops/elementwise.hpp"
#include "xgrad/ops/nn.hpp"
#include "xgrad/ops/record.hpp"
#include "xgrad/ops/reduce.hpp"

namespace xgrad::nn {

XGRAD_API Tensor<float> Loss::operator()(const Tensor<float>& output, const TensorBase& labels, SourceLoc loc) const {
  const std::string op = name();
  xgrad::detail::OpScope scope(op, loc, {output, labels});
  return forward(output, labels, loc);
}

namespace detail {
inline void check_labels_dtype(const std::string& loss, const TensorBase& labels, DType expected, SourceLoc loc) {
  if (labels.dtype() != expected)
    throw_shape_error(loss, loc, "labels must be ", dtype_name(expected), ", got ", dtype_name(labels.dtype()),
                      labels.shape());
}
}  // namespace detail

XGRAD_API Tensor<float> SoftmaxCrossEntropy::forward(const Tensor<float>& logits, const TensorBase& labels,
                                                     SourceLoc loc) const {
  if (m_options.sparse) {
    detail::check_labels_dtype(name(), labels, DType::int32, loc);
    return softmax_cross_entropy(logits, Tensor<std::int32_t>(labels, loc), m_options.reduction, loc);
  }
  detail::check_labels_dtype(name(), labels, DType::float32, loc);
  if (labels.shape() != logits.shape())
    throw_shape_error(name(), loc, "dense labels must have the logits' shape ", logits.shape(), ", got ",
                      labels.shape());
  return xgrad::detail::reduce_losses(
      neg(sum(mul(Tensor<float>(labels, loc), log_softmax(logits, -1, loc), loc), {-1}, false, loc), loc),
      m_options.reduction, loc);
}

XGRAD_API Tensor<float> MSELoss::forward(const Tensor<float>& output, const TensorBase& labels, SourceLoc loc) const {
  detail::check_labels_dtype(name(), labels, DType::float32, loc);
  // Broadcasting would compare every output with every label ([N, 1] against [N] gives [N, N]).
  if (labels.shape() != output.shape())
    throw_shape_error(name(), loc, "labels ", labels.shape(), " must have the output's shape ", output.shape(),
                      "; reshape one of them");
  return xgrad::detail::reduce_losses(square(sub(output, Tensor<float>(labels, loc), loc), loc), m_reduction, loc);
}

}  // namespace xgrad::nn
