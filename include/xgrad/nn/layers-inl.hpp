// Definitions of nn/layers.hpp: included by it when header-only, compiled once into the library
// (src/nn.cpp) otherwise.
#pragma once

#include <algorithm>

#include "xgrad/core/factory.hpp"
#include "xgrad/nn/layers.hpp"
#include "xgrad/ops/inplace.hpp"
#include "xgrad/ops/linalg.hpp"
#include "xgrad/ops/random.hpp"
#include "xgrad/ops/record.hpp"
#include "xgrad/ops/reduce.hpp"

namespace xgrad::nn {

namespace detail {
/// Checks x is [N, C, H, W] with `channels` channels; `loc` is the layer's caller.
inline void check_images(const char* layer, const TensorBase& x, std::int64_t channels, SourceLoc loc) {
  if (x.ndim() != 4 || x.shape()[1] != channels)
    throw_shape_error(layer, loc, "expected input [N, ", channels, ", H, W], got ", x.shape());
}
}  // namespace detail

XGRAD_API Dense::Dense(std::int64_t in_features, std::int64_t out_features, DenseOptions options, SourceLoc loc)
    : m_in(in_features) {
  detail::check_size("Dense", "in_features", in_features, loc);
  detail::check_size("Dense", "out_features", out_features, loc);
  xgrad::detail::checked_mul("Dense", loc, "the weight's size out_features * in_features", out_features, in_features);
  const init::Fans fans{in_features, out_features};
  weight = Parameter<float>(options.weight_init({out_features, in_features}, fans), "weight");
  register_parameter("weight", weight);
  if (options.has_bias) {
    bias = Parameter<float>(options.bias_init({out_features}, fans), "bias");
    register_parameter("bias", bias);
  }
}

XGRAD_API Tensor<float> Dense::forward(Tensor<float> x) {
  const SourceLoc loc = call_site();
  xgrad::detail::OpScope scope("Dense", loc, {x});
  if (x.ndim() != 2 || x.shape()[1] != m_in)
    throw_shape_error("Dense", loc, "expected input [N, ", m_in, "], got ", x.shape());
  Tensor<float> y = matmul(x, weight, false, true);
  return bias.defined() ? bias_add(y, bias) : y;
}

XGRAD_API Conv2d::Conv2d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel_size,
                         Conv2dOptions options, SourceLoc loc)
    : m_in(in_channels), m_conv{options.stride, options.padding, options.dilation, options.pad_mode} {
  detail::check_size("Conv2d", "in_channels", in_channels, loc);
  detail::check_size("Conv2d", "out_channels", out_channels, loc);
  detail::check_size("Conv2d", "kernel_size", kernel_size, loc);
  detail::check_size("Conv2d", "stride", options.stride, loc);
  detail::check_size("Conv2d", "dilation", options.dilation, loc);
  if (options.padding < 0) throw_value_error("Conv2d", loc, "padding must be >= 0, got ", options.padding);
  if (options.padding != 0 && options.pad_mode != PadMode::pad)
    throw_value_error("Conv2d", loc, "padding ", options.padding, " needs pad_mode pad");
  using xgrad::detail::checked_mul;
  const std::int64_t window = checked_mul("Conv2d", loc, "kernel_size * kernel_size", kernel_size, kernel_size);
  const init::Fans fans{checked_mul("Conv2d", loc, "in_channels * kernel_size^2", in_channels, window),
                        checked_mul("Conv2d", loc, "out_channels * kernel_size^2", out_channels, window)};
  checked_mul("Conv2d", loc, "the weight's size", fans.in, out_channels);
  weight = Parameter<float>(options.weight_init({out_channels, in_channels, kernel_size, kernel_size}, fans), "weight");
  register_parameter("weight", weight);
  if (options.has_bias) {
    bias = Parameter<float>(options.bias_init({out_channels}, fans), "bias");
    register_parameter("bias", bias);
  }
}

XGRAD_API Tensor<float> Conv2d::forward(Tensor<float> x) {
  const SourceLoc loc = call_site();
  xgrad::detail::OpScope scope("Conv2d", loc, {x});
  detail::check_images("Conv2d", x, m_in, loc);
  Tensor<float> y = conv2d(x, weight, m_conv);
  return bias.defined() ? bias_add(y, bias) : y;
}

XGRAD_API Dropout::Dropout(float p, std::optional<std::uint64_t> seed, SourceLoc loc) : m_p(p) {
  if (!(p >= 0.0f && p < 1.0f)) throw_value_error("Dropout", loc, "p must be in [0, 1), got ", p);
  key = scalar<std::int64_t>(static_cast<std::int64_t>(seed.value_or(init::detail::seed_sequence()++)));
  register_buffer("key", key);
}

XGRAD_API Tensor<float> Dropout::forward(Tensor<float> x) {
  if (!training() || m_p == 0.0f) return x;
  {
    no_grad off;
    key += std::int64_t{1};
  }
  const Tensor<bool> keep = random_uniform<float>(key, x.shape()) < 1.0f - m_p;
  return where(keep, x * (1.0f / (1.0f - m_p)), 0.0f);
}

