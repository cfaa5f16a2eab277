// Factories: tensors from nested lists, vectors, constants, ranges and random numbers.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <type_traits>
#include <vector>

#include "xgrad/core/tensor.hpp"

namespace xgrad {

namespace detail {

/// Refuses a shape no tensor can have: a negative extent, or more elements than int64 counts.
inline void check_sizes(std::string_view op, const Shape& shape, SourceLoc loc) {
  for (int i = 0; i < shape.ndim(); ++i)
    if (shape[i] < 0)
      throw_value_error(op, loc, "size ", shape[i], " at axis ", i, " of shape ", shape, " must be non-negative");
  checked_numel(op, loc, shape);
}

template <class T, int Depth> struct Nested {
  using type = std::initializer_list<typename Nested<T, Depth - 1>::type>;
};
template <class T> struct Nested<T, 1> { using type = std::initializer_list<T>; };

// Walks a nested list once for the shape (from the first element at each level) and once
// for the values, checking every sub-list against that shape.
template <class T> void flatten_into(const std::initializer_list<T>& list, const Shape& shape, int axis,
                                     std::vector<T>& out, SourceLoc loc) {
  if (static_cast<std::int64_t>(list.size()) != shape[axis])
    throw_value_error("tensor", loc, "ragged nested list: axis ", axis, " has length ", list.size(),
                      " where an earlier sibling had ", shape[axis]);
  out.insert(out.end(), list.begin(), list.end());
}
template <class L, class T> void flatten_into(const std::initializer_list<L>& list, const Shape& shape, int axis,
                                              std::vector<T>& out, SourceLoc loc) {
  if (static_cast<std::int64_t>(list.size()) != shape[axis])
    throw_value_error("tensor", loc, "ragged nested list: axis ", axis, " has length ", list.size(),
                      " where an earlier sibling had ", shape[axis]);
  for (const auto& sub : list) flatten_into(sub, shape, axis + 1, out, loc);
}
/// Nesting depth of a list type: initializer_list<float> is 1, a float 0.
template <class L> constexpr int depth_of() {
  if constexpr (requires { typename L::value_type; })
    return 1 + depth_of<typename L::value_type>();
  else
    return 0;
}
template <class L> void shape_of(const std::initializer_list<L>& list, Shape& shape) {
  shape.push_back(static_cast<std::int64_t>(list.size()));
  if constexpr (depth_of<L>() > 0) {
    if (list.size())
      shape_of(*list.begin(), shape);
    else  // an empty outer list: inner axes have no element to measure, so they are 0
      for (int d = 0; d < depth_of<L>(); ++d) shape.push_back(0);
  }
}

/// `host` (filled on the cpu) on `device`.
template <class T> Tensor<T> moved_to(Tensor<T> host, Device device) {
  return device == Device::cpu ? host : copy_to(host, device);
}

/// A cpu tensor of `shape` with every element `value`.
template <class T> Tensor<T> host_full(const Shape& shape, T value) {
  auto out = Tensor<T>::empty(shape);
  std::fill_n(out.data(), shape.numel(), value);
  return out;
}

/// full(), zeros() and ones(), with errors naming `op`.
template <class T> Tensor<T> filled(std::string_view op, const Shape& shape, T value, SourceLoc loc) {
  check_sizes(op, shape, loc);
  return naming_allocations(op, loc, [&] { return moved_to(host_full(shape, value), default_device()); });
}

template <class T, class List> Tensor<T> from_nested(const List& list, SourceLoc loc) {
  Shape shape;
  shape_of(list, shape);
  std::vector<T> flat;
  flat.reserve(static_cast<std::size_t>(shape.numel()));
  flatten_into(list, shape, 0, flat, loc);
  return naming_allocations("tensor", loc, [&] {
    auto out = Tensor<T>::empty(shape);
    std::copy(flat.begin(), flat.end(), out.data());
    return moved_to(out, default_device());
  });
}

}  // namespace detail

/// A tensor from a nested list: tensor<float>({{1, 2}, {3, 4}}). Ragged lists throw ValueError.
template <Element T>
Tensor<T> tensor(typename detail::Nested<T, 1>::type values, SourceLoc loc = SourceLoc::current()) {
  return detail::from_nested<T>(values, loc);
}
template <Element T>
Tensor<T> tensor(typename detail::Nested<T, 2>::type values, SourceLoc loc = SourceLoc::current()) {
  return detail::from_nested<T>(values, loc);
}
template <Element T>
Tensor<T> tensor(typename detail::Nested<T, 3>::type values, SourceLoc loc = SourceLoc::current()) {
  return detail::from_nested<T>(values, loc);
}
template <Element T>
Tensor<T> tensor(typename detail::Nested<T, 4>::type values, SourceLoc loc = SourceLoc::current()) {
  return detail::from_nested<T>(values, loc);
}

/// A tensor from flat row-major data and a shape (1-D when the shape is omitted).
template <Element T>
Tensor<T> tensor(const std::vector<T>& values, const Shape& shape, SourceLoc loc = SourceLoc::current()) {
  detail::check_sizes("tensor", shape, loc);
  if (shape.numel() != static_cast<std::int64_t>(values.size()))
    throw_value_error("tensor", loc, "shape ", shape, " needs ", shape.numel(), " values, got ", values.size());
  return detail::naming_allocations("tensor", loc, [&] {
    auto out = Tensor<T>::empty(shape);
    std::copy(values.begin(), values.end(), out.data());
    return detail::moved_to(out, default_device());
  });
}
template <Element T> Tensor<T> tensor(const std::vector<T>& values, SourceLoc loc = SourceLoc::current()) {
  return tensor<T>(values, Shape{static_cast<std::int64_t>(values.size())}, loc);
}

/// A rank-0 tensor, on the cpu whatever the default device: a one-element cpu tensor goes with
/// tensors of any device.
template <Element T> Tensor<T> scalar(T value) {
  auto out = Tensor<T>::empty(Shape{});
  out.data()[0] = value;
  return out;
}

/// A tensor of the given shape with every element `value`.
template <Element T> Tensor<T> full(const Shape& shape, T value, SourceLoc loc = SourceLoc::current()) {
  return detail::filled("full", shape, value, loc);
}
template <Element T> Tensor<T> zeros(const Shape& shape, SourceLoc loc = SourceLoc::current()) {
  return detail::filled("zeros", shape, T(0), loc);
}
template <Element T> Tensor<T> ones(const Shape& shape, SourceLoc loc = SourceLoc::current()) {
  return detail::filled("ones", shape, T(1), loc);
}

/// Tensors of like's shape, on like's device.
template <Element T> Tensor<T> full_like(const Tensor<T>& like, T value, SourceLoc loc = SourceLoc::current()) {
  return detail::naming_allocations(
      "full_like", loc, [&] { return detail::moved_to(detail::host_full(like.shape(), value), like.device()); });
}
template <Element T> Tensor<T> zeros_like(const Tensor<T>& like, SourceLoc loc = SourceLoc::current()) {
  return full_like(like, T(0), loc);
}
template <Element T> Tensor<T> ones_like(const Tensor<T>& like, SourceLoc loc = SourceLoc::current()) {
  return full_like(like, T(1), loc);
}

/// [start, start + step, ...) below stop.
template <Numeric T> Tensor<T> arange(T start, T stop, T step = T(1), SourceLoc loc = SourceLoc::current()) {
  if (step == T(0)) throw_value_error("arange", loc, "step must not be 0");
  const double count = std::ceil((static_cast<double>(stop) - static_cast<double>(start)) / static_cast<double>(step));
  // Compared as doubles: a count that is NaN or beyond int64 would make the cast undefined.
  if (!(count <= static_cast<double>(std::int64_t{1} << 62)))
    throw_value_error("arange", loc, "start ", start, ", stop ", stop, " and step ", step, " give ", count,
                      " elements: the count must be finite and at most 2^62");
  const auto n = static_cast<std::int64_t>(std::max(0.0, count));
  return detail::naming_allocations("arange", loc, [&] {
    auto out = Tensor<T>::empty(Shape{n});
    for (std::int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_integral_v<T>)  // wraps modulo 2^64, exact since each value lies in [start, stop)
        out.data()[i] = static_cast<T>(static_cast<std::uint64_t>(start) +
                                       static_cast<std::uint64_t>(i) * static_cast<std::uint64_t>(step));
      else
        out.data()[i] = static_cast<T>(start + static_cast<T>(i) * step);
    }
    return detail::moved_to(out, default_device());
  });
}
/// [0, 1, ..., n - 1].
template <Numeric T> Tensor<T> arange(std::int64_t n, SourceLoc loc = SourceLoc::current()) {
  if (n < 0) throw_value_error("arange", loc, "n must be non-negative, got ", n);
  return arange<T>(T(0), static_cast<T>(n), T(1), loc);
}

