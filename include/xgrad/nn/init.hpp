// Parameter initializers: normal, uniform, xavier_uniform, he_uniform, zeros, ones. Each is a
// value a layer calls with the parameter's shape and fans; the random ones take an explicit seed
// or draw the next one from a sequence that xg::init::set_seed restarts, so a whole network
// initializes the same way run after run.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "xgrad/core/error.hpp"
#include "xgrad/core/factory.hpp"
#include "xgrad/ops/elementwise.hpp"

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
inline std::atomic<std::uint64_t>& seed_sequence() {
  static std::atomic<std::uint64_t> next{0x5eed};
  return next;
}
}  // namespace detail

/// Restarts the seed sequence random initializers draw from when not given a seed.
inline void set_seed(std::uint64_t seed) { detail::seed_sequence() = seed; }

inline Tensor<float> Initializer::operator()(const Shape& shape, Fans fans) const {
  return make(shape, fans, detail::seed_sequence()++);
}

namespace detail {
/// An initializer that uses `fixed` as its seed when given, else the sequence's next.
template <class Make> Initializer seeded(std::string name, std::optional<std::uint64_t> fixed, Make make) {
  return {std::move(name), [fixed, make](const Shape& shape, Fans fans, std::uint64_t next) {
            return make(shape, fans, fixed.value_or(next));
          }};
}
inline void check_positive(const char* init, const char* what, double v, SourceLoc loc) {
  if (!(v > 0.0)) throw_value_error(init, loc, what, " must be > 0, got ", v);
}
}  // namespace detail

/// Samples from N(0, sigma^2) (MindSpore's Normal; its default sigma is 0.01).
inline Initializer normal(double sigma = 0.01, std::optional<std::uint64_t> seed = std::nullopt,
                          SourceLoc loc = SourceLoc::current()) {
  detail::check_positive("init::normal", "sigma", sigma, loc);
  return detail::seeded("normal", seed, [sigma](const Shape& shape, Fans, std::uint64_t s) {
    return randn<float>(shape, s) * static_cast<float>(sigma);
  });
}

/// Samples from U(-scale, scale).
inline Initializer uniform(double scale = 0.07, std::optional<std::uint64_t> seed = std::nullopt,
                           SourceLoc loc = SourceLoc::current()) {
  detail::check_positive("init::uniform", "scale", scale, loc);
  return detail::seeded("uniform", seed, [scale](const Shape& shape, Fans, std::uint64_t s) {
    return xgrad::uniform<float>(shape, static_cast<float>(-scale), static_cast<float>(scale), s);
  });
}

/// U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio).
inline Initializer xavier_uniform(double gain = 1.0, std::optional<std::uint64_t> seed = std::nullopt,
                                  SourceLoc loc = SourceLoc::current()) {
  detail::check_positive("init::xavier_uniform", "gain", gain, loc);
  return detail::seeded("xavier_uniform", seed, [gain](const Shape& shape, Fans fans, std::uint64_t s) {
    const auto a = static_cast<float>(gain * std::sqrt(6.0 / static_cast<double>(fans.in + fans.out)));
    return xgrad::uniform<float>(shape, -a, a, s);
  });
}

/// U(-a, a) with a = sqrt(6 / ((1 + negative_slope^2) * fan_in)) (He et al., for ReLU layers).
inline Initializer he_uniform(double negative_slope = 0.0, std::optional<std::uint64_t> seed = std::nullopt) {
  return detail::seeded("he_uniform", seed, [negative_slope](const Shape& shape, Fans fans, std::uint64_t s) {
    const double gain2 = 1.0 + negative_slope * negative_slope;
    const auto a = static_cast<float>(std::sqrt(6.0 / (gain2 * static_cast<double>(fans.in))));
    return xgrad::uniform<float>(shape, -a, a, s);
  });
}

inline Initializer zeros() {
  return {"zeros", [](const Shape& shape, Fans, std::uint64_t) { return xgrad::zeros<float>(shape); }};
}

inline Initializer ones() {
  return {"ones", [](const Shape& shape, Fans, std::uint64_t) { return xgrad::ones<float>(shape); }};
}

}  // namespace xgrad::init
