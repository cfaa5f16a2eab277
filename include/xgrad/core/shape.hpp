// Shape: a tensor's extents, stored inline (no allocation), with NumPy broadcasting rules.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "xgrad/core/config.hpp"
#include "xgrad/core/device.hpp"
#include "xgrad/core/error.hpp"

namespace xgrad {

/// Tensors have at most this many axes; keeping extents inline makes op dispatch cheap.
inline constexpr int kMaxRank = 8;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims) { assign(dims.begin(), dims.end()); }
  Shape(const std::vector<std::int64_t>& dims) { assign(dims.begin(), dims.end()); }
  template <class It> Shape(It first, It last) { assign(first, last); }

  XGRAD_HD int ndim() const { return m_rank; }
  XGRAD_HD std::int64_t operator[](int axis) const { return m_dims[axis]; }
  std::int64_t& operator[](int axis) { return m_dims[axis]; }
  const std::int64_t* begin() const { return m_dims.data(); }
  const std::int64_t* end() const { return m_dims.data() + m_rank; }
  std::int64_t* begin() { return m_dims.data(); }
  std::int64_t* end() { return m_dims.data() + m_rank; }
  std::int64_t back() const { return m_dims[m_rank - 1]; }

  /// The element count. Throws ValueError for a negative extent, or when the product of the
  /// non-zero extents does not fit in int64: then strides() cannot overflow either, whatever
  /// axis is 0.
  std::int64_t numel() const {
    std::int64_t n = 1;
    bool empty = false;
    for (int i = 0; i < m_rank; ++i) {
      const std::int64_t d = m_dims[i];
      if (d < 0) throw ValueError(detail::concat("Shape ", str(), ": extent ", d, " at axis ", i, " is negative"));
      if (d == 0)
        empty = true;
      else if (n > kMaxCount / d)
        throw ValueError(detail::concat("Shape ", str(), ": the product of its extents exceeds ", kMaxCount,
                                        ", the most elements an int64 counts"));
      else
        n *= d;
    }
    return empty ? 0 : n;
  }
  static constexpr std::int64_t kMaxCount = std::numeric_limits<std::int64_t>::max();

  void push_back(std::int64_t d) {
    check_rank(m_rank + 1);
    m_dims[m_rank++] = d;
  }

  std::vector<std::int64_t> to_vector() const { return {begin(), end()}; }
  operator std::vector<std::int64_t>() const { return to_vector(); }

  /// Row-major strides in elements.
  std::array<std::int64_t, kMaxRank> strides() const {
    std::array<std::int64_t, kMaxRank> s{};
    std::int64_t step = 1;
    for (int i = m_rank - 1; i >= 0; --i) {
      s[i] = step;
      step *= m_dims[i];
    }
    return s;
  }

  friend bool operator==(const Shape& a, const Shape& b) {
    return a.m_rank == b.m_rank && std::equal(a.begin(), a.end(), b.begin());
  }
  friend bool operator==(const Shape& a, const std::vector<std::int64_t>& b) {
    return a.m_rank == static_cast<int>(b.size()) && std::equal(a.begin(), a.end(), b.begin());
  }

  /// "[2, 3]"
  XGRAD_API std::string str() const;
  friend std::ostream& operator<<(std::ostream& out, const Shape& s) { return out << s.str(); }

 private:
  static void check_rank(std::size_t rank) {
    if (rank > static_cast<std::size_t>(kMaxRank))
      throw ValueError(detail::concat("Shape: rank ", rank, " exceeds the maximum of ", kMaxRank));
  }
  template <class It> void assign(It first, It last) {
    check_rank(static_cast<std::size_t>(std::distance(first, last)));
    m_rank = 0;
    for (; first != last; ++first) m_dims[m_rank++] = static_cast<std::int64_t>(*first);
  }

  std::array<std::int64_t, kMaxRank> m_dims{};
  int m_rank = 0;
};

namespace detail {

/// a + b for sizes (non-negative), or a ValueError naming `op`, what is added and the numbers.
inline std::int64_t checked_add(std::string_view op, SourceLoc loc, std::string_view what, std::int64_t a,
                                std::int64_t b) {
  if (a < 0 || b < 0 || a > Shape::kMaxCount - b)
    throw_value_error(op, loc, what, " = ", a, " + ", b, " is negative or exceeds ", Shape::kMaxCount);
  return a + b;
}

/// a * b for sizes (non-negative), or a ValueError naming `op`, what is multiplied and the numbers.
inline std::int64_t checked_mul(std::string_view op, SourceLoc loc, std::string_view what, std::int64_t a,
                                std::int64_t b) {
  if (a < 0 || b < 0 || (a != 0 && b > Shape::kMaxCount / a))
    throw_value_error(op, loc, what, " = ", a, " * ", b, " is negative or exceeds ", Shape::kMaxCount);
  return a * b;
}

/// The work of an op with windows or dot products (window elements visited, multiply-adds), as
/// the product of `factors`: a ValueError naming `op` past 2^62, which no machine finishes and
/// which leaves room for the kernels' index sums.
XGRAD_API std::int64_t checked_work(std::string_view op, SourceLoc loc, std::string_view what,
                                    std::initializer_list<std::int64_t> factors);

/// shape.numel(), or a ValueError naming `op` and the caller when the shape is not one a tensor
/// can have (a negative extent, or more elements than int64 counts).
XGRAD_API std::int64_t checked_numel(std::string_view op, SourceLoc loc, const Shape& shape);

}  // namespace detail

/// Maps a possibly negative axis into [0, rank); throws ShapeError naming `op` otherwise.
inline int normalize_axis(std::int64_t axis, int rank, std::string_view op, SourceLoc loc) {
  if (axis < -rank || axis >= rank)  // a scalar has no axis
    throw_shape_error(op, loc, "axis ", axis, " is out of range for a tensor of rank ", rank);
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

/// Writes the NumPy broadcast of two shapes to `out`; false when they do not fit.
XGRAD_API bool try_broadcast(const Shape& a, const Shape& b, Shape& out);

}  // namespace xgrad

#if !defined(XGRAD_COMPILED)
#include "xgrad/core/shape-inl.hpp"
#endif
