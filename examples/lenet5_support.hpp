// What examples/lenet5_fashion_mnist.cpp and benchmarks/lenet5_torch_accuracy.cpp share: the
// seed notebook's preprocessing of Fashion-MNIST, and a parser of "--flag value" arguments.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <iostream>
#include <string>
#include <string_view>
#include <xgrad/data/mnist.hpp>

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

/// "--flag value" pairs; a bad one prints the problem and the usage line and exits with 2.
class Flags {
 public:
  Flags(std::string program, std::string usage) : m_program(std::move(program)), m_usage(std::move(usage)) {}

  [[noreturn]] void fail(const std::string& problem) const {
    std::cerr << m_program << ": " << problem << "\nusage: " << m_program << " " << m_usage << "\n";
    std::exit(2);
  }

  long positive(const std::string& flag, const std::string& text) const {
    char* end = nullptr;
    const long v = std::strtol(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || v <= 0) fail(flag + " takes a positive integer, got '" + text + "'");
    return v;
  }

  /// Calls handle(flag, value) for each pair, and handle(flag, "") for a flag of `switches`
  /// (which takes no value); handle returns false for a flag it does not know.
  template <class Handle>
  void parse(int argc, char** argv, Handle handle, std::initializer_list<std::string_view> switches = {}) const {
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      if (std::find(switches.begin(), switches.end(), flag) != switches.end()) {
        if (!handle(flag, "")) fail("unknown flag " + flag);
        continue;
      }
      if (i + 1 >= argc) fail(flag == "--help" ? "" : "missing the value of " + flag);
      const std::string value = argv[++i];
      if (!handle(flag, value)) fail("unknown flag " + flag);
    }
  }

 private:
  std::string m_program, m_usage;
};

}  // namespace xgrad::examples
