// A small decoder-only (GPT-style) character language model: token and learned position
// embeddings, causal pre-norm TransformerEncoderLayers, a final LayerNorm and a linear head.
// examples/char_transformer.cpp trains it on Debian's fortunes; the benchmark suite times its
// train step.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "xgrad/core/config.hpp"
#include "xgrad/nn/layers.hpp"

namespace xgrad::models {

struct CharTransformerOptions {
  std::int64_t vocab = 128;    // token ids in [0, vocab)
  std::int64_t context = 128;  // the longest sequence, and the learned positions
  std::int64_t width = 128;
  std::int64_t heads = 4;
  std::int64_t layers = 4;
  float dropout = 0.0f;  // in every block
};

/// GPT-2's layout at a small size: embeddings N(0, 0.02^2), causal pre-norm blocks with GELU
/// feed-forward parts of 4 x width, a final LayerNorm and a linear head of vocab outputs.
class CharTransformer : public nn::Module {
 public:
  XGRAD_API explicit CharTransformer(CharTransformerOptions options, SourceLoc loc = SourceLoc::current());

  /// Logits [N * T, vocab] for ids [N, T] at positions first, first + 1, ...: each position
  /// attends over itself and the ones before it. With `caches` (one per block, see
  /// nn::KeyValueCache) it attends over the positions they hold too, and they then hold these.
  XGRAD_API Tensor<float> logits(const Tensor<std::int32_t>& ids, std::int32_t first = 0,
                                 std::vector<nn::KeyValueCache>* caches = nullptr,
                                 SourceLoc loc = SourceLoc::current());

  /// The mean cross-entropy, in nats, of each position's logits against targets [N, T] (the
  /// character after it).
  XGRAD_API Tensor<float> loss(const Tensor<std::int32_t>& inputs, const Tensor<std::int32_t>& targets,
                               SourceLoc loc = SourceLoc::current());

  const CharTransformerOptions& options() const { return m_options; }

  nn::Embedding tokens, positions;
  std::vector<std::unique_ptr<nn::TransformerEncoderLayer>> blocks;
  nn::LayerNorm norm;
  nn::Dense head;

 private:
  CharTransformerOptions m_options;
};

}  // namespace xgrad::models

#if !defined(XGRAD_COMPILED)
#include "xgrad/models/char_transformer-inl.hpp"
#endif
