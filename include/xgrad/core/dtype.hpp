// DType: the element types a Tensor may hold, and their names.
#pragma once

#include <concepts>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace xgrad {

enum class DType { float32, float64, int32, int64, boolean };

/// A type Tensor<T> may hold.
template <class T>
concept Element = std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, std::int32_t> ||
    std::same_as<T, std::int64_t> || std::same_as<T, bool>;

/// Element types that carry gradients.
template <class T>
concept FloatingPoint = std::same_as<T, float> || std::same_as<T, double>;

/// Element types with arithmetic (+ - * /).
template <class T>
concept Numeric = Element<T> && !std::same_as<T, bool>;

// The types of each concept above, for lists of explicit instantiations (core/config.hpp):
// XGRAD_FOR_EACH_Numeric(M, args...) is M(float, args...) M(double, args...) and so on.
#define XGRAD_FOR_EACH_FloatingPoint(M, ...) M(float, __VA_ARGS__) M(double, __VA_ARGS__)
#define XGRAD_FOR_EACH_Numeric(M, ...) \
  XGRAD_FOR_EACH_FloatingPoint(M, __VA_ARGS__) M(std::int32_t, __VA_ARGS__) M(std::int64_t, __VA_ARGS__)
#define XGRAD_FOR_EACH_Element(M, ...) XGRAD_FOR_EACH_Numeric(M, __VA_ARGS__) M(bool, __VA_ARGS__)

template <Element T> constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return DType::float32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::float64;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return DType::int32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return DType::int64;
  else
    return DType::boolean;
}

/// f.template operator()<T>() for d's element type T: code written once for every dtype of a
/// tensor known only at run time.
template <class F> decltype(auto) visit_element(DType d, F&& f) {
  switch (d) {
    case DType::float32:
      return f.template operator()<float>();
    case DType::float64:
      return f.template operator()<double>();
    case DType::int32:
      return f.template operator()<std::int32_t>();
    case DType::int64:
      return f.template operator()<std::int64_t>();
    case DType::boolean:
      break;
  }
  return f.template operator()<bool>();
}

/// MindSpore's spelling: Float32, Int32, Bool...
constexpr std::string_view dtype_name(DType d) {
  switch (d) {
    case DType::float32:
      return "Float32";
    case DType::float64:
      return "Float64";
    case DType::int32:
      return "Int32";
    case DType::int64:
      return "Int64";
    case DType::boolean:
      return "Bool";
  }
  return "?";
}

/// Short spelling for IR and error messages: f32, i64, bool...
constexpr std::string_view dtype_short_name(DType d) {
  switch (d) {
    case DType::float32:
      return "f32";
    case DType::float64:
      return "f64";
    case DType::int32:
      return "i32";
    case DType::int64:
      return "i64";
    case DType::boolean:
      return "bool";
  }
  return "?";
}

constexpr std::size_t dtype_size(DType d) {
  switch (d) {
    case DType::float32:
    case DType::int32:
      return 4;
    case DType::float64:
    case DType::int64:
      return 8;
    case DType::boolean:
      return sizeof(bool);
  }
  return 0;
}

}  // namespace xgrad
