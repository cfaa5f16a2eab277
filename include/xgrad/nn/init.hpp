// Parameter initializers: normal, uniform, xavier_uniform, he_uniform, zeros, ones. Each is a
// value a layer calls with the parameter's shape and fans; the random ones take an explicit seed
// or draw the next one from a sequence that xg::init::set_seed restarts, so a whole network
// initializes the same way run after run.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "xgrad/core/config.hpp"
#include "xgrad/core/tensor.hpp"

namespace xgrad::init {

/// What an initializer knows about the tensor it fills.
struct Fans {
  std::int64_t in = 1;   // inputs feeding one output: C_in * KH * KW for a conv, in_features for a dense
  std::int64_t out = 1;  // outputs one input feeds: C_out * KH * KW, out_features
};

/// Makes the initial value of a parameter of `shape`.
struct Initializer {
  std::string name;
  std::function<Tensor<float>(const Shape& shape, Fans fans, std::uint64_t seed)> make;

  Tensor<float> operator()(const Shape& shape, Fans fans) const;
};

namespace detail {
XGRAD_API std::atomic<std::uint64_t>& seed_sequence();
}  // namespace detail

/// Restarts the seed sequence random initializers draw from when not given a seed.
inline void set_seed(std::uint64_t seed) { detail::seed_sequence() = seed; }

inline Tensor<float> Initializer::operator()(const Shape& shape, Fans fans) const {
  return make(shape, fans, detail::seed_sequence()++);
}

/// Samples from N(0, sigma^2) (MindSpore's Normal; its default sigma is 0.01).
XGRAD_API Initializer normal(double sigma = 0.01, std::optional<std::uint64_t> seed = std::nullopt,
                             SourceLoc loc = SourceLoc::current());

/// Samples from U(-scale, scale).
XGRAD_API Initializer uniform(double scale = 0.07, std::optional<std::uint64_t> seed = std::nullopt,
                              SourceLoc loc = SourceLoc::current());

/// U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio).
XGRAD_API Initializer xavier_uniform(double gain = 1.0, std::optional<std::uint64_t> seed = std::nullopt,
                                     SourceLoc loc = SourceLoc::current());

/// U(-a, a) with a = sqrt(6 / ((1 + negative_slope^2) * fan_in)) (He et al., for ReLU layers).
XGRAD_API Initializer he_uniform(double negative_slope = 0.0, std::optional<std::uint64_t> seed = std::nullopt);

XGRAD_API Initializer zeros();

XGRAD_API Initializer ones();

}  // namespace xgrad::init

#if !defined(XGRAD_COMPILED)
#include "xgrad/nn/init-inl.hpp"
#endif
