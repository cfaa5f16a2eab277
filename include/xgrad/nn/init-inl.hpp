// Definitions of nn/init.hpp: included by it when header-only, compiled once into the library
// (src/nn.cpp) otherwise.
#pragma once

#include <cmath>
#include <utility>

#include "xgrad/core/error.hpp"
#include "xgrad/core/factory.hpp"
#include "xgrad/nn/init.hpp"
#include "xgrad/ops/elementwise.hpp"

namespace xgrad::init {

namespace detail {
XGRAD_API std::atomic<std::uint64_t>& seed_sequence() {
  static std::atomic<std::uint64_t> next{0x5eed};
  return next;
}

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

XGRAD_API Initializer normal(double sigma, std::optional<std::uint64_t> seed, SourceLoc loc) {
  detail::check_positive("init::normal", "sigma", sigma, loc);
  return detail::seeded("normal", seed, [sigma](const Shape& shape, Fans, std::uint64_t s) {
    return randn<float>(shape, s) * static_cast<float>(sigma);
  });
}

XGRAD_API Initializer uniform(double scale, std::optional<std::uint64_t> seed, SourceLoc loc) {
  detail::check_positive("init::uniform", "scale", scale, loc);
  return detail::seeded("uniform", seed, [scale](const Shape& shape, Fans, std::uint64_t s) {
    return xgrad::uniform<float>(shape, static_cast<float>(-scale), static_cast<float>(scale), s);
  });
}

XGRAD_API Initializer xavier_uniform(double gain, std::optional<std::uint64_t> seed, SourceLoc loc) {
  detail::check_positive("init::xavier_uniform", "gain", gain, loc);
  return detail::seeded("xavier_uniform", seed, [gain](const Shape& shape, Fans fans, std::uint64_t s) {
    const auto a = static_cast<float>(gain * std::sqrt(6.0 / static_cast<double>(fans.in + fans.out)));
    return xgrad::uniform<float>(shape, -a, a, s);
  });
}

XGRAD_API Initializer he_uniform(double negative_slope, std::optional<std::uint64_t> seed) {
  return detail::seeded("he_uniform", seed, [negative_slope](const Shape& shape, Fans fans, std::uint64_t s) {
    const double gain2 = 1.0 + negative_slope * negative_slope;
    const auto a = static_cast<float>(std::sqrt(6.0 / (gain2 * static_cast<double>(fans.in))));
    return xgrad::uniform<float>(shape, -a, a, s);
  });
}

XGRAD_API Initializer zeros() {
  return {"zeros", [](const Shape& shape, Fans, std::uint64_t) { return xgrad::zeros<float>(shape); }};
}

XGRAD_API Initializer ones() {
  return {"ones", [](const Shape& shape, Fans, std::uint64_t) { return xgrad::ones<float>(shape); }};
}

}  // namespace xgrad::init
