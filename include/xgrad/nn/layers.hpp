// Layers: Dense, Conv2d, MaxPool2d, AvgPool2d, ReLU, Flatten, Dropout, BatchNorm2d, Sequential. Defaults
// follow MindSpore 2's (Conv2d: pad_mode same, no bias; weights and biases U(-b, b) with
// b = 1/sqrt(fan_in), as in PyTorch). Each forward is written with xgrad ops, so it runs eagerly
// and traces alike.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "xgrad/nn/init.hpp"
#include "xgrad/nn/module.hpp"
#include "xgrad/ops/elementwise.hpp"
#include "xgrad/ops/inplace.hpp"
#include "xgrad/ops/linalg.hpp"
#include "xgrad/ops/manipulation.hpp"
#include "xgrad/ops/nn.hpp"
#include "xgrad/ops/random.hpp"
#include "xgrad/ops/reduce.hpp"

namespace xgrad::nn {

namespace detail {
inline void check_size(const char* layer, const char* what, std::int64_t v, SourceLoc loc) {
  if (v <= 0) throw_value_error(layer, loc, what, " must be > 0, got ", v);
}
/// Checks x is [N, C, H, W] with `channels` channels; `loc` is the layer's caller.
inline void check_images(const char* layer, const TensorBase& x, std::int64_t channels, SourceLoc loc) {
  if (x.ndim() != 4 || x.shape()[1] != channels)
    throw_shape_error(layer, loc, "expected input [N, ", channels, ", H, W], got ", x.shape());
}
}  // namespace detail

struct DenseOptions {
  init::Initializer weight_init = init::he_uniform(std::sqrt(5.0));  // U(-1/sqrt(in), 1/sqrt(in))
  init::Initializer bias_init = init::he_uniform(std::sqrt(5.0));    // the same bound
  bool has_bias = true;
};

/// y = x W^T + b with W [out_features, in_features] and x [N, in_features].
class Dense : public Module {
 public:
  Dense(std::int64_t in_features, std::int64_t out_features, DenseOptions options = {},
        SourceLoc loc = SourceLoc::current())
      : m_in(in_features) {
    detail::check_size("Dense", "in_features", in_features, loc);
    detail::check_size("Dense", "out_features", out_features, loc);
    xgrad::detail::checked_mul("Dense", loc, "the weight's size out_features * in_features", out_features,
                               in_features);
    const init::Fans fans{in_features, out_features};
    weight = Parameter<float>(options.weight_init({out_features, in_features}, fans), "weight");
    register_parameter("weight", weight);
    if (options.has_bias) {
      bias = Parameter<float>(options.bias_init({out_features}, fans), "bias");
      register_parameter("bias", bias);
    }
  }

  Tensor<float> forward(Tensor<float> x) override {
    const SourceLoc loc = call_site();
    xgrad::detail::OpScope scope("Dense", loc, {x});
    if (x.ndim() != 2 || x.shape()[1] != m_in)
      throw_shape_error("Dense", loc, "expected input [N, ", m_in, "], got ", x.shape());
    Tensor<float> y = matmul(x, weight, false, true);
    return bias.defined() ? bias_add(y, bias) : y;
  }

  Parameter<float> weight, bias;  // bias undefined without has_bias

 private:
  std::int64_t m_in;
};

struct Conv2dOptions {
  std::int64_t stride = 1;
  std::int64_t padding = 0;  // with pad_mode pad
  std::int64_t dilation = 1;
  PadMode pad_mode = PadMode::same;
  bool has_bias = false;
  init::Initializer weight_init = init::he_uniform(std::sqrt(5.0));  // U(-1/sqrt(fan_in), 1/sqrt(fan_in))
  init::Initializer bias_init = init::he_uniform(std::sqrt(5.0));
};

/// 2-D convolution of x [N, in_channels, H, W] by a weight [out_channels, in_channels, k, k].
class Conv2d : public Module {
 public:
  Conv2d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel_size, Conv2dOptions options = {},
         SourceLoc loc = SourceLoc::current())
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
    weight =
        Parameter<float>(options.weight_init({out_channels, in_channels, kernel_size, kernel_size}, fans), "weight");
    register_parameter("weight", weight);
    if (options.has_bias) {
      bias = Parameter<float>(options.bias_init({out_channels}, fans), "bias");
      register_parameter("bias", bias);
    }
  }

  Tensor<float> forward(Tensor<float> x) override {
    const SourceLoc loc = call_site();
    xgrad::detail::OpScope scope("Conv2d", loc, {x});
    detail::check_images("Conv2d", x, m_in, loc);
    Tensor<float> y = conv2d(x, weight, m_conv);
    return bias.defined() ? bias_add(y, bias) : y;
  }

  Parameter<float> weight, bias;  // bias undefined without has_bias

 private:
  std::int64_t m_in;
  xgrad::Conv2dOptions m_conv;
};

/// The pooling layers' shared arguments: kernel, stride (defaults to the kernel) and pad mode.
struct PoolOptions {
  std::int64_t stride = 0;  // 0: the kernel size
  PadMode pad_mode = PadMode::valid;
};

