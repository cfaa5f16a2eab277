// Definitions of nn/layers.hpp: included by it when header-only, compiled once into the library
// (src/nn.cpp) otherwise.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "xgrad/core/factory.hpp"
#include "xgrad/jit/control_flow.hpp"
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

namespace detail {
/// MultiheadAttention's sizes and options, checked.
inline MultiheadAttentionOptions checked_attention(std::int64_t embed_dim, std::int64_t num_heads,
                                                   MultiheadAttentionOptions options, SourceLoc loc) {
  check_size("MultiheadAttention", "embed_dim", embed_dim, loc);
  check_size("MultiheadAttention", "num_heads", num_heads, loc);
  if (embed_dim % num_heads != 0)
    throw_value_error("MultiheadAttention", loc, "embed_dim (", embed_dim, ") must be a multiple of num_heads (",
                      num_heads, ")");
  if (!(options.dropout >= 0.0f && options.dropout < 1.0f))
    throw_value_error("MultiheadAttention", loc, "dropout must be in [0, 1), got ", options.dropout);
  return options;
}
}  // namespace detail

XGRAD_API MultiheadAttention::MultiheadAttention(std::int64_t embed_dim, std::int64_t num_heads,
                                                 MultiheadAttentionOptions options, SourceLoc loc)
    : m_dim(embed_dim),
      m_heads(num_heads),
      m_options(detail::checked_attention(embed_dim, num_heads, options, loc)),
      m_dropout(options.dropout, options.seed, loc) {
  const std::int64_t rows =
      xgrad::detail::checked_mul("MultiheadAttention", loc, "in_proj's rows 3 * embed_dim", 3, embed_dim);
  xgrad::detail::checked_mul("MultiheadAttention", loc, "in_proj's size", rows, embed_dim);
  // PyTorch's initialization: in_proj Xavier-uniform over the three projections stacked, the
  // output projection as a Dense layer's weight, biases zero.
  in_proj_weight = Parameter<float>(init::xavier_uniform()({rows, embed_dim}, {embed_dim, rows}), "in_proj_weight");
  out_proj_weight = Parameter<float>(init::he_uniform(std::sqrt(5.0))({embed_dim, embed_dim}, {embed_dim, embed_dim}),
                                     "out_proj_weight");
  register_parameter("in_proj_weight", in_proj_weight);
  if (options.has_bias) {
    in_proj_bias = Parameter<float>(zeros<float>({rows}), "in_proj_bias");
    register_parameter("in_proj_bias", in_proj_bias);
  }
  register_parameter("out_proj_weight", out_proj_weight);
  if (options.has_bias) {
    out_proj_bias = Parameter<float>(zeros<float>({embed_dim}), "out_proj_bias");
    register_parameter("out_proj_bias", out_proj_bias);
  }
  register_module("dropout", m_dropout);
}

XGRAD_API void MultiheadAttention::check_input(const char* what, const Tensor<float>& x, SourceLoc loc) const {
  if (x.ndim() != 3 || x.shape()[2] != m_dim)
    throw_shape_error("MultiheadAttention", loc, what, " must be [N, T, ", m_dim, "] (batch first), got ",
                      dtype_name(x.dtype()), x.shape());
}

XGRAD_API Tensor<float> MultiheadAttention::split_heads(const Tensor<float>& x) const {
  const std::int64_t n = x.shape()[0], t = x.shape()[1];
  return transpose(reshape(x, {n, t, m_heads, m_dim / m_heads}), {0, 2, 1, 3});
}

XGRAD_API Tensor<float> MultiheadAttention::merge_heads(const Tensor<float>& x) const {
  const std::int64_t n = x.shape()[0], t = x.shape()[2];
  return reshape(transpose(x, {0, 2, 1, 3}), {n, t, m_dim});
}

XGRAD_API Tensor<float> MultiheadAttention::project_in(const Tensor<float>& x, std::int64_t first,
                                                       std::int64_t count) const {
  const bool all = first == 0 && count == 3;
  const Tensor<float> w =
      all ? Tensor<float>(in_proj_weight) : slice(in_proj_weight, {first * m_dim, 0}, {count * m_dim, m_dim});
  const Tensor<float> y = matmul(x, w, false, true);
  if (!in_proj_bias.defined()) return y;
  return y + (all ? Tensor<float>(in_proj_bias) : slice(in_proj_bias, {first * m_dim}, {count * m_dim}));
}

