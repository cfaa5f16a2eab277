// SourceLoc: the user's file:line, captured as a default argument at each public call.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "xgrad/core/config.hpp"

namespace xgrad {

/// Where a public function was called from. Built on __builtin_FILE/__builtin_LINE, which
/// g++, clang and nvcc all provide (clang 14 has no std::source_location with libstdc++ 12).
class SourceLoc {
 public:
  constexpr SourceLoc() = default;

#if defined(__CUDA_ARCH__)
  // nvcc's device pass (CUDA 13) aborts on these builtins in a default argument used by a
  // default member initializer (`Parameter<float> w{randn<float>(...), "w"};`); host code
  // compiled there is discarded, so it needs no location.
  static constexpr SourceLoc current(const char* file = "", std::uint32_t line = 0) noexcept {
    return SourceLoc(file, line);
  }
#else
  static constexpr SourceLoc current(const char* file = __builtin_FILE(),
                                     std::uint32_t line = __builtin_LINE()) noexcept {
    return SourceLoc(file, line);
  }
#endif

  constexpr const char* file() const { return m_file; }
  constexpr std::uint32_t line() const { return m_line; }

  /// "model.cpp:19": the file's base name keeps messages short.
  XGRAD_API std::string str() const;

 private:
  // Private, so that a braced list such as {0, 3} never converts to a SourceLoc.
  constexpr SourceLoc(const char* file, std::uint32_t line) : m_file(file), m_line(line) {}

  const char* m_file = "";
  std::uint32_t m_line = 0;
};

/// A value plus the place it was written. An operator's left operand converts to this, so
/// `a + b` learns the user's line although operators cannot take a default argument.
template <class V> struct Located {
  std::conditional_t<std::is_arithmetic_v<V>, V, const V&> value;
  SourceLoc loc;
  Located(const V& v, SourceLoc where = SourceLoc::current()) : value(v), loc(where) {}
};

}  // namespace xgrad

#if !defined(XGRAD_COMPILED)
#include "xgrad/core/source_loc-inl.hpp"
#endif
