// Definitions of ops/random.hpp: included by it when header-only, compiled once into the
// library (src/ops_shape.cpp) otherwise.
#pragma once

#include <cstdint>
#include <limits>
#include <span>

#include "xgrad/backend/kernels.hpp"
#include "xgrad/core/factory.hpp"
#include "xgrad/ops/dispatch.hpp"
#include "xgrad/ops/random.hpp"

namespace xgrad {

namespace detail {
/// splitmix64's finalizer: a bijection that mixes every input bit into every output bit.
XGRAD_HD inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// Element i of the samples of one key: the top `digits` bits of a mixed counter, scaled.
template <class T> struct UniformSample {
  std::uint64_t stream;  // the mixed key
  XGRAD_HD T operator()(std::int64_t i) const {
    constexpr int bits = std::numeric_limits<T>::digits;  // 24 for float, 53 for double
    constexpr T unit = T(1) / static_cast<T>(std::uint64_t{1} << bits);
    return static_cast<T>(mix64(stream + static_cast<std::uint64_t>(i) * 0x9e3779b97f4a7c15ULL) >> (64 - bits)) * unit;
  }
};
}  // namespace detail

namespace op {
/// Samples of U[0, 1) determined by the int64 scalar key alone.
struct RandomUniform {
  static constexpr std::string_view name = "RandomUniform";
  Device device = Device::cpu;  // where the samples are made when the key is a cpu scalar
  Shape shape;
  bool operator==(const RandomUniform&) const = default;
  Shape output_shape() const { return shape; }
  Device output_device(Device key) const { return key == Device::cpu ? device : key; }
  template <class T> void run(Device d, const Tensor<std::int64_t>& key, Tensor<T>& out) const {
    const detail::UniformSample<T> sample{detail::mix64(static_cast<std::uint64_t>(key.item()))};
    kernels::tabulate(d, out.data(), out.numel(), sample);
  }
};
}  // namespace op

template <FloatingPoint T>
Tensor<T> random_uniform(const Tensor<std::int64_t>& key, const Shape& shape, SourceLoc loc) {
  detail::OpScope scope(op::RandomUniform::name, loc, {key});
  if (key.numel() != 1)
    throw_shape_error(op::RandomUniform::name, loc, "key must hold one value, got shape ", key.shape());
  detail::check_sizes(op::RandomUniform::name, shape, loc);
  const Device device = key.is_symbolic() || key.device() == Device::cpu ? default_device() : key.device();
  detail::check_available(device, op::RandomUniform::name);
  return detail::apply<T>(op::RandomUniform{device, shape}, loc, key);
}

}  // namespace xgrad