XGRAD_API Tensor<float> MultiheadAttention::attend(const Tensor<float>& q, const Tensor<float>& k,
                                                   const Tensor<float>& v) {
  const Tensor<float> heads = scaled_dot_product_attention(q, k, v, {.causal = m_options.causal});
  const Tensor<float> merged = m_dropout(merge_heads(heads));
  const Tensor<float> y = matmul(merged, out_proj_weight, false, true);
  return out_proj_bias.defined() ? y + out_proj_bias : y;
}

XGRAD_API Tensor<float> MultiheadAttention::forward(Tensor<float> x) {
  const SourceLoc loc = call_site();
  xgrad::detail::OpScope scope("MultiheadAttention", loc, {x});
  check_input("x", x, loc);
  const auto qkv = split(project_in(x, 0, 3), {m_dim, m_dim, m_dim}, 2);
  return attend(split_heads(qkv[0]), split_heads(qkv[1]), split_heads(qkv[2]));
}

XGRAD_API Tensor<float> MultiheadAttention::forward(Tensor<float> x, Tensor<float> memory) {
  const SourceLoc loc = call_site();
  xgrad::detail::OpScope scope("MultiheadAttention", loc, {x, memory});
  check_input("x", x, loc);
  check_input("memory", memory, loc);
  if (memory.shape()[0] != x.shape()[0])
    throw_shape_error("MultiheadAttention", loc, "x and memory must have the same batch size, got ", x.shape(), " and ",
                      memory.shape());
  const auto kv = split(project_in(memory, 1, 2), {m_dim, m_dim}, 2);
  return attend(split_heads(project_in(x, 0, 1)), split_heads(kv[0]), split_heads(kv[1]));
}

XGRAD_API Tensor<float> MultiheadAttention::forward_cached(const Tensor<float>& x, KeyValueCache& cache,
                                                           SourceLoc loc) {
  xgrad::detail::OpScope scope("MultiheadAttention", loc, {x});
  check_input("x", x, loc);
  if (cache.size() > 0 && cache.keys.shape()[0] != x.shape()[0])
    throw_shape_error("MultiheadAttention", loc, "x's batch size ", x.shape()[0], " differs from the cache's, ",
                      cache.keys.shape()[0]);
  const auto qkv = split(project_in(x, 0, 3), {m_dim, m_dim, m_dim}, 2);
  Tensor<float> k = split_heads(qkv[1]), v = split_heads(qkv[2]);
  if (cache.size() > 0) {
    k = concat(std::vector{cache.keys, k}, 2);
    v = concat(std::vector{cache.values, v}, 2);
  }
  cache.keys = k;
  cache.values = v;
  // The new queries are the newest positions: the causal mask lines them up with the keys' end.
  return attend(split_heads(qkv[0]), k, v);
}

namespace detail {
inline TransformerLayerOptions checked_transformer(std::int64_t width, TransformerLayerOptions options, SourceLoc loc) {
  if (options.feedforward < 0)
    throw_value_error("TransformerEncoderLayer", loc, "feedforward must be >= 0 (0: 4 * width), got ",
                      options.feedforward);
  if (options.feedforward == 0)
    options.feedforward = xgrad::detail::checked_mul("TransformerEncoderLayer", loc, "4 * width", 4, width);
  if (!(options.dropout >= 0.0f && options.dropout < 1.0f))
    throw_value_error("TransformerEncoderLayer", loc, "dropout must be in [0, 1), got ", options.dropout);
  return options;
}
/// A seed for the i-th of a layer's dropouts: distinct masks, reproducible from one seed.
inline std::optional<std::uint64_t> nth_seed(std::optional<std::uint64_t> seed, std::uint64_t i) {
  return seed ? std::optional<std::uint64_t>(*seed * 4 + i) : std::nullopt;
}
}  // namespace detail

XGRAD_API TransformerEncoderLayer::TransformerEncoderLayer(std::int64_t width, std::int64_t num_heads,
                                                           TransformerLayerOptions options, SourceLoc loc)
    : TransformerEncoderLayer(width, num_heads, detail::checked_transformer(width, options, loc), loc, Checked{}) {}

