// Layers: Dense, Conv2d, MaxPool2d, AvgPool2d, ReLU, GELU, Flatten, Dropout, BatchNorm2d, Embedding,
// LayerNorm, MultiheadAttention, TransformerEncoderLayer, LSTM, GRU, Sequential. Defaults follow MindSpore 2's (Conv2d:
// pad_mode same, no bias; weights and biases U(-b, b) with b = 1/sqrt(fan_in), as in PyTorch). Each forward is written
// with xgrad ops, so it runs eagerly and traces alike.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "xgrad/core/config.hpp"
#include "xgrad/nn/init.hpp"
#include "xgrad/nn/module.hpp"
#include "xgrad/ops/elementwise.hpp"
#include "xgrad/ops/manipulation.hpp"
#include "xgrad/ops/nn.hpp"

namespace xgrad::nn {

namespace detail {
inline void check_size(const char* layer, const char* what, std::int64_t v, SourceLoc loc) {
  if (v <= 0) throw_value_error(layer, loc, what, " must be > 0, got ", v);
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
  XGRAD_API Dense(std::int64_t in_features, std::int64_t out_features, DenseOptions options = {},
                  SourceLoc loc = SourceLoc::current());

  XGRAD_API Tensor<float> forward(Tensor<float> x) override;

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
  XGRAD_API Conv2d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel_size,
                   Conv2dOptions options = {}, SourceLoc loc = SourceLoc::current());

  XGRAD_API Tensor<float> forward(Tensor<float> x) override;

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

/// GELU activation (xgrad::gelu): exact by default, or its tanh approximation.
class GELU : public Module {
 public:
  explicit GELU(GeluApproximation approximate = GeluApproximation::none) : m_approximate(approximate) {}
  Tensor<float> forward(Tensor<float> x) override { return gelu(x, m_approximate); }

 private:
  GeluApproximation m_approximate;
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
  XGRAD_API explicit Dropout(float p = 0.5f, std::optional<std::uint64_t> seed = std::nullopt,
                             SourceLoc loc = SourceLoc::current());

  XGRAD_API Tensor<float> forward(Tensor<float> x) override;

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
  XGRAD_API explicit BatchNorm2d(std::int64_t num_features, BatchNormOptions options = {},
                                 SourceLoc loc = SourceLoc::current());

  XGRAD_API Tensor<float> forward(Tensor<float> x) override;

  Parameter<float> gamma, beta;
  Tensor<float> moving_mean, moving_variance;

 private:
  std::int64_t m_channels;
  BatchNormOptions m_options;
};

struct EmbeddingOptions {
  init::Initializer weight_init = init::normal(1.0);  // N(0, 1), as PyTorch's
};

/// A table of num_embeddings vectors of embedding_dim: ids [...] (int32, each in
/// [0, num_embeddings)) give [..., embedding_dim] (xgrad::take along axis 0; the gradient adds
/// into the rows the ids picked). Called with int32 ids, it runs as ops: eagerly, or traced into
/// the graph of the function or module that calls it.
class Embedding : public Module {
 public:
  XGRAD_API Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim, EmbeddingOptions options = {},
                      SourceLoc loc = SourceLoc::current());

  XGRAD_API Tensor<float> operator()(const Tensor<std::int32_t>& ids, SourceLoc loc = SourceLoc::current());

  Parameter<float> weight;  // [num_embeddings, embedding_dim]
};

struct LayerNormOptions {
  float eps = 1e-5f;
  bool elementwise_affine = true;  // learn gamma (ones) and beta (zeros)
};

/// Normalizes each vector along the last axis of x [..., normalized_size] (xgrad::layer_norm),
/// then scales and shifts it by gamma and beta.
class LayerNorm : public Module {
 public:
  XGRAD_API explicit LayerNorm(std::int64_t normalized_size, LayerNormOptions options = {},
                               SourceLoc loc = SourceLoc::current());

  XGRAD_API Tensor<float> forward(Tensor<float> x) override;

  Parameter<float> gamma, beta;  // undefined without elementwise_affine