/// The n x n identity.
template <Numeric T> Tensor<T> eye(std::int64_t n, SourceLoc loc = SourceLoc::current()) {
  detail::check_sizes("eye", Shape{n, n}, loc);
  return detail::naming_allocations("eye", loc, [&] {
    auto out = detail::host_full(Shape{n, n}, T(0));
    for (std::int64_t i = 0; i < n; ++i) out.data()[i * n + i] = T(1);
    return detail::moved_to(out, default_device());
  });
}

/// Standard normal samples from a seeded generator (same seed, same tensor).
template <FloatingPoint T>
Tensor<T> randn(const Shape& shape, std::uint64_t seed = 0, SourceLoc loc = SourceLoc::current()) {
  detail::check_sizes("randn", shape, loc);
  return detail::naming_allocations("randn", loc, [&] {
    std::mt19937_64 gen(seed);
    std::normal_distribution<T> dist(T(0), T(1));
    auto out = Tensor<T>::empty(shape);
    std::generate_n(out.data(), shape.numel(), [&] { return dist(gen); });
    return detail::moved_to(out, default_device());
  });
}

/// Uniform samples in [lo, hi) from a seeded generator.
template <FloatingPoint T>
Tensor<T> uniform(const Shape& shape, T lo, T hi, std::uint64_t seed = 0, SourceLoc loc = SourceLoc::current()) {
  detail::check_sizes("uniform", shape, loc);
  if (!(lo < hi)) throw_value_error("uniform", loc, "lo (", lo, ") must be below hi (", hi, ")");
  if (!std::isfinite(hi - lo))
    throw_value_error("uniform", loc, "lo (", lo, ") and hi (", hi, ") must be finite and hi - lo must be too");
  return detail::naming_allocations("uniform", loc, [&] {
    std::mt19937_64 gen(seed);
    std::uniform_real_distribution<T> dist(lo, hi);
    auto out = Tensor<T>::empty(shape);
    std::generate_n(out.data(), shape.numel(), [&] { return dist(gen); });
    return detail::moved_to(out, default_device());
  });
}

