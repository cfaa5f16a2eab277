// Definitions of ir/primitive.hpp: included by it when header-only, compiled once into the
// library (src/ir.cpp) otherwise.
#pragma once

#include <cstddef>
#include <functional>
#include <set>
#include <string>
#include <string_view>

#include "xgrad/ir/primitive.hpp"

namespace xgrad::ir {

XGRAD_API std::set<std::string_view>& known_primitives() {
  static std::set<std::string_view> names;
  return names;
}

XGRAD_API std::size_t Primitive::hash() const {
  std::size_t h = std::hash<std::string_view>{}(name());
  for (const Attr& a : attrs()) h = h * 31 + std::hash<std::string>{}(a.value);
  return h;
}

}  // namespace xgrad::ir