XGRAD_API TransformerEncoderLayer::TransformerEncoderLayer(std::int64_t width, std::int64_t num_heads,
                                                           TransformerLayerOptions options, SourceLoc loc, Checked)
    : attention(width, num_heads,
                {.causal = options.causal, .dropout = 0.0f, .seed = detail::nth_seed(options.seed, 0)}, loc),
      norm1(width, {.eps = options.eps}, loc),
      norm2(width, {.eps = options.eps}, loc),
      linear1(width, options.feedforward, {}, loc),
      linear2(options.feedforward, width, {}, loc),
      m_options(options),
      m_dropout_attention(options.dropout, detail::nth_seed(options.seed, 1), loc),
      m_dropout_hidden(options.dropout, detail::nth_seed(options.seed, 2), loc),
      m_dropout_output(options.dropout, detail::nth_seed(options.seed, 3), loc) {
  register_modules({{"attention", &attention},
                    {"norm1", &norm1},
                    {"norm2", &norm2},
                    {"linear1", &linear1},
                    {"linear2", &linear2},
                    {"dropout1", &m_dropout_attention},
                    {"dropout2", &m_dropout_hidden},
                    {"dropout3", &m_dropout_output}});
}

XGRAD_API Tensor<float> TransformerEncoderLayer::feed_forward(const Tensor<float>& x) {
  // Dense takes rows: the positions of every sequence as one batch of rows.
  const Shape& s = x.shape();
  const Tensor<float> rows = reshape(x, {s[0] * s[1], s[2]});
  const Tensor<float> hidden = m_dropout_hidden(gelu(linear1(rows), m_options.activation));
  return m_dropout_output(reshape(linear2(hidden), {s[0], s[1], s[2]}));
}

template <class Attend> Tensor<float> TransformerEncoderLayer::apply(const Tensor<float>& x, Attend attend) {
  if (m_options.norm_first) {
    const Tensor<float> h = x + m_dropout_attention(attend(norm1(x)));
    return h + feed_forward(norm2(h));
  }
  const Tensor<float> h = norm1(x + m_dropout_attention(attend(x)));
  return norm2(h + feed_forward(h));
}

XGRAD_API Tensor<float> TransformerEncoderLayer::forward(Tensor<float> x) {
  return apply(x, [this](const Tensor<float>& in) { return attention(in); });
}

XGRAD_API Tensor<float> TransformerEncoderLayer::forward_cached(const Tensor<float>& x, KeyValueCache& cache,
                                                                SourceLoc loc) {
  return apply(x, [&](const Tensor<float>& in) { return attention.forward_cached(in, cache, loc); });
}

namespace detail {

/// A recurrent layer's weights, PyTorch's way: [gates * hidden, input] and [gates * hidden,
/// hidden], biases [gates * hidden], all U(-1/sqrt(hidden), 1/sqrt(hidden)).
inline void init_recurrent(Module& layer, const char* name, std::int64_t gates, std::int64_t input, std::int64_t hidden,
                           Parameter<float>& w_ih, Parameter<float>& w_hh, Parameter<float>& b_ih,
                           Parameter<float>& b_hh, SourceLoc loc) {
  check_size(name, "input_size", input, loc);
  check_size(name, "hidden_size", hidden, loc);
  const std::int64_t rows = xgrad::detail::checked_mul(name, loc, "the gates' rows", gates, hidden);
  xgrad::detail::checked_mul(name, loc, "weight_ih's size", rows, input);
  xgrad::detail::checked_mul(name, loc, "weight_hh's size", rows, hidden);
  const auto uniform = init::uniform(1.0 / std::sqrt(static_cast<double>(hidden)));
  const init::Fans fans{hidden, rows};
  w_ih = Parameter<float>(uniform({rows, input}, fans), "weight_ih");
  w_hh = Parameter<float>(uniform({rows, hidden}, fans), "weight_hh");
  b_ih = Parameter<float>(uniform({rows}, fans), "bias_ih");
  b_hh = Parameter<float>(uniform({rows}, fans), "bias_hh");
  layer.register_parameter("weight_ih", w_ih);
  layer.register_parameter("weight_hh", w_hh);
  layer.register_parameter("bias_ih", b_ih);
  layer.register_parameter("bias_hh", b_hh);
}

/// Checks x [T, N, input] and a state [N, hidden] (zeros when undefined, which it returns).
inline Tensor<float> recurrent_state(const char* name, const Tensor<float>& x, std::int64_t input, std::int64_t hidden,
                                     const Tensor<float>& state, const char* what, SourceLoc loc) {
  if (x.ndim() != 3 || x.shape()[2] != input)
    throw_shape_error(name, loc, "x must be [T, N, ", input, "] (sequence first), got ", dtype_name(x.dtype()),
                      x.shape());
  const Shape expected{x.shape()[1], hidden};
  if (!state.defined()) return zeros<float>(expected);
  if (state.shape() != expected) throw_shape_error(name, loc, what, " must be ", expected, ", got ", state.shape());
  return state;
}

}  // namespace detail

