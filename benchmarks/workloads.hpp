// The suite's workloads as xgrad code (their shapes shared with the LibTorch rows: suite.hpp), shared by the suite rows
// (suite_xgrad.cpp) and the analysis rows (bench_in_cache.cpp). Shapes and names follow benchmarks/workloads.py, the
// table the Python peers and the report read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <xsimd/xsimd.hpp>

#include <xgrad/xgrad.hpp>

#include "suite.hpp"

namespace xgrad::bench {

// ---- the elementwise chain ----------------------------------------------------------------------
// y = tanh(1.5 x + 0.25) * sigmoid(x) + x * x: eagerly seven ops (Mul, Add, Tanh, Sigmoid, Mul,
// Mul, Add), seven passes over memory; fused, one.

inline Tensor<float> chain7(const Tensor<float>& x) { return tanh(x * 1.5f + 0.25f) * sigmoid(x) + x * x; }

/// The chain on one xsimd batch (the main loop) or one float (the tail: xsimd's scalar tanh and
/// exp are std's). Sigmoid is written as xgrad's op::Sigmoid computes it, 1 / (1 + exp(-x)).
template <class V> V chain7_body(const V& x) {
  const V sigmoid = V(1.0f) / (V(1.0f) + xsimd::exp(-x));
  return xsimd::tanh(x * V(1.5f) + V(0.25f)) * sigmoid + x * x;
}

/// The chain by hand: one pass over xsimd batches, one thread.
inline void chain7_hand(const float* x, float* y, std::int64_t n) {
  using B = xsimd::batch<float>;
  constexpr auto lanes = static_cast<std::int64_t>(B::size);
  std::int64_t i = 0;
  for (; i + lanes <= n; i += lanes) chain7_body(B::load_unaligned(x + i)).store_unaligned(y + i);
  for (; i < n; ++i) y[i] = chain7_body(x[i]);
}

// ---- the MLP train step -------------------------------------------------------------------------

struct MlpSize {
  std::vector<std::int64_t> widths;  // input, hidden layers..., classes
  std::int64_t batch;
  /// "784-256-256-10_b64"
  std::string name() const {
    std::string out;
    for (std::int64_t w : widths) {
      if (!out.empty()) out += '-';
      out += std::to_string(w);
    }
    return out + "_b" + std::to_string(batch);
  }
};

/// An MLP train step: relu hidden layers, softmax cross-entropy (sparse labels, mean),
/// value_and_grad over every weight and bias, momentum SGD (lr 0.01, momentum 0.9): the same
/// code runs eagerly and under jit. Hidden-layer weights N(0, 0.05²), the output layer's
/// N(0, 0.1²), biases zero, which keeps the weights far from denormals over millions of steps.
struct Mlp {
  std::vector<Parameter<float>> weights, biases;  // layer l: w<l+1> [widths[l], widths[l+1]], b<l+1>
  std::vector<Tensor<float>> velocity;            // one per params() entry
  Mlp(const MlpSize& s, std::uint64_t seed) {
    const std::size_t layers = s.widths.size() - 1;
    for (std::size_t l = 0; l < layers; ++l) {
      const float scale = l + 1 < layers ? 0.05f : 0.1f;
      const std::string n = std::to_string(l + 1);
      weights.emplace_back(randn<float>({s.widths[l], s.widths[l + 1]}, seed + l) * scale, "w" + n);
      biases.emplace_back(zeros<float>({s.widths[l + 1]}), "b" + n);
    }
    for (const auto& p : params()) velocity.push_back(zeros_like(p));
  }
  /// w1, b1, w2, b2, ...
  std::vector<Tensor<float>> params() const {
    std::vector<Tensor<float>> out;
    out.reserve(2 * weights.size());
    for (std::size_t l = 0; l < weights.size(); ++l) {
      out.push_back(weights[l]);
      out.push_back(biases[l]);
    }
    return out;
  }

