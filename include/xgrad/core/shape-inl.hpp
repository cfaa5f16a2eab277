// Definitions of core/shape.hpp: included by it when header-only, compiled once into the
// library (src/core.cpp) otherwise.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <sstream>
#include <string>

#include "xgrad/core/shape.hpp"

namespace xgrad {

XGRAD_API std::string Shape::str() const {
  std::ostringstream out;
  out << '[';
  for (int i = 0; i < m_rank; ++i) out << (i ? ", " : "") << m_dims[i];
  out << ']';
  return out.str();
}

namespace detail {

XGRAD_API std::int64_t checked_work(std::string_view op, SourceLoc loc, std::string_view what,
                                    std::initializer_list<std::int64_t> factors) {
  constexpr std::int64_t limit = std::int64_t{1} << 62;
  std::int64_t work = 1;
  for (std::int64_t f : factors)
    if (f == 0) return 0;
  for (std::int64_t f : factors) {
    if (f < 0 || work > limit / f)
      throw_value_error(op, loc, what, " (the product of ", Shape(factors), ") exceeds 2^62");
    work *= f;
  }
  return work;
}

XGRAD_API std::int64_t checked_numel(std::string_view op, SourceLoc loc, const Shape& shape) {
  try {
    return shape.numel();
  } catch (const ValueError& e) {
    throw_value_error(op, loc, e.what());
  }
}

}  // namespace detail

XGRAD_API bool try_broadcast(const Shape& a, const Shape& b, Shape& out) {
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
