// What examples/lenet5_fashion_mnist.cpp and benchmarks/lenet5_torch_accuracy.cpp share: the
// seed notebook's preprocessing of Fashion-MNIST, and the examples' flag parser (flags.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <xgrad/data/mnist.hpp>

#include "flags.hpp"

namespace xgrad::examples {

/// The notebook's preprocessing: shuffled (seed + epoch), 28x28 -> 32x32, scaled to [0, 1],
/// normalized with MNIST's mean and deviation, channels first, batches of `batch`. With
/// shard_count > 1, shard shard_index of the shuffled samples (a rank's part in data-parallel
/// training).
inline data::Dataset fashion_mnist(const std::string& dir, data::Split split, std::int64_t batch, std::uint64_t seed,
                                   std::int64_t shard_index = 0, std::int64_t shard_count = 1) {
  return data::MnistDataset(dir, split)
      .shuffle(seed)
      .shard(shard_index, shard_count)
      .map(data::Resize(32), data::Rescale(1.0 / 255.0), data::Normalize(0.1307, 0.3081), data::HWC2CHW())
      .batch(batch, /*drop_remainder=*/true);
}

}  // namespace xgrad::examples