XGRAD_API Embedding::Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim, EmbeddingOptions options,
                               SourceLoc loc) {
  detail::check_size("Embedding", "num_embeddings", num_embeddings, loc);
  detail::check_size("Embedding", "embedding_dim", embedding_dim, loc);
  xgrad::detail::checked_mul("Embedding", loc, "the table's size num_embeddings * embedding_dim", num_embeddings,
                             embedding_dim);
  weight =
      Parameter<float>(options.weight_init({num_embeddings, embedding_dim}, {embedding_dim, num_embeddings}), "weight");
  register_parameter("weight", weight);
}

XGRAD_API Tensor<float> Embedding::operator()(const Tensor<std::int32_t>& ids, SourceLoc loc) {
  xgrad::detail::OpScope scope("Embedding", loc, {ids});
  tracing::NameScope name_scope(name());
  return take(weight, ids, 0, loc);
}

XGRAD_API LayerNorm::LayerNorm(std::int64_t normalized_size, LayerNormOptions options, SourceLoc loc)
    : m_size(normalized_size), m_options(options) {
  detail::check_size("LayerNorm", "normalized_size", normalized_size, loc);
  if (!(options.eps > 0.0f)) throw_value_error("LayerNorm", loc, "eps must be > 0, got ", options.eps);
  if (options.elementwise_affine) {
    gamma = Parameter<float>(ones<float>({normalized_size}), "gamma");
    beta = Parameter<float>(zeros<float>({normalized_size}), "beta");
    register_parameter("gamma", gamma);
    register_parameter("beta", beta);
  }
}

XGRAD_API Tensor<float> LayerNorm::forward(Tensor<float> x) {
  const SourceLoc loc = call_site();
  if (x.ndim() == 0 || x.shape()[x.ndim() - 1] != m_size)
    throw_shape_error("LayerNorm", loc, "expected input [..., ", m_size, "], got ", x.shape());
  return gamma.defined() ? layer_norm(x, gamma, beta, m_options.eps, loc) : layer_norm(x, m_options.eps, loc);
}

XGRAD_API BatchNorm2d::BatchNorm2d(std::int64_t num_features, BatchNormOptions options, SourceLoc loc)
    : m_channels(num_features), m_options(options) {
  detail::check_size("BatchNorm2d", "num_features", num_features, loc);
  if (!(options.eps > 0.0f)) throw_value_error("BatchNorm2d", loc, "eps must be > 0, got ", options.eps);
  if (!(options.momentum >= 0.0f && options.momentum <= 1.0f))
    throw_value_error("BatchNorm2d", loc, "momentum must be in [0, 1], got ", options.momentum);
  gamma = Parameter<float>(ones<float>({num_features}), "gamma");
  beta = Parameter<float>(zeros<float>({num_features}), "beta");
  moving_mean = zeros<float>({num_features});
  moving_variance = ones<float>({num_features});
  register_parameter("gamma", gamma);
  register_parameter("beta", beta);
  register_buffer("moving_mean", moving_mean);
  register_buffer("moving_variance", moving_variance);
}

XGRAD_API Tensor<float> BatchNorm2d::forward(Tensor<float> x) {
  const SourceLoc loc = call_site();
  xgrad::detail::OpScope scope("BatchNorm2d", loc, {x});
  detail::check_images("BatchNorm2d", x, m_channels, loc);
  const Shape per_channel{1, m_channels, 1, 1};
  Tensor<float> mean_c, var_c;
  if (training()) {
    // One value per channel has no variance to normalize by (PyTorch refuses it too).
    if (x.numel() == m_channels)
      throw_value_error("BatchNorm2d", loc, "in training each channel needs more than one value, got input ", x.shape(),
                        "; use a larger batch or set_train(false)");
    mean_c = mean(x, {0, 2, 3}, true);
    var_c = mean(square(x - mean_c), {0, 2, 3}, true);
    const auto count = static_cast<float>(x.numel() / m_channels);
    no_grad off;
    const float keep = m_options.momentum, unbias = count / std::max(count - 1.0f, 1.0f);
    moving_mean.assign(moving_mean * keep + reshape(mean_c, {m_channels}).detach() * (1.0f - keep));
    moving_variance.assign(moving_variance * keep + reshape(var_c, {m_channels}).detach() * ((1.0f - keep) * unbias));
  } else {
    mean_c = reshape(moving_mean, per_channel);
    var_c = reshape(moving_variance, per_channel);
  }
  const Tensor<float> scale = reshape(gamma, per_channel) * rsqrt(var_c + m_options.eps);
  return (x - mean_c) * scale + reshape(beta, per_channel);
}

XGRAD_API void Sequential::add(std::unique_ptr<Module> layer) {
  register_module(std::to_string(m_layers.size()), *layer);
  m_layers.push_back(std::move(layer));
}

XGRAD_API Tensor<float> Sequential::forward(Tensor<float> x) {
  for (auto& layer : m_layers) x = (*layer)(x, call_site());  // errors inside name the Sequential's caller
  return x;
}

}  // namespace xgrad::nn