 private:
  std::int64_t m_size;
  LayerNormOptions m_options;
};

struct MultiheadAttentionOptions {
  bool causal = false;                // each position attends to itself and the positions before it only
  float dropout = 0.0f;               // in training, on the heads' merged output before the output projection
  bool has_bias = true;               // in_proj_bias and out_proj_bias
  std::optional<std::uint64_t> seed;  // the dropout's
};

/// The keys and values of the positions a MultiheadAttention has seen, per head: [N, heads, S,
/// head_dim] each, S growing by each call of forward_cached (undefined before the first).
struct KeyValueCache {
  Tensor<float> keys, values;
  /// Positions held.
  std::int64_t size() const { return keys.defined() ? keys.shape()[2] : 0; }
};

/// Multi-head attention over batch-first sequences x [N, T, E] (PyTorch's batch_first): queries,
/// keys and values are projections of the input by in_proj_weight [3E, E] (queries' rows first),
/// split into `num_heads` heads of E / num_heads features, attended by
/// xgrad::scaled_dot_product_attention (causal when asked), merged and projected by
/// out_proj_weight [E, E]. forward(x) is self-attention; forward(x, memory) attends from x's
/// positions to memory [N, S, E]'s. The fused attention makes no weight matrix, so dropout
/// applies to the heads' merged output (PyTorch's drops attention weights).
class MultiheadAttention : public Module {
 public:
  XGRAD_API MultiheadAttention(std::int64_t embed_dim, std::int64_t num_heads, MultiheadAttentionOptions options = {},
                               SourceLoc loc = SourceLoc::current());

  XGRAD_API Tensor<float> forward(Tensor<float> x) override;
  XGRAD_API Tensor<float> forward(Tensor<float> x, Tensor<float> memory) override;

  /// Self-attention of the newest positions x [N, T, E] over themselves and every position
  /// `cache` holds, whose keys and values it then holds too: generation a token at a time
  /// without projecting the past again. Causal over the new positions when the layer is.
  XGRAD_API Tensor<float> forward_cached(const Tensor<float>& x, KeyValueCache& cache,
                                         SourceLoc loc = SourceLoc::current());

  Parameter<float> in_proj_weight, in_proj_bias, out_proj_weight, out_proj_bias;  // biases: with has_bias

 private:
  /// [N, T, E] -> [N, heads, T, head_dim], and back.
  Tensor<float> split_heads(const Tensor<float>& x) const;
  Tensor<float> merge_heads(const Tensor<float>& x) const;
  /// x [N, T, E] (the caller's check) projected by rows [first, first + count * E) of in_proj.
  Tensor<float> project_in(const Tensor<float>& x, std::int64_t first, std::int64_t count) const;
  Tensor<float> attend(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v);
  void check_input(const char* what, const Tensor<float>& x, SourceLoc loc) const;

  std::int64_t m_dim, m_heads;
  MultiheadAttentionOptions m_options;
  Dropout m_dropout;
};

struct TransformerLayerOptions {
  std::int64_t feedforward = 0;  // the hidden width of the feed-forward part; 0: 4 * width
  float dropout = 0.1f;          // after attention, inside and after the feed-forward part, in training
  bool causal = false;           // each position attends to itself and the ones before it only
  bool norm_first = true;        // pre-norm (GPT-2's); false: post-norm (the original, PyTorch's default)
  GeluApproximation activation = GeluApproximation::none;  // the feed-forward part's GELU
  float eps = 1e-5f;                                       // the layer norms'
  std::optional<std::uint64_t> seed;                       // the dropouts'
};

/// A transformer layer over batch-first x [N, T, width]: self-attention (MultiheadAttention)
/// and a feed-forward part (Dense, GELU, Dense applied at each position), each with a residual
/// connection and a LayerNorm, before it (norm_first) or after. PyTorch's
/// TransformerEncoderLayer with batch_first; with `causal` it is a decoder-only (GPT) block.
class TransformerEncoderLayer : public Module {
 public:
  XGRAD_API TransformerEncoderLayer(std::int64_t width, std::int64_t num_heads, TransformerLayerOptions options = {},
                                    SourceLoc loc = SourceLoc::current());

  XGRAD_API Tensor<float> forward(Tensor<float> x) override;

  /// forward over the newest positions x [N, T, width], attending over the cached ones as
  /// MultiheadAttention::forward_cached does: generation a token at a time.
  XGRAD_API Tensor<float> forward_cached(const Tensor<float>& x, KeyValueCache& cache,
                                         SourceLoc loc = SourceLoc::current());

