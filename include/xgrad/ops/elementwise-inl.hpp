// Definitions of ops/elementwise.hpp: included by it when header-only, compiled once into the
// library (src/ops_elementwise.cpp) otherwise.
//
// Every elementwise op, each defined once: name, traits, one `apply` body for scalars and
// xsimd batches (and Thrust functors), and its gradient rule written with xgrad ops.
#pragma once

#include <array>
#include <cmath>
#include <numbers>
#include <tuple>
#include <type_traits>
#include <utility>

#include <xsimd/xsimd.hpp>

#include "xgrad/backend/math.hpp"
#include "xgrad/core/factory.hpp"
#include "xgrad/ops/dispatch.hpp"
#include "xgrad/ops/elementwise.hpp"
#include "xgrad/ops/manipulation.hpp"  // broadcast_to: a tangent at its output's shape

namespace xgrad {

namespace detail {
template <class V> inline constexpr bool is_batch = xsimd::is_batch<V>::value;
}  // namespace detail

// Elementwise op definitions. A unary op has apply(x) and grad(x, y, g) -> dx; a binary op
// has apply(a, b), result<T> and grad(a, b, y, g) -> {da, db} at the broadcast shape (the
// engine sums a gradient back to its input's shape). reads_inputs / reads_output say which
// tensors grad() uses, so the tape keeps nothing else alive.
namespace op {

struct UnaryDefaults {
  static constexpr OpTraits traits{.elementwise = true};
  static constexpr bool reads_inputs = true;
  static constexpr bool reads_output = false;
};

struct Neg : UnaryDefaults {
  static constexpr std::string_view name = "Neg";
  static constexpr OpTraits traits{.elementwise = true, .linear = true};
  static constexpr bool reads_inputs = false;
  template <class V> XGRAD_HD static V apply(const V& x) { return math::neg(x); }  // -INT_MIN wraps
  template <class T> static Tensor<T> grad(const Tensor<T>&, const Tensor<T>&, const Tensor<T>& g) { return -g; }
};

struct Exp : UnaryDefaults {
  static constexpr std::string_view name = "Exp";
  static constexpr bool reads_inputs = false;
  static constexpr bool reads_output = true;
  template <class V> XGRAD_HD static V apply(const V& x) { return math::exp(x); }
  template <class T> static Tensor<T> grad(const Tensor<T>&, const Tensor<T>& y, const Tensor<T>& g) { return g * y; }
};

struct Log : UnaryDefaults {
  static constexpr std::string_view name = "Log";
  template <class V> XGRAD_HD static V apply(const V& x) { return math::log(x); }
  template <class T> static Tensor<T> grad(const Tensor<T>& x, const Tensor<T>&, const Tensor<T>& g) { return g / x; }
};

struct Sqrt : UnaryDefaults {
  static constexpr std::string_view name = "Sqrt";
  static constexpr bool reads_inputs = false;
  static constexpr bool reads_output = true;
  template <class V> XGRAD_HD static V apply(const V& x) { return math::sqrt(x); }
  template <class T> static Tensor<T> grad(const Tensor<T>&, const Tensor<T>& y, const Tensor<T>& g) {
    return g * T(0.5) / y;
  }
};

struct Rsqrt : UnaryDefaults {
  static constexpr std::string_view name = "Rsqrt";
  static constexpr bool reads_inputs = false;
  static constexpr bool reads_output = true;
  // 1 / sqrt rather than xsimd::rsqrt, whose hardware estimate has only ~12 bits.
  template <class V> XGRAD_HD static V apply(const V& x) { return V(1) / math::sqrt(x); }
  template <class T> static Tensor<T> grad(const Tensor<T>&, const Tensor<T>& y, const Tensor<T>& g) {
    return g * T(-0.5) * y * y * y;
  }
};

struct Tanh : UnaryDefaults {
  static constexpr std::string_view name = "Tanh";
  static constexpr bool reads_inputs = false;
  static constexpr bool reads_output = true;
  template <class V> XGRAD_HD static V apply(const V& x) { return math::tanh(x); }
  template <class T> static Tensor<T> grad(const Tensor<T>&, const Tensor<T>& y, const Tensor<T>& g) {
    return g * (T(1) - y * y);
  }
};

struct Sigmoid : UnaryDefaults {
  static constexpr std::string_view name = "Sigmoid";
  static constexpr bool reads_inputs = false;
  static constexpr bool reads_output = true;
  template <class V> XGRAD_HD static V apply(const V& x) { return V(1) / (V(1) + math::exp(-x)); }
  template <class T> static Tensor<T> grad(const Tensor<T>&, const Tensor<T>& y, const Tensor<T>& g) {
    return g * y * (T(1) - y);
  }
};

struct Relu : UnaryDefaults {
  static constexpr std::string_view name = "ReLU";
  // The gradient reads the output (y > 0 exactly where x > 0): the input can die at once, and a
  // compiled graph can fuse the ReLU into the producer of x (a GEMM's or conv's epilogue).
  static constexpr bool reads_inputs = false;
  static constexpr bool reads_output = true;
  // relu(NaN) is NaN (math::max propagates it), relu(-0) is +0.
  template <class V> XGRAD_HD static V apply(const V& x) { return math::max(x, V(0)); }
  template <class T> static Tensor<T> grad(const Tensor<T>&, const Tensor<T>& y, const Tensor<T>& g) {
    return where(y > T(0), g, T(0));  // 0 where y is NaN, as PyTorch's
  }
};

struct Sign : UnaryDefaults {
  static constexpr std::string_view name = "Sign";
  static constexpr bool reads_inputs = false;
  // sign(NaN) is NaN, sign(±0) is +0. (xsimd::isnan: xsimd's batch != is false for NaN.)
  template <class V> XGRAD_HD static V apply(const V& x) {
    if constexpr (detail::is_batch<V>)
      return xsimd::select(x > V(0), V(1), xsimd::select(x < V(0), V(-1), xsimd::select(xsimd::isnan(x), x, V(0))));
    else if constexpr (std::is_floating_point_v<V>)
      return x != x ? x : static_cast<V>((x > V(0)) - (x < V(0)));
    else
      return static_cast<V>((x > V(0)) - (x < V(0)));
  }
  template <class T> static Tensor<T> grad(const Tensor<T>&, const Tensor<T>&, const Tensor<T>& g) {
    return zeros_like(g);
  }
};

struct Abs : UnaryDefaults {
  static constexpr std::string_view name = "Abs";
  template <class V> XGRAD_HD static V apply(const V& x) { return math::abs(x); }
  template <class T> static Tensor<T> grad(const Tensor<T>& x, const Tensor<T>&, const Tensor<T>& g) {
    return g * sign(x);
  }
};

struct Square : UnaryDefaults {
  static constexpr std::string_view name = "Square";
  template <class V> XGRAD_HD static V apply(const V& x) { return math::mul(x, x); }
  template <class T> static Tensor<T> grad(const Tensor<T>& x, const Tensor<T>&, const Tensor<T>& g) {
    return g * T(2) * x;
  }
};

struct Sin : UnaryDefaults {
  static constexpr std::string_view name = "Sin";
  template <class V> XGRAD_HD static V apply(const V& x) { return math::sin(x); }
  template <class T> static Tensor<T> grad(const Tensor<T>& x, const Tensor<T>&, const Tensor<T>& g) {
    return g * cos(x);
  }
};

struct Cos : UnaryDefaults {
  static constexpr std::string_view name = "Cos";
  template <class V> XGRAD_HD static V apply(const V& x) { return math::cos(x); }
  template <class T> static Tensor<T> grad(const Tensor<T>& x, const Tensor<T>&, const Tensor<T>& g) {
    return -(g * sin(x));
  }
};

struct Erf : UnaryDefaults {
  static constexpr std::string_view name = "Erf";
  template <class V> XGRAD_HD static V apply(const V& x) { return math::erf(x); }
  template <class T> static Tensor<T> grad(const Tensor<T>& x, const Tensor<T>&, const Tensor<T>& g) {
    return g * (T(2) * std::numbers::inv_sqrtpi_v<T>)*exp(-square(x));  // d erf(x)/dx
  }
};

struct BinaryDefaults {
  static constexpr OpTraits traits{.elementwise = true};
  static constexpr bool reads_inputs = true;
  static constexpr bool reads_output = false;
  template <class T> using result = T;
};

struct Add : BinaryDefaults {
  static constexpr std::string_view name = "Add";
  static constexpr OpTraits traits{.elementwise = true, .commutative = true, .linear = true};
  static constexpr bool reads_inputs = false;
  template <class V> XGRAD_HD static V apply(const V& a, const V& b) { return math::add(a, b); }
  template <class T> static auto grad(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, const Tensor<T>& g) {
    return std::pair{g, g};
  }
};

struct Sub : BinaryDefaults {
  static constexpr std::string_view name = "Sub";
  static constexpr OpTraits traits{.elementwise = true, .linear = true};
  static constexpr bool reads_inputs = false;
  template <class V> XGRAD_HD static V apply(const V& a, const V& b) { return math::sub(a, b); }
  template <class T> static auto grad(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, const Tensor<T>& g) {
    return std::pair{g, -g};
  }
  // Forward mode wants one input's part at a time; grad makes both.
  template <class T>
  static Tensor<T> tangent(std::size_t k, const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, const Tensor<T>& t) {
    return k == 0 ? t : -t;
  }
};

struct Mul : BinaryDefaults {
  static constexpr std::string_view name = "Mul";
  static constexpr OpTraits traits{.elementwise = true, .commutative = true};
  template <class V> XGRAD_HD static V apply(const V& a, const V& b) { return math::mul(a, b); }
  template <class T> static auto grad(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>&, const Tensor<T>& g) {
    return std::pair{g * b, g * a};
  }
  template <class T> static Tensor<T> tangent(std::size_t k, const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>&,
                                              const Tensor<T>& t) {
    return k == 0 ? t * b : a * t;
  }
};

struct Div : BinaryDefaults {
  static constexpr std::string_view name = "Div";
  static constexpr bool reads_output = true;
  // Integers: x / 0 = 0 and INT_MIN / -1 = INT_MIN, never a trap (math::div).
  template <class V> XGRAD_HD static V apply(const V& a, const V& b) { return math::div(a, b); }
  template <class T> static auto grad(const Tensor<T>&, const Tensor<T>& b, const Tensor<T>& y, const Tensor<T>& g) {
    auto ga = g / b;
    return std::pair{ga, -(ga * y)};
  }
  template <class T> static Tensor<T> tangent(std::size_t k, const Tensor<T>&, const Tensor<T>& b, const Tensor<T>& y,
                                              const Tensor<T>& t) {
    return k == 0 ? t / b : -(t / b * y);
  }
};

struct Pow : BinaryDefaults {
  static constexpr std::string_view name = "Pow";
  static constexpr bool reads_output = true;
  template <class V> XGRAD_HD static V apply(const V& a, const V& b) {
    if constexpr (std::is_integral_v<V>)
      return math::ipow(a, b);  // wraps on overflow; std::pow's double cast back was undefined
    else
      return math::pow(a, b);  // C's special cases: pow(0, -0.5) = inf, pow(NaN, 0) = 1
  }
  // d/da at a = 0 is b * pow(0, b - 1): inf for 0 < b < 1, as sqrt's gradient there. d/db is
  // y * log(a), taken as 0 where y is 0 (a = 0, b > 0), not 0 * -inf = NaN, as PyTorch does.
  template <class T> static auto grad(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& y, const Tensor<T>& g) {
    return std::pair{g * b * pow(a, b - T(1)), where(equal(y, T(0)), T(0), g * y * log(a))};
  }
};

struct Maximum : BinaryDefaults {
  static constexpr std::string_view name = "Maximum";
  static constexpr OpTraits traits{.elementwise = true, .commutative = true};
  // NaN when either is NaN (math::max).
  template <class V> XGRAD_HD static V apply(const V& a, const V& b) { return math::max(a, b); }
  // Ties split the gradient evenly, so the rule is symmetric in a and b; a NaN output takes its
  // gradient from the NaN operand (a when both are), the one the value came from.
  template <class T> static auto grad(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>&, const Tensor<T>& g) {
    // Scalars, not full tensors: under jit they are small constants of the graph.
    auto one = scalar_like(g, T(1));
    auto share = where(equal(a, a), where(greater(a, b), one, where(equal(a, b), scalar_like(g, T(0.5)), T(0))), one);
    return std::pair{g * share, g - g * share};
  }
};

struct Minimum : BinaryDefaults {
  static constexpr std::string_view name = "Minimum";
  static constexpr OpTraits traits{.elementwise = true, .commutative = true};
  // NaN when either is NaN (math::min).
  template <class V> XGRAD_HD static V apply(const V& a, const V& b) { return math::min(a, b); }
  // As Maximum's: ties split evenly, a NaN output's gradient goes to the NaN operand.
  template <class T> static auto grad(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>&, const Tensor<T>& g) {
    // Scalars, not full tensors: under jit they are small constants of the graph.
    auto one = scalar_like(g, T(1));
    auto share = where(equal(a, a), where(less(a, b), one, where(equal(a, b), scalar_like(g, T(0.5)), T(0))), one);
    return std::pair{g * share, g - g * share};
  }
};

struct ComparisonDefaults : BinaryDefaults {
  template <class T> using result = bool;
};
struct Equal : ComparisonDefaults {
  static constexpr std::string_view name = "Equal";
  static constexpr OpTraits traits{.elementwise = true, .commutative = true};
  template <class V> XGRAD_HD static bool apply(const V& a, const V& b) { return a == b; }
};
struct Less : ComparisonDefaults {
  static constexpr std::string_view name = "Less";
  template <class V> XGRAD_HD static bool apply(const V& a, const V& b) { return a < b; }
};
struct Greater : ComparisonDefaults {
  static constexpr std::string_view name = "Greater";
  template <class V> XGRAD_HD static bool apply(const V& a, const V& b) { return a > b; }
};

struct Where {
  static constexpr std::string_view name = "Select";
  static constexpr OpTraits traits{.elementwise = true};
  static constexpr std::array<std::string_view, 3> inputs{"cond", "x", "y"};
  static constexpr std::array<bool, 3> saved{true, false, false};
  // c is a bool, or a mask when a and b are batches.
  template <class M, class V> XGRAD_HD static V apply(const M& c, const V& a, const V& b) {
    if constexpr (detail::is_batch<V>)
      return xsimd::select(c, a, b);
    else
      return c ? a : b;
  }
  template <class T>
  static autograd::Grads grad(const Tensor<bool>& c, const Tensor<T>&, const Tensor<T>&, const Tensor<T>& g) {
    return {TensorBase(), where(c, g, T(0)), where(c, T(0), g)};
  }
};

/// a * b + c rounded once, on batches and on scalars alike, so both agree bit for bit
/// (math::fma).
struct Fma {
  static constexpr std::string_view name = "Fma";
  static constexpr OpTraits traits{.elementwise = true};
  static constexpr std::array<std::string_view, 3> inputs{"a", "b", "c"};
  static constexpr std::array<bool, 3> saved{true, true, false};
  template <class V> XGRAD_HD static V apply(const V& a, const V& b, const V& c) { return math::fma(a, b, c); }
  template <class T>
  static autograd::Grads grad(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>&, const Tensor<T>& g) {
    return {g * b, g * a, g};
  }
};

/// The ops a fused group may hold, numbered by their place here on Device::thrust, where one
/// functor runs a whole group (backend/thrust/fused.hpp).
using Fusible = std::tuple<Neg, Exp, Log, Sqrt, Rsqrt, Tanh, Sigmoid, Relu, Sign, Abs, Square, Sin, Cos, Erf, Add, Sub,
                           Mul, Div, Pow, Maximum, Minimum, Equal, Less, Greater, Where, Fma>;

/// The cheap ops a unary op's kernel may be merged with in a fused group (MergedBlockKernels):
/// those whose result it may read in registers, and those that may read its result.
using MergeFeeders = std::tuple<Add, Sub, Mul, Fma>;
using MergeConsumers = std::tuple<Add, Mul, Fma>;
static_assert(std::tuple_size_v<MergeFeeders> == MergedBlockKernels::num_feeders &&
              std::tuple_size_v<MergeConsumers> == MergedBlockKernels::num_consumers);

}  // namespace op

namespace detail {
/// Op's place in op::Fusible (the functor's op number on Device::thrust), or -1.
template <class Op> consteval int fusible_index() {
  return []<class... Ops>(std::tuple<Ops...>*) {
    int i = 0, found = -1;
    (void)((std::is_same_v<Op, Ops> ? (found = i, true) : (++i, false)) || ...);
    return found;
  }(static_cast<op::Fusible*>(nullptr));
}
template <class Op> consteval bool is_fusible() { return fusible_index<Op>() >= 0; }
}  // namespace detail

namespace detail {

/// Float only: models train in float, and each table is eleven loops of its own. With double's
/// too, the library's elementwise code was a quarter larger under the sanitizers and took 15%
/// longer to compile there; a double group runs the two block kernels one after the other.
template <class Op, class T> const MergedBlockKernels* merged_block_kernels() {
  using Merged = MergedBlockKernels;
  static_assert(std::is_same_v<op::MergeConsumers, std::tuple<op::Add, op::Mul, op::Fma>>, "the table's rows below");
  if constexpr (std::is_same_v<T, float> && cpu::detail::SimdBody<Op, T>) {
    using cpu::unary_after_block, cpu::unary_into_block;
    static constexpr Merged table{
        .after = []<class... P>(std::tuple<P...>*) { return std::array{&unary_after_block<Op, P, T>...}; }(
                     static_cast<op::MergeFeeders*>(nullptr)),
        .into = {{{&unary_into_block<Op, op::Add, 0, T>, &unary_into_block<Op, op::Add, 1, T>, nullptr},
                  {&unary_into_block<Op, op::Mul, 0, T>, &unary_into_block<Op, op::Mul, 1, T>, nullptr},
                  {&unary_into_block<Op, op::Fma, 0, T>, &unary_into_block<Op, op::Fma, 1, T>,
                   &unary_into_block<Op, op::Fma, 2, T>}}}};
    return &table;
  } else {
    return nullptr;
  }
}

}  // namespace detail

// ---- The functions of ops/elementwise.hpp ---------------------------------------------

#define XGRAD_UNARY_DEFINITION(fn, Op, Constraint, ...) \
  template <Constraint T> Tensor<T> fn(const Tensor<T>& x, SourceLoc loc) { return detail::unary<op::Op>(x, loc); }
XGRAD_UNARY_FUNCTIONS(XGRAD_UNARY_DEFINITION, )
#undef XGRAD_UNARY_DEFINITION

#define XGRAD_BINARY_DEFINITION(fn, Op, Constraint, Result, ...)                                                       \
  template <Constraint T> Tensor<detail::Result<T>> fn(const Tensor<T>& a, const Tensor<T>& b, SourceLoc loc) {        \
    static_assert(std::is_same_v<op::Op::result<T>, detail::Result<T>>,                                                \
                  "the result column of XGRAD_BINARY_FUNCTIONS must say what op::" #Op "::result says");               \
    return detail::binary<op::Op>(a, b, loc);                                                                          \
  }                                                                                                                    \
  template <Constraint T> Tensor<detail::Result<T>> fn(const Tensor<T>& a, std::type_identity_t<T> b, SourceLoc loc) { \
    return detail::binary<op::Op>(a, scalar_like(a, b), loc);                                                          \
  }                                                                                                                    \
  template <Constraint T> Tensor<detail::Result<T>> fn(std::type_identity_t<T> a, const Tensor<T>& b, SourceLoc loc) { \
    return detail::binary<op::Op>(scalar_like(b, a), b, loc);                                                          \
  }
XGRAD_BINARY_FUNCTIONS(XGRAD_BINARY_DEFINITION, )
#undef XGRAD_BINARY_DEFINITION

template <Element T> Tensor<T> where(const Tensor<bool>& cond, const Tensor<T>& a, const Tensor<T>& b, SourceLoc loc) {
  return detail::ternary<op::Where>(cond, a, b, loc);
}
template <FloatingPoint T> Tensor<T> fma(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& c, SourceLoc loc) {
  return detail::ternary<op::Fma>(a, b, c, loc);
}

template <Element T>
Tensor<T> masked_fill(const Tensor<T>& x, const Tensor<bool>& mask, std::type_identity_t<T> value, SourceLoc loc) {
  detail::OpScope scope("MaskedFill", loc, {x, mask});
  if (detail::broadcast_or_throw("MaskedFill", x, mask, loc) != x.shape())
    throw_shape_error("MaskedFill", loc, "the mask ", mask.shape(), " must broadcast to x's shape ", x.shape());
  return where(mask, value, x, loc);
}

template <Element T>
Tensor<T> where(const Tensor<bool>& cond, const Tensor<T>& a, std::type_identity_t<T> b, SourceLoc loc) {
  return where(cond, a, scalar_like(a, b), loc);
}
template <Element T>
Tensor<T> where(const Tensor<bool>& cond, std::type_identity_t<T> a, const Tensor<T>& b, SourceLoc loc) {
  return where(cond, scalar_like(b, a), b, loc);
}

template <Numeric T>
Tensor<T> clip(const Tensor<T>& x, std::type_identity_t<T> lo, std::type_identity_t<T> hi, SourceLoc loc) {
  if (lo > hi) throw_value_error("Clip", loc, "lo (", lo, ") must not exceed hi (", hi, ")");
  return minimum(maximum(x, lo, loc), hi, loc);
}

}  // namespace xgrad
