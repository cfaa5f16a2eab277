// Drawing tokens from a language model's logits: temperature and top-k sampling.
#pragma once

#include <cstdint>
#include <random>

#include "xgrad/core/config.hpp"
#include "xgrad/core/source_loc.hpp"
#include "xgrad/core/tensor.hpp"

namespace xgrad::nn {

struct SamplingOptions {
  float temperature = 1.0f;  // divides the logits; 0 takes the most likely token
  std::int64_t top_k = 0;    // draw among the k most likely tokens only; 0: among all
};

/// One token id per row of logits [N, vocab]: drawn from softmax(logits / temperature) over the
/// row's top_k largest logits (ties kept in id order), with `generator` (the same draws for the
/// same seed on every platform). Runs on the host, eagerly. A temperature below 0 or NaN, a
/// negative top_k, logits that are not [N, vocab] with vocab > 0, or a NaN among a row's
/// candidates throw ValueError.
XGRAD_API Tensor<std::int32_t> sample(const Tensor<float>& logits, SamplingOptions options, std::mt19937_64& generator,
                                      SourceLoc loc = SourceLoc::current());

}  // namespace xgrad::nn

#if !defined(XGRAD_COMPILED)
#include "xgrad/nn/sampling-inl.hpp"
#endif