namespace detail {
/// Max or average pooling with a square kernel: the layer's arguments, checked once.
template <class Pool> class Pool2dLayer : public Module {
 public:
  Pool2dLayer(std::int64_t kernel_size, PoolOptions options, SourceLoc loc)
      : m_kernel(kernel_size), m_stride(options.stride ? options.stride : kernel_size), m_pad(options.pad_mode) {
    check_size(Pool::name, "kernel_size", kernel_size, loc);
    check_size(Pool::name, "stride", m_stride, loc);
  }
  Tensor<float> forward(Tensor<float> x) override { return Pool::apply(x, m_kernel, m_stride, m_pad); }

 private:
  std::int64_t m_kernel, m_stride;
  PadMode m_pad;
};
struct MaxPoolOp {
  static constexpr const char* name = "MaxPool2d";
  static Tensor<float> apply(const Tensor<float>& x, std::int64_t k, std::int64_t s, PadMode p) {
    return max_pool2d(x, k, s, p);
  }
};
struct AvgPoolOp {
  static constexpr const char* name = "AvgPool2d";
  static Tensor<float> apply(const Tensor<float>& x, std::int64_t k, std::int64_t s, PadMode p) {
    return avg_pool2d(x, k, s, p);
  }
};
}  // namespace detail

class MaxPool2d : public detail::Pool2dLayer<detail::MaxPoolOp> {
 public:
  explicit MaxPool2d(std::int64_t kernel_size, PoolOptions options = {}, SourceLoc loc = SourceLoc::current())
      : Pool2dLayer(kernel_size, options, loc) {}
  MaxPool2d(std::int64_t kernel_size, std::int64_t stride, SourceLoc loc = SourceLoc::current())
      : Pool2dLayer(kernel_size, {.stride = stride}, loc) {}
};

/// Padding is not counted in a window's mean.
class AvgPool2d : public detail::Pool2dLayer<detail::AvgPoolOp> {
 public:
  explicit AvgPool2d(std::int64_t kernel_size, PoolOptions options = {}, SourceLoc loc = SourceLoc::current())
      : Pool2dLayer(kernel_size, options, loc) {}
  AvgPool2d(std::int64_t kernel_size, std::int64_t stride, SourceLoc loc = SourceLoc::current())
      : Pool2dLayer(kernel_size, {.stride = stride}, loc) {}
};

class ReLU : public Module {
 public:
  Tensor<float> forward(Tensor<float> x) override { return relu(x); }
};

/// [N, ...] -> [N, -1]
class Flatten : public Module {
 public:
  Tensor<float> forward(Tensor<float> x) override { return flatten(x); }
};

/// In training, zeroes each element with probability p and scales the rest by 1 / (1 - p);
/// in evaluation, the identity. Its random key is a buffer advanced on every training call, so
/// eager and compiled runs draw the same masks and a checkpoint resumes the same sequence.
class Dropout : public Module {
 public:
  explicit Dropout(float p = 0.5f, std::optional<std::uint64_t> seed = std::nullopt,
                   SourceLoc loc = SourceLoc::current())
      : m_p(p) {
    if (!(p >= 0.0f && p < 1.0f)) throw_value_error("Dropout", loc, "p must be in [0, 1), got ", p);
    key = scalar<std::int64_t>(static_cast<std::int64_t>(seed.value_or(init::detail::seed_sequence()++)));
    register_buffer("key", key);
  }

  Tensor<float> forward(Tensor<float> x) override {
    if (!training() || m_p == 0.0f) return x;
    {
      no_grad off;
      key += std::int64_t{1};
    }
    const Tensor<bool> keep = random_uniform<float>(key, x.shape()) < 1.0f - m_p;
    return where(keep, x * (1.0f / (1.0f - m_p)), 0.0f);
  }

  Tensor<std::int64_t> key;

 private:
  float m_p;
};

struct BatchNormOptions {
  float eps = 1e-5f;
  float momentum = 0.9f;  // moving = momentum * moving + (1 - momentum) * batch (MindSpore's convention)
};

/// Normalizes each channel of x [N, C, H, W]: in training by the batch's mean and (biased)
/// variance, updating the moving statistics (with the unbiased variance); in evaluation by the
/// moving statistics. gamma and beta scale and shift the result.
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(std::int64_t num_features, BatchNormOptions options = {}, SourceLoc loc = SourceLoc::current())
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

  Tensor<float> forward(Tensor<float> x) override {
    const SourceLoc loc = call_site();
    xgrad::detail::OpScope scope("BatchNorm2d", loc, {x});
    detail::check_images("BatchNorm2d", x, m_channels, loc);
    const Shape per_channel{1, m_channels, 1, 1};
    Tensor<float> mean_c, var_c;
    if (training()) {
      // One value per channel has no variance to normalize by (PyTorch refuses it too).
      if (x.numel() == m_channels)
        throw_value_error("BatchNorm2d", loc, "in training each channel needs more than one value, got input ",
                          x.shape(), "; use a larger batch or set_train(false)");
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

  Parameter<float> gamma, beta;
  Tensor<float> moving_mean, moving_variance;

 private:
  std::int64_t m_channels;
  BatchNormOptions m_options;
};

/// Runs its layers in order; they are owned and named "0", "1", ...
class Sequential : public Module {
 public:
  Sequential() = default;
  template <class... Layers> explicit Sequential(std::unique_ptr<Layers>... layers) { (add(std::move(layers)), ...); }

  /// Constructs a layer in place at the end: seq.emplace<Dense>(784, 256).
  template <class Layer, class... Args> Layer& emplace(Args&&... args) {
    auto layer = std::make_unique<Layer>(std::forward<Args>(args)...);
    Layer& ref = *layer;
    add(std::move(layer));
    return ref;
  }

  void add(std::unique_ptr<Module> layer) {
    register_module(std::to_string(m_layers.size()), *layer);
    m_layers.push_back(std::move(layer));
  }

  std::size_t size() const { return m_layers.size(); }
  Module& operator[](std::size_t i) { return *m_layers.at(i); }

  Tensor<float> forward(Tensor<float> x) override {
    for (auto& layer : m_layers) x = (*layer)(x, call_site());  // errors inside name the Sequential's caller
    return x;
  }

 private:
  std::vector<std::unique_ptr<Module>> m_layers;
};

}  // namespace xgrad::nn
