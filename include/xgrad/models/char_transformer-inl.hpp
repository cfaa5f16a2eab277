// Definitions of models/char_transformer.hpp: included by it when header-only, compiled once into
// the library (src/models.cpp) otherwise.
#pragma once

#include <string>

#include "xgrad/core/factory.hpp"
#include "xgrad/models/char_transformer.hpp"
#include "xgrad/nn/loss.hpp"
#include "xgrad/ops/manipulation.hpp"
#include "xgrad/ops/nn.hpp"

namespace xgrad::models {

XGRAD_API CharTransformer::CharTransformer(CharTransformerOptions options, SourceLoc loc)
    : tokens(options.vocab, options.width, {.weight_init = init::normal(0.02)}, loc),
      positions(options.context, options.width, {.weight_init = init::normal(0.02)}, loc),
      norm(options.width, {}, loc),
      head(options.width, options.vocab, {}, loc),
      m_options(options) {
  if (options.layers < 0) throw_value_error("CharTransformer", loc, "layers must be >= 0, got ", options.layers);
  register_modules({{"tokens", &tokens}, {"positions", &positions}});
  for (std::int64_t l = 0; l < options.layers; ++l) {
    blocks.push_back(std::make_unique<nn::TransformerEncoderLayer>(
        options.width, options.heads,
        nn::TransformerLayerOptions{.dropout = options.dropout, .causal = true, .norm_first = true, .seed = {}}, loc));
    register_module("block" + std::to_string(l), *blocks.back());
  }
  register_modules({{"norm", &norm}, {"head", &head}});
}

XGRAD_API Tensor<float> CharTransformer::logits(const Tensor<std::int32_t>& ids, std::int32_t first,
                                                std::vector<nn::KeyValueCache>* caches, SourceLoc loc) {
  xgrad::detail::OpScope scope("CharTransformer", loc, {ids});
  if (ids.ndim() != 2 || first < 0 || first + ids.shape()[1] > m_options.context)
    throw_shape_error("CharTransformer", loc, "ids must be [N, T] at positions first (", first,
                      ") to first + T <= ", m_options.context, " (the context), got ", ids.shape());
  if (caches && caches->size() != blocks.size())
    throw_value_error("CharTransformer", loc, "caches must hold one KeyValueCache per block (", blocks.size(),
                      "), got ", caches->size());
  const std::int64_t n = ids.shape()[0], t = ids.shape()[1];
  Tensor<float> x =
      tokens(ids, loc) + positions(arange<std::int32_t>(first, first + static_cast<std::int32_t>(t)), loc);
  for (std::size_t l = 0; l < blocks.size(); ++l)
    x = caches ? blocks[l]->forward_cached(x, (*caches)[l], loc) : (*blocks[l])(x, loc);
  return head(reshape(norm(x, loc), {n * t, m_options.width}), loc);
}

XGRAD_API Tensor<float> CharTransformer::loss(const Tensor<std::int32_t>& inputs, const Tensor<std::int32_t>& targets,
                                              SourceLoc loc) {
  if (targets.shape() != inputs.shape())
    throw_shape_error("CharTransformer", loc, "targets ", targets.shape(), " must have the inputs' shape ",
                      inputs.shape());
  return softmax_cross_entropy(logits(inputs, 0, nullptr, loc), reshape(targets, {targets.numel()}));
}

}  // namespace xgrad::models
