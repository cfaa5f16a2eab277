// Printing tensors in MindSpore's style: Tensor(shape=[2, 3], dtype=Float32, value=...).
#pragma once

#include <iomanip>
#include <ostream>
#include <sstream>
#include <string>

#include "xgrad/core/tensor.hpp"

namespace xgrad {

namespace detail {

/// Past this many elements only the first and last few of each axis are shown, as NumPy does.
inline constexpr std::int64_t kPrintThreshold = 1000;
inline constexpr std::int64_t kPrintEdgeItems = 3;

template <class T> void print_value(std::ostream& out, T v) {
  if constexpr (std::is_same_v<T, bool>)
    out << (v ? "True" : "False");
  else if constexpr (std::is_floating_point_v<T>)
    out << std::setprecision(std::is_same_v<T, float> ? 6 : 10) << v;
  else
    out << v;
}

template <class T> void print_axis(std::ostream& out, const T* data, const Shape& shape, int axis, std::int64_t offset,
                                   bool summarize, int indent) {
  const std::int64_t n = shape[axis];
  const std::int64_t stride = Shape(shape.begin() + axis + 1, shape.end()).numel();
  out << '[';
  for (std::int64_t i = 0; i < n; ++i) {
    if (summarize && n > 2 * kPrintEdgeItems && i == kPrintEdgeItems) {
      out << "...";
      i = n - kPrintEdgeItems - 1;
    } else if (axis + 1 == shape.ndim()) {
      print_value(out, data[offset + i]);
    } else {
      print_axis(out, data, shape, axis + 1, offset + i * stride, summarize, indent + 1);
    }
    if (i + 1 < n) {
      out << ',';
      if (axis + 1 == shape.ndim())
        out << ' ';
      else
        out << std::string(static_cast<std::size_t>(shape.ndim() - axis - 1), '\n')
            << std::string(static_cast<std::size_t>(indent + 1), ' ');
    }
  }
  out << ']';
}

}  // namespace detail

/// The values alone, NumPy-like: [[1, 2], [3, 4]] with one row per line.
template <Element T> std::string format_values(const Tensor<T>& tensor) {
  const Tensor<T> t = tensor.device() == Device::cpu ? tensor : detail::copy_to(tensor, Device::cpu);
  std::ostringstream out;
  if (t.ndim() == 0)
    detail::print_value(out, t.data()[0]);
  else if (t.numel() == 0)  // as NumPy: no nested brackets, which for [2^40, 0] would never end
    out << "[]";
  else
    detail::print_axis(out, t.data(), t.shape(), 0, 0, t.numel() > detail::kPrintThreshold, 0);
  return out.str();
}

/// Tensor(shape=[2, 3], dtype=Float32, value=\n[[...]]), as MindSpore prints.
template <Element T> std::ostream& operator<<(std::ostream& out, const Tensor<T>& t) {
  if (!t.defined()) return out << "Tensor(undefined)";
  out << "Tensor(shape=" << t.shape() << ", dtype=" << dtype_name(t.dtype()) << ", value=";
  if (t.ndim() > 1) out << '\n';
  return out << format_values(t) << ')';
}

}  // namespace xgrad
