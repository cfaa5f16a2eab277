// Shape: a tensor's extents, stored inline (no allocation), with NumPy broadcasting rules.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

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

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < m_rank; ++i) n *= m_dims[i];
    return n;
  }

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
  std::string str() const {
    std::ostringstream out;
    out << '[';
    for (int i = 0; i < m_rank; ++i) out << (i ? ", " : "") << m_dims[i];
    out << ']';
    return out.str();
  }
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

/// Maps a possibly negative axis into [0, rank); throws ShapeError naming `op` otherwise.
inline int normalize_axis(std::int64_t axis, int rank, std::string_view op, SourceLoc loc) {
  if (axis < -rank || axis >= std::max(rank, 1))
    throw_shape_error(op, loc, "axis ", axis, " is out of range for a tensor of rank ", rank);
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

/// Writes the NumPy broadcast of two shapes to `out`; false when they do not fit.
inline bool try_broadcast(const Shape& a, const Shape& b, Shape& out) {
  int rank = std::max(a.ndim(), b.ndim());
  out = Shape();
  for (int i = 0; i < rank; ++i) {
    int ia = a.ndim() - rank + i, ib = b.ndim() - rank + i;
    std::int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1) return false;
    out.push_back(da == 1 ? db : da);
  }
  return true;
}

}  // namespace xgrad
