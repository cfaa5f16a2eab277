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

/// A tensor whose buffer cannot be had: more bytes than xgrad allocates at once, or the
/// allocator's refusal. A ValueError; ops and factories re-throw it with their name and the
/// caller's line.
class AllocationError : public ValueError {
 public:
  explicit AllocationError(const std::string& what, bool names_op = false) : ValueError(what), m_names_op(names_op) {}
  /// True once an op or factory has put its name and the caller's line into what().
  bool names_op() const { return m_names_op; }

 private:
  bool m_names_op;
};

/// Autodiff misuse: backward on a tensor without a graph, a saved tensor changed in place.
class AutogradError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A process group that cannot go on: MPI missing or failing, ranks that disagree on a
/// collective (shapes, dtypes, order), a rank that stopped answering. what() names the
/// collective and the ranks involved.
class DistributedError : public std::runtime_error {
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

/// Runs `body`; an AllocationError from it comes out with `op` and the caller's line in front.
template <class Body> decltype(auto) naming_allocations(std::string_view op, SourceLoc loc, Body&& body) {
  try {
    return body();
  } catch (const AllocationError& e) {
    if (e.names_op()) throw;
    throw AllocationError(op_message(op, loc, e.what()), true);
  }
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
