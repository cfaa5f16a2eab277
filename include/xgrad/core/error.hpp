// The library's exceptions and the helpers that build their messages.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

#include "xgrad/core/source_loc.hpp"

namespace xgrad {

/// A shape or dtype that does not fit an op. what() names the op, every input's shape and
/// the caller's file:line.
class ShapeError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Bad input that is not about shapes: a ragged nested list, a negative size, a bad file.
class ValueError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Autodiff misuse: backward on a tensor without a graph, a saved tensor changed in place.
class AutogradError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

template <class... Parts> std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

/// "Op: message (at file.cpp:12)"
template <class... Parts> std::string op_message(std::string_view op, SourceLoc loc, const Parts&... parts) {
  return concat(op, ": ", parts..., " (at ", loc.str(), ")");
}

}  // namespace detail

template <class... Parts>
[[noreturn]] void throw_shape_error(std::string_view op, SourceLoc loc, const Parts&... parts) {
  throw ShapeError(detail::op_message(op, loc, parts...));
}

template <class... Parts>
[[noreturn]] void throw_value_error(std::string_view op, SourceLoc loc, const Parts&... parts) {
  throw ValueError(detail::op_message(op, loc, parts...));
}

}  // namespace xgrad