  MultiheadAttention attention;
  LayerNorm norm1, norm2;  // before (norm_first) or after attention, and the feed-forward part
  Dense linear1, linear2;  // width -> feedforward -> width

 private:
  struct Checked {};  // options that checked_transformer has checked and completed
  XGRAD_API TransformerEncoderLayer(std::int64_t width, std::int64_t num_heads, TransformerLayerOptions options,
                                    SourceLoc loc, Checked);
  /// The layer with `attend` as its attention part.
  template <class Attend> Tensor<float> apply(const Tensor<float>& x, Attend attend);
  Tensor<float> feed_forward(const Tensor<float>& x);

  TransformerLayerOptions m_options;
  Dropout m_dropout_attention, m_dropout_hidden, m_dropout_output;
};

/// A recurrent layer's outputs: every step's hidden state [T, N, hidden], and the last hidden
/// (and, for an LSTM, cell) state [N, hidden].
struct RecurrentOutput {
  Tensor<float> output, hidden, cell;  // cell: an LSTM's only
};

/// One LSTM layer over sequence-first x [T, N, input] (PyTorch's nn.LSTM, one layer, gates
/// i, f, g, o): i, f, o = sigmoid(.), g = tanh(.) of W_ih x_t + b_ih + W_hh h + b_hh;
/// c' = f c + i g; h' = o tanh(c'). The input projections of every step are one matrix product
/// first; the steps run as xgrad::scan (one graph op under jit, its gradient one more).
/// Weights and biases U(-1/sqrt(hidden), 1/sqrt(hidden)), as PyTorch's.
class LSTM : public Module {
 public:
  XGRAD_API LSTM(std::int64_t input_size, std::int64_t hidden_size, SourceLoc loc = SourceLoc::current());

  /// Every step's hidden state [T, N, hidden], from zero states.
  XGRAD_API Tensor<float> forward(Tensor<float> x) override;
  /// From states h0 and c0 [N, hidden] (zeros where undefined), with the last states.
  XGRAD_API RecurrentOutput run(const Tensor<float>& x, Tensor<float> h0 = {}, Tensor<float> c0 = {},
                                SourceLoc loc = SourceLoc::current());

  Parameter<float> weight_ih, weight_hh, bias_ih, bias_hh;  // [4 hidden, input], [4 hidden, hidden], [4 hidden] x 2

 private:
  std::int64_t m_input, m_hidden;
};

/// One GRU layer over sequence-first x [T, N, input] (PyTorch's nn.GRU, gates r, z, n):
/// r, z = sigmoid(W_i. x_t + b_i. + W_h. h + b_h.), n = tanh(W_in x_t + b_in + r (W_hn h + b_hn)),
/// h' = (1 - z) n + z h; on xgrad::scan like LSTM, initialized as PyTorch's.
class GRU : public Module {
 public:
  XGRAD_API GRU(std::int64_t input_size, std::int64_t hidden_size, SourceLoc loc = SourceLoc::current());

  XGRAD_API Tensor<float> forward(Tensor<float> x) override;
  /// From state h0 [N, hidden] (zeros where undefined), with the last state.
  XGRAD_API RecurrentOutput run(const Tensor<float>& x, Tensor<float> h0 = {}, SourceLoc loc = SourceLoc::current());

  Parameter<float> weight_ih, weight_hh, bias_ih, bias_hh;  // [3 hidden, input], [3 hidden, hidden], [3 hidden] x 2

 private:
  std::int64_t m_input, m_hidden;
};

/// The sinusoidal position encodings of "Attention Is All You Need": [length, dim] with
/// sin(p / 10000^(2i / dim)) at column 2i of row p and the cosine at column 2i + 1.
XGRAD_API Tensor<float> sinusoidal_positions(std::int64_t length, std::int64_t dim,
                                             SourceLoc loc = SourceLoc::current());

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

  XGRAD_API void add(std::unique_ptr<Module> layer);

  std::size_t size() const { return m_layers.size(); }
  Module& operator[](std::size_t i) { return *m_layers.at(i); }

  XGRAD_API Tensor<float> forward(Tensor<float> x) override;

 private:
  std::vector<std::unique_ptr<Module>> m_layers;
};

}  // namespace xgrad::nn

#if !defined(XGRAD_COMPILED)
#include "xgrad/nn/layers-inl.hpp"
#endif
