// What an IR node computes: a primitive's definition with its parameters, typed. Each
// primitive is a struct (op::Conv2D, op::Transpose, op::Add, ...) holding its name once, as
// `static constexpr std::string_view name`, and its parameters as fields; a node holds one
// behind ir::Primitive, so that passes ask `node.is<op::MaxPoolPut>()` and read
// `node.params<op::MaxPoolPut>().geometry` instead of comparing and parsing text, and a misspelt
// op is a compile error. The printed attributes are derived from the fields.
//
// A definition struct P provides:
//   static constexpr std::string_view name;               the op's name in IR text and errors
//   std::vector<ir::Attr> attrs() const;                  (if it has parameters) as printed
//   bool operator==(const P&) const;                      (if it has parameters) what CSE compares
// The derivative rules (grad, and jvp or `multilinear` for forward mode; ops/dispatch.hpp) live
// beside these in the same struct, as vmap's batching rules will.
#pragma once

#include <concepts>
#include <cstddef>
#include <functional>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "xgrad/core/config.hpp"

namespace xgrad::ir {

/// An op parameter as printed ("transpose_a", "false"): derived from the typed fields.
struct Attr {
  std::string name;
  std::string value;
  bool operator==(const Attr&) const = default;
};

/// A primitive's definition: a name, and equality-comparable parameters unless it has none.
template <class P>
concept PrimitiveDefinition = std::copy_constructible<P> && requires {
  { P::name } -> std::convertible_to<std::string_view>;
} &&(std::is_empty_v<P> || std::equality_comparable<P>);

namespace detail {
template <class P> inline constexpr char type_tag = 0;  // one address per definition type
}  // namespace detail

/// The names of the primitives this program can put in a graph: each definition registers
/// itself when a program that can make its node starts (the op table's completeness test reads
/// it).
XGRAD_API std::set<std::string_view>& known_primitives();

/// A node's primitive with its parameters, of any definition type.
class Primitive {
 public:
  virtual ~Primitive() = default;
  virtual std::string_view name() const = 0;
  /// The parameters as printed: IR text, the JSON report, the dot graph.
  virtual std::vector<Attr> attrs() const = 0;
  /// The same definition with equal parameters: two nodes that compute the same thing from
  /// the same inputs.
  virtual bool equals(const Primitive& other) const = 0;
  /// Equal primitives hash equally.
  XGRAD_API std::size_t hash() const;

  template <PrimitiveDefinition P> bool is() const { return type() == &detail::type_tag<P>; }
  /// The typed parameters; P must be this primitive's definition (check with is<P>()).
  template <PrimitiveDefinition P> const P& params() const;

 protected:
  virtual const void* type() const = 0;
};

template <PrimitiveDefinition P> class PrimitiveOf final : public Primitive {
 public:
  explicit PrimitiveOf(P params) : m_params(std::move(params)) {}
  std::string_view name() const override { return P::name; }
  std::vector<Attr> attrs() const override {
    if constexpr (requires { m_params.attrs(); })
      return m_params.attrs();
    else
      return {};
  }
  bool equals(const Primitive& other) const override {
    if (!other.is<P>()) return false;
    if constexpr (std::is_empty_v<P>)
      return true;
    else
      return m_params == other.params<P>();
  }
  const P& params() const { return m_params; }
  static inline const bool registered = (known_primitives().insert(P::name), true);

 private:
  const void* type() const override { return &detail::type_tag<P>; }
  P m_params;
};

template <PrimitiveDefinition P> const P& Primitive::params() const {
  if (!is<P>())
    throw std::logic_error(std::string("xgrad internal error: a ") + std::string(name()) + " node read as " +
                           std::string(P::name));
  return static_cast<const PrimitiveOf<P>&>(*this).params();
}

/// A shared, immutable primitive for a node.
template <PrimitiveDefinition P> std::shared_ptr<const Primitive> make_primitive(P params) {
  (void)PrimitiveOf<P>::registered;
  return std::make_shared<const PrimitiveOf<P>>(std::move(params));
}

}  // namespace xgrad::ir

#if !defined(XGRAD_COMPILED)
#include "xgrad/ir/primitive-inl.hpp"
#endif
