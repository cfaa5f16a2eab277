// Definitions of nn/sampling.hpp: included by it when header-only, compiled once into the library
// (src/nn.cpp) otherwise.
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "xgrad/core/error.hpp"
#include "xgrad/core/factory.hpp"
#include "xgrad/nn/sampling.hpp"

namespace xgrad::nn {

XGRAD_API Tensor<std::int32_t> sample(const Tensor<float>& logits, SamplingOptions options, std::mt19937_64& generator,
                                      SourceLoc loc) {
  if (logits.ndim() != 2 || logits.shape()[1] < 1)
    throw_value_error("sample", loc, "logits must be [N, vocab] with vocab > 0, got ", logits.shape());
  if (!(options.temperature >= 0.0f))
    throw_value_error("sample", loc, "temperature must be >= 0, got ", options.temperature);
  if (options.top_k < 0) throw_value_error("sample", loc, "top_k must be >= 0 (0: every token), got ", options.top_k);
  const std::int64_t rows = logits.shape()[0], vocab = logits.shape()[1];
  if (rows == 0) return zeros<std::int32_t>({0});  // vocab may be huge then
  const auto k = static_cast<std::size_t>(options.top_k == 0 ? vocab : std::min(options.top_k, vocab));
  const std::vector<float> values = logits.to_vector();
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows));
  std::vector<std::int32_t> order(static_cast<std::size_t>(vocab));
  std::vector<double> weights(k);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = values.data() + r * vocab;
    std::iota(order.begin(), order.end(), 0);
    // The k largest first, larger before smaller and ties in id order.
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                      [row](std::int32_t a, std::int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    for (std::size_t i = 0; i < k; ++i)
      if (std::isnan(row[order[i]]))
        throw_value_error("sample", loc, "row ", r, " has a NaN logit (token ", order[i], ")");
    if (options.temperature == 0.0f) {
      ids[static_cast<std::size_t>(r)] = order[0];
      continue;
    }
    // exp((x - max) / temperature): the largest weighs 1, none overflows.
    const double top = row[order[0]];
    double total = 0;
    for (std::size_t i = 0; i < k; ++i) total += weights[i] = std::exp((row[order[i]] - top) / options.temperature);
    // A uniform draw in [0, total) from the generator's top 53 bits (the standard fixes
    // mt19937_64's output, not its distributions'), then the first weight to pass it.
    const double u = static_cast<double>(generator() >> 11) * 0x1.0p-53 * total;
    std::size_t pick = 0;
    double sum = weights[0];
    while (pick + 1 < k && sum <= u) sum += weights[++pick];
    ids[static_cast<std::size_t>(r)] = order[pick];
  }
  return tensor<std::int32_t>(ids, {rows});
}

}  // namespace xgrad::nn
