// The elementwise ops users call: unary (neg, exp, tanh, ...), binary with NumPy broadcasting
// (add, mul, comparisons, ...), where, fma and clip. Declarations only: each op is defined once,
// its struct (name, traits, one `apply` body for scalars, xsimd batches and Thrust functors, and
// its gradient rule) beside its function's definition, in ops/elementwise-inl.hpp.
#pragma once

#include <cstdint>
#include <type_traits>

#include "xgrad/core/dtype.hpp"
#include "xgrad/core/source_loc.hpp"
#include "xgrad/core/tensor.hpp"

namespace xgrad {

namespace detail {
/// The element type of a binary op's result on T inputs, the lists' result column below (each
/// op's struct says the same, as its `result<T>`; the definitions check that they agree).
template <class T> using same_result = T;
template <class T> using bool_result = bool;
}  // namespace detail

// The ops as lists, which drive the declarations here, the definitions (ops/elementwise-inl.hpp)
// and the instances below: fn, Op (its struct, op::Op), the concept of the types it takes, and
// for a binary op the element type of its result.
#define XGRAD_UNARY_FUNCTIONS(M, ...)                                             \
  M(neg, Neg, Numeric, __VA_ARGS__)                                               \
  M(exp, Exp, FloatingPoint, __VA_ARGS__)                                         \
  M(log, Log, FloatingPoint, __VA_ARGS__)                                         \
  M(sqrt, Sqrt, FloatingPoint, __VA_ARGS__)                                       \
  M(rsqrt, Rsqrt, FloatingPoint, __VA_ARGS__)                                     \
  M(tanh, Tanh, FloatingPoint, __VA_ARGS__)                                       \
  M(sigmoid, Sigmoid, FloatingPoint, __VA_ARGS__)                                 \
  M(relu, Relu, Numeric, __VA_ARGS__)                                             \
  M(sign, Sign, Numeric, __VA_ARGS__)                                             \
  M(abs, Abs, Numeric, __VA_ARGS__)                                               \
  M(square, Square, Numeric, __VA_ARGS__) M(sin, Sin, FloatingPoint, __VA_ARGS__) \
      M(cos, Cos, FloatingPoint, __VA_ARGS__) M(erf, Erf, FloatingPoint, __VA_ARGS__)
#define XGRAD_BINARY_FUNCTIONS(M, ...)                   \
  M(add, Add, Numeric, same_result, __VA_ARGS__)         \
  M(sub, Sub, Numeric, same_result, __VA_ARGS__)         \
  M(mul, Mul, Numeric, same_result, __VA_ARGS__)         \
  M(div, Div, Numeric, same_result, __VA_ARGS__)         \
  M(pow, Pow, Numeric, same_result, __VA_ARGS__)         \
  M(maximum, Maximum, Numeric, same_result, __VA_ARGS__) \
  M(minimum, Minimum, Numeric, same_result, __VA_ARGS__) \
  M(equal, Equal, Element, bool_result, __VA_ARGS__)     \
  M(less, Less, Numeric, bool_result, __VA_ARGS__) M(greater, Greater, Numeric, bool_result, __VA_ARGS__)

#define XGRAD_UNARY_DECLARATION(fn, Op, Constraint, ...)       \
  /** Elementwise Op (see op::Op, ops/elementwise-inl.hpp). */ \
  template <Constraint T> Tensor<T> fn(const Tensor<T>& x, SourceLoc loc = SourceLoc::current());
XGRAD_UNARY_FUNCTIONS(XGRAD_UNARY_DECLARATION, )
#undef XGRAD_UNARY_DECLARATION

// Binary ops take two tensors, or a tensor and a plain T scalar on either side.
#define XGRAD_BINARY_DECLARATION(fn, Op, Constraint, Result, ...)                                                    \
  /** Elementwise Op with NumPy broadcasting (see op::Op, ops/elementwise-inl.hpp). */                               \
  template <Constraint T>                                                                                            \
  Tensor<detail::Result<T>> fn(const Tensor<T>& a, const Tensor<T>& b, SourceLoc loc = SourceLoc::current());        \
  template <Constraint T>                                                                                            \
  Tensor<detail::Result<T>> fn(const Tensor<T>& a, std::type_identity_t<T> b, SourceLoc loc = SourceLoc::current()); \
  template <Constraint T>                                                                                            \
  Tensor<detail::Result<T>> fn(std::type_identity_t<T> a, const Tensor<T>& b, SourceLoc loc = SourceLoc::current());
XGRAD_BINARY_FUNCTIONS(XGRAD_BINARY_DECLARATION, )
#undef XGRAD_BINARY_DECLARATION

/// Picks a where cond is true, else b, with broadcasting over all three.
template <Element T>
Tensor<T> where(const Tensor<bool>& cond, const Tensor<T>& a, const Tensor<T>& b, SourceLoc loc = SourceLoc::current());
template <Element T> Tensor<T> where(const Tensor<bool>& cond, const Tensor<T>& a, std::type_identity_t<T> b,
                                     SourceLoc loc = SourceLoc::current());
template <Element T> Tensor<T> where(const Tensor<bool>& cond, std::type_identity_t<T> a, const Tensor<T>& b,
                                     SourceLoc loc = SourceLoc::current());

/// x with `value` where mask is true (PyTorch's masked_fill): where(mask, value, x). The mask
/// broadcasts to x's shape; the result has x's shape.
template <Element T> Tensor<T> masked_fill(const Tensor<T>& x, const Tensor<bool>& mask, std::type_identity_t<T> value,
                                           SourceLoc loc = SourceLoc::current());

/// a * b + c with one rounding (a fused multiply-add), broadcasting over all three. Outside
/// strict mode the jit's simplify pass turns a multiply that only feeds an add into this.
template <FloatingPoint T>
Tensor<T> fma(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& c, SourceLoc loc = SourceLoc::current());

/// Limits x to [lo, hi] (a composite: the gradient passes where x is inside); clip(NaN) is NaN.
template <Numeric T> Tensor<T> clip(const Tensor<T>& x, std::type_identity_t<T> lo, std::type_identity_t<T> hi,
                                    SourceLoc loc = SourceLoc::current());

// The instances xgrad::compiled holds (core/config.hpp).
#define XGRAD_UNARY_INSTANCE(T, X, fn) X Tensor<T> fn<T>(const Tensor<T>&, SourceLoc);
#define XGRAD_UNARY_INSTANCES(fn, Op, Constraint, X) XGRAD_FOR_EACH_##Constraint(XGRAD_UNARY_INSTANCE, X, fn)
#define XGRAD_BINARY_INSTANCE(T, X, fn, Result)                                     \
  X Tensor<detail::Result<T>> fn<T>(const Tensor<T>&, const Tensor<T>&, SourceLoc); \
  X Tensor<detail::Result<T>> fn<T>(const Tensor<T>&, T, SourceLoc);                \
  X Tensor<detail::Result<T>> fn<T>(T, const Tensor<T>&, SourceLoc);
#define XGRAD_BINARY_INSTANCES(fn, Op, Constraint, Result, X) \
  XGRAD_FOR_EACH_##Constraint(XGRAD_BINARY_INSTANCE, X, fn, Result)
#define XGRAD_WHERE_INSTANCE(T, X)                                                          \
  X Tensor<T> where<T>(const Tensor<bool>&, const Tensor<T>&, const Tensor<T>&, SourceLoc); \
  X Tensor<T> where<T>(const Tensor<bool>&, const Tensor<T>&, T, SourceLoc);                \
  X Tensor<T> where<T>(const Tensor<bool>&, T, const Tensor<T>&, SourceLoc);                \
  X Tensor<T> masked_fill<T>(const Tensor<T>&, const Tensor<bool>&, T, SourceLoc);
#define XGRAD_FMA_INSTANCE(T, X) X Tensor<T> fma<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, SourceLoc);
#define XGRAD_CLIP_INSTANCE(T, X) X Tensor<T> clip<T>(const Tensor<T>&, T, T, SourceLoc);
#define XGRAD_ELEMENTWISE_INSTANCES(X)                                                                \
  XGRAD_UNARY_FUNCTIONS(XGRAD_UNARY_INSTANCES, X)                                                     \
  XGRAD_BINARY_FUNCTIONS(XGRAD_BINARY_INSTANCES, X)                                                   \
  XGRAD_FOR_EACH_Element(XGRAD_WHERE_INSTANCE, X) XGRAD_FOR_EACH_FloatingPoint(XGRAD_FMA_INSTANCE, X) \
      XGRAD_FOR_EACH_Numeric(XGRAD_CLIP_INSTANCE, X)
#if defined(XGRAD_COMPILED) && !defined(XGRAD_INSTANTIATE_ELEMENTWISE)
XGRAD_ELEMENTWISE_INSTANCES(extern template)
#endif

}  // namespace xgrad

#if !defined(XGRAD_COMPILED)
#include "xgrad/ops/elementwise-inl.hpp"
#endif