// The instances xgrad::compiled holds (core/config.hpp).
#define XGRAD_FACTORY_ELEMENT_INSTANCE(T, X)                             \
  X Tensor<T> tensor<T>(const std::vector<T>&, const Shape&, SourceLoc); \
  X Tensor<T> tensor<T>(const std::vector<T>&, SourceLoc);               \
  X Tensor<T> full<T>(const Shape&, T, SourceLoc);                       \
  X Tensor<T> zeros<T>(const Shape&, SourceLoc);                         \
  X Tensor<T> ones<T>(const Shape&, SourceLoc);                          \
  X Tensor<T> full_like<T>(const Tensor<T>&, T, SourceLoc);              \
  X Tensor<T> zeros_like<T>(const Tensor<T>&, SourceLoc);                \
  X Tensor<T> ones_like<T>(const Tensor<T>&, SourceLoc);
#define XGRAD_FACTORY_NUMERIC_INSTANCE(T, X)      \
  X Tensor<T> arange<T>(T, T, T, SourceLoc);      \
  X Tensor<T> arange<T>(std::int64_t, SourceLoc); \
  X Tensor<T> eye<T>(std::int64_t, SourceLoc);
#define XGRAD_FACTORY_FLOAT_INSTANCE(T, X)                      \
  X Tensor<T> randn<T>(const Shape&, std::uint64_t, SourceLoc); \
  X Tensor<T> uniform<T>(const Shape&, T, T, std::uint64_t, SourceLoc);
#define XGRAD_FACTORY_INSTANCES(X)                                                                                    \
  XGRAD_FOR_EACH_Element(XGRAD_FACTORY_ELEMENT_INSTANCE, X) XGRAD_FOR_EACH_Numeric(XGRAD_FACTORY_NUMERIC_INSTANCE, X) \
      XGRAD_FOR_EACH_FloatingPoint(XGRAD_FACTORY_FLOAT_INSTANCE, X)
#if defined(XGRAD_COMPILED) && !defined(XGRAD_INSTANTIATE_FACTORY)
XGRAD_FACTORY_INSTANCES(extern template)
#endif

}  // namespace xgrad