  Tensor<float> step(const Tensor<float>& x, const Tensor<std::int32_t>& labels) {
    auto loss_fn = [&] {
      Tensor<float> h = x;
      for (std::size_t l = 0; l + 1 < weights.size(); ++l) h = relu(bias_add(matmul(h, weights[l]), biases[l]));
      return softmax_cross_entropy(bias_add(matmul(h, weights.back()), biases.back()), labels);
    };
    auto [loss, grads] = value_and_grad(loss_fn, params())();
    no_grad off;
    auto ps = params();
    for (std::size_t i = 0; i < ps.size(); ++i) {
      velocity[i].assign(velocity[i] * 0.9f + grads[i]);
      ps[i] -= velocity[i] * 0.01f;
    }
    return loss;
  }
};

/// An MLP's logits for a batch x [n, widths[0]], relu hidden layers, as a function of its
/// weights and biases (w1, b1, w2, b2, ..., as Mlp::params()): for the transforms, which take
/// them as arguments.
inline Tensor<float> mlp_logits(Tensor<float> h, const std::vector<Tensor<float>>& params) {
  const std::size_t last = params.size() - 2;
  for (std::size_t l = 0; l < last; l += 2) h = relu(bias_add(matmul(h, params[l]), params[l + 1]));
  return bias_add(matmul(h, params[last]), params[last + 1]);
}

/// Inputs N(0, 1), labels i * 7 mod classes.
struct MlpBatch {
  Tensor<float> x;
  Tensor<std::int32_t> labels;
  explicit MlpBatch(const MlpSize& s) : x(randn<float>({s.batch, s.widths.front()}, 42)) {
    const std::int64_t classes = s.widths.back();
    std::vector<std::int32_t> y(static_cast<std::size_t>(s.batch));
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int32_t>((i * 7) % classes);
    labels = tensor<std::int32_t>(y);
  }
};

// ---- the character-level transformer's train step ------------------------------------------------

/// The seq_step suite's model (workloads.py, CHAR_TRANSFORMER): vocabulary 114 (the fortunes' byte
/// vocabulary in examples/char_transformer.cpp), context 128, width 128, 4 heads, 4 layers, no
/// dropout; batches of 32 windows of 128 ids.
inline constexpr models::CharTransformerOptions kCharTransformer{
    .vocab = 114, .context = 128, .width = 128, .heads = 4, .layers = 4, .dropout = 0.0f};
inline constexpr std::int64_t kCharBatch = 32;

/// SplitMix64's output function: a well-mixed 64-bit hash of x.
inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// A fixed batch of ids [kCharBatch, context] in [0, vocab): id i (row-major) is
/// splitmix64((seed << 32) + i) mod vocab, as workloads.py's char_ids gives them to the peers.
inline Tensor<std::int32_t> char_ids(std::uint64_t seed) {
  const std::int64_t n = kCharBatch * kCharTransformer.context;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] =
        static_cast<std::int32_t>(splitmix64((seed << 32) + i) % static_cast<std::uint64_t>(kCharTransformer.vocab));
  return tensor<std::int32_t>(ids, {kCharBatch, kCharTransformer.context});
}

/// The char transformer's train step as examples/char_transformer.cpp's train() runs it, the same
/// code eagerly and under jit: value_and_grad of the mean cross-entropy over every parameter,
/// gradients clipped to global norm 1, AdamW (lr 3e-3, weight decay 0.01). Weights from
/// init::set_seed(seed).
struct CharTransformerStep {
  models::CharTransformer model;
  std::vector<Parameter<float>> params;
  optim::AdamW optimizer;

  explicit CharTransformerStep(std::uint64_t seed)
      : model((init::set_seed(seed), kCharTransformer)),
        params(model.parameters()),
        optimizer(params, 3e-3f, {.weight_decay = 0.01f}) {}

  Tensor<float> operator()(const Tensor<std::int32_t>& inputs, const Tensor<std::int32_t>& targets) {
    auto [loss, grads] = value_and_grad([&] { return model.loss(inputs, targets); }, params)();
    optimizer.step(optim::clip_by_global_norm(grads, 1.0f).grads);
    return loss;
  }
};

}  // namespace xgrad::bench