XGRAD_API LSTM::LSTM(std::int64_t input_size, std::int64_t hidden_size, SourceLoc loc)
    : m_input(input_size), m_hidden(hidden_size) {
  detail::init_recurrent(*this, "LSTM", 4, input_size, hidden_size, weight_ih, weight_hh, bias_ih, bias_hh, loc);
}

XGRAD_API RecurrentOutput LSTM::run(const Tensor<float>& x, Tensor<float> h0, Tensor<float> c0, SourceLoc loc) {
  xgrad::detail::OpScope scope("LSTM", loc, {x});
  h0 = detail::recurrent_state("LSTM", x, m_input, m_hidden, h0, "h0", loc);
  c0 = detail::recurrent_state("LSTM", x, m_input, m_hidden, c0, "c0", loc);
  const Tensor<float> projected = matmul(x, weight_ih, false, true) + bias_ih;  // every step's input part
  const Tensor<float> w_hh = weight_hh, b_hh = bias_hh;
  const std::int64_t h = m_hidden;
  auto [state, output] = scan(
      [w_hh, b_hh, h](const std::pair<Tensor<float>, Tensor<float>>& hc, const Tensor<float>& in) {
        const auto gates = split(in + matmul(hc.first, w_hh, false, true) + b_hh, {h, h, h, h}, 1);
        const auto c = sigmoid(gates[1]) * hc.second + sigmoid(gates[0]) * tanh(gates[2]);
        const auto next = sigmoid(gates[3]) * tanh(c);
        return std::pair{std::pair{next, c}, next};
      },
      std::pair{h0, c0}, projected, {}, loc);
  return {output, state.first, state.second};
}

XGRAD_API Tensor<float> LSTM::forward(Tensor<float> x) { return run(x, {}, {}, call_site()).output; }

XGRAD_API GRU::GRU(std::int64_t input_size, std::int64_t hidden_size, SourceLoc loc)
    : m_input(input_size), m_hidden(hidden_size) {
  detail::init_recurrent(*this, "GRU", 3, input_size, hidden_size, weight_ih, weight_hh, bias_ih, bias_hh, loc);
}

XGRAD_API RecurrentOutput GRU::run(const Tensor<float>& x, Tensor<float> h0, SourceLoc loc) {
  xgrad::detail::OpScope scope("GRU", loc, {x});
  h0 = detail::recurrent_state("GRU", x, m_input, m_hidden, h0, "h0", loc);
  const Tensor<float> projected = matmul(x, weight_ih, false, true) + bias_ih;
  const Tensor<float> w_hh = weight_hh, b_hh = bias_hh;
  const std::int64_t h = m_hidden;
  auto [last, output] = scan(
      [w_hh, b_hh, h](const Tensor<float>& state, const Tensor<float>& in) {
        const auto from_input = split(in, {h, h, h}, 1);
        const auto from_state = split(matmul(state, w_hh, false, true) + b_hh, {h, h, h}, 1);
        const auto r = sigmoid(from_input[0] + from_state[0]);
        const auto z = sigmoid(from_input[1] + from_state[1]);
        const auto n = tanh(from_input[2] + r * from_state[2]);
        const auto next = n + z * (state - n);  // (1 - z) n + z h
        return std::pair{next, next};
      },
      h0, projected, {}, loc);
  return {output, last, {}};
}

XGRAD_API Tensor<float> GRU::forward(Tensor<float> x) { return run(x, {}, call_site()).output; }

XGRAD_API Tensor<float> sinusoidal_positions(std::int64_t length, std::int64_t dim, SourceLoc loc) {
  if (length < 0 || dim < 0)
    throw_value_error("sinusoidal_positions", loc, "length and dim must be >= 0, got ", length, " and ", dim);
  xgrad::detail::checked_mul("sinusoidal_positions", loc, "length * dim", length, dim);
  auto table = Tensor<float>::empty({length, dim});
  if (table.numel() == 0) return table;  // the other extent may be huge then
  float* out = table.data();
  for (std::int64_t c = 0; c < dim; ++c) {  // a column at a time: one power per column, no scratch
    const double frequency = std::pow(10000.0, -static_cast<double>(c / 2 * 2) / static_cast<double>(dim));
    for (std::int64_t p = 0; p < length; ++p) {
      const double angle = static_cast<double>(p) * frequency;
      out[p * dim + c] = static_cast<float>(c % 2 == 0 ? std::sin(angle) : std::cos(angle));
    }
  }
  return table;
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
