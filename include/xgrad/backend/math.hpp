// The math op bodies call (ops/elementwise-inl.hpp), for xsimd batches and scalars alike: xsimd on
// the host, as the CPU backend has always run them, and CUDA's math in device code, where xsimd
// cannot run (the Thrust backend built by nvcc). The numerical semantics these functions fix
// (NaN propagation, integer wrap-around and division by zero, saturating casts) are described
// in docs/NUMERICS.md.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <xsimd/xsimd.hpp>
#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif

#include "xgrad/core/device.hpp"

namespace xgrad::math {

#if defined(__CUDA_ARCH__)
#define XGRAD_MATH_UNARY(fn) \
  template <class V> XGRAD_HD V fn(const V& x) { return std::fn(x); }
#else
#define XGRAD_MATH_UNARY(fn) \
  template <class V> XGRAD_HD V fn(const V& x) { return xsimd::fn(x); }
#endif
XGRAD_MATH_UNARY(sqrt)
XGRAD_MATH_UNARY(sin)
XGRAD_MATH_UNARY(cos)
#undef XGRAD_MATH_UNARY

namespace detail {
/// Whether some lane of a double batch is a denormal (0 < |x| < DBL_MIN), which xsimd 8.1's
/// double log gets wrong (log(1e-310) is -746.5, not -713.8): it reads the exponent field as if
/// the number were normal. Float's log handles them.
template <class V> bool any_double_denormal(const V& x) {
  if constexpr (std::is_same_v<typename V::value_type, double>) {
    const V m = xsimd::abs(x);
    return xsimd::any((m < V(std::numeric_limits<double>::min())) & (m > V(0.0)));
  } else {
    return false;
  }
}
/// log of a double batch holding denormals: scaled by 2^54 into the normal range first.
template <class V> V log_scaled(const V& x) {
  const auto tiny = xsimd::abs(x) < V(std::numeric_limits<double>::min());
  const V scaled = xsimd::select(tiny, x * V(0x1p54), x);
  return xsimd::log(scaled) - xsimd::select(tiny, V(54 * 0.693147180559945309417232121458176568), V(0.0));
}
}  // namespace detail

namespace detail {
/// x with NaN lanes set to 0 and the rest clamped to [lo, hi]; xsimd 8.1's double exp converts
/// x / ln 2 to int64 before its own range checks, which is undefined behaviour (UBSan) for NaN
/// and for |x| past about 6e18, so its double functions built on exp get their input through this.
template <class V> V clamped_defined(const V& x, double lo, double hi) {
  return xsimd::select(xsimd::isnan(x), V(0.0), xsimd::select(x < V(lo), V(lo), xsimd::select(x > V(hi), V(hi), x)));
}
template <class V> inline constexpr bool double_batch = std::is_same_v<typename V::value_type, double>;
}  // namespace detail

template <class V> XGRAD_HD V exp(const V& x) {
#if defined(__CUDA_ARCH__)
  return std::exp(x);
#else
  if constexpr (xsimd::is_batch<V>::value) {
    if constexpr (detail::double_batch<V>)  // outside [-746, 710] exp is 0 or inf already
      return xsimd::select(xsimd::isnan(x), x, xsimd::exp(detail::clamped_defined(x, -746.0, 710.0)));
  }
  return xsimd::exp(x);
#endif
}

/// exp(x) for x <= 0, as a softmax takes it (a score less its row's maximum): -inf gives 0 and
/// NaN NaN, and without the checks for large x that a general exp makes. Float batches: k = x /
/// ln 2 rounded, a polynomial of our own for exp on [-ln 2 / 2, ln 2 / 2] (1 + r + r^2 P(r), P
/// of degree 4 fitted to the relative error, 0.05 ulp before rounding), times 2^k made from k's
/// bits; within 2 ulps of the true value down to FLT_MIN, 0 below x = -88; about a fifth faster
/// than exp. Anything else: exp. Host only.
template <class V> V exp_nonpositive(const V& x) {
  if constexpr (xsimd::is_batch<V>::value && std::is_same_v<typename V::value_type, float>) {
    using Int = xsimd::batch<std::int32_t, typename V::arch_type>;
    const V low(-88.0f);
    const V clamped = xsimd::select(x < low, low, x);  // NaN compares false, and stays
    const V k = xsimd::nearbyint(clamped * V(1.44269504f));
    V r = xsimd::fnma(k, V(0.693359375f), clamped);  // ln 2's leading bits: k times them is exact
    r = xsimd::fnma(k, V(-2.12194440e-4f), r);
    V p(1.381464652e-03f);
    p = xsimd::fma(p, r, V(8.368710056e-03f));
    p = xsimd::fma(p, r, V(4.166838527e-02f));
    p = xsimd::fma(p, r, V(1.666652113e-01f));
    p = xsimd::fma(p, r, V(4.999999404e-01f));
    const V e = xsimd::fma(p, r * r, r) + V(1.0f);
    // k in [-127, 0]: 2^k's exponent field k + 127, 0 (the value 0) for k = -127.
    return e * xsimd::bitwise_cast<V>((xsimd::to_int(k) + Int(127)) << 23);
  } else {
    return math::exp(x);  // qualified: ADL would find xsimd::exp, which lacks the double fix-ups
  }
}

template <class V> XGRAD_HD V tanh(const V& x) {
#if defined(__CUDA_ARCH__)
  return std::tanh(x);
#else
  if constexpr (xsimd::is_batch<V>::value) {
    if constexpr (detail::double_batch<V>)  // tanh is ±1 in double beyond |x| = 20
      return xsimd::select(xsimd::isnan(x), x, xsimd::tanh(detail::clamped_defined(x, -40.0, 40.0)));
  }
  return xsimd::tanh(x);
#endif
}

namespace detail {
/// erf of a float batch as x P(x^2) / Q(x^2) for |x| up to 4, a rational fit of our own to the
/// relative error on [0, 4] (xgrad's erf is within 6 ulps of the true one, 7 without FMA; in float erf is ±1
/// past |x| = 3.92): ten fused multiply-adds and one division, a tenth of the time of xsimd's
/// float erf, which runs both of its branches and an exp on most batches. Odd, so -0 stays -0;
/// ±1 at ±inf; the caller passes NaN through.
template <class V> V erf_float(const V& x) {
  const V a = xsimd::min(xsimd::abs(x), V(4.0f));
  const V t = a * a;
  V p(0x1.484beep-26f);
  p = xsimd::fma(p, t, V(-0x1.04aca8p-19f));
  p = xsimd::fma(p, t, V(0x1.34dbf0p-13f));
  p = xsimd::fma(p, t, V(0x1.05822ep-8f));
  p = xsimd::fma(p, t, V(0x1.a61602p-5f));
  p = xsimd::fma(p, t, V(0x1.a82eb8p-3f));
  p = xsimd::fma(p, t, V(0x1.20dd74p+0f));
  V q(0x1.0ba850p-10f);
  q = xsimd::fma(q, t, V(0x1.ea2154p-7f));
  q = xsimd::fma(q, t, V(0x1.e3331ap-4f));
  q = xsimd::fma(q, t, V(0x1.08a566p-1f));
  q = xsimd::fma(q, t, V(1.0f));
  return xsimd::copysign(xsimd::min(a * p / q, V(1.0f)), x);
}
}  // namespace detail

template <class V> XGRAD_HD V erf(const V& x) {
#if defined(__CUDA_ARCH__)
  return std::erf(x);
#else
  if constexpr (xsimd::is_batch<V>::value) {
    if constexpr (std::is_same_v<typename V::value_type, float>)
      return xsimd::select(xsimd::isnan(x), x, detail::erf_float(x));
    // xsimd's erf takes exp(-x^2) for large |x| (see clamped_defined); erf is exactly ±1
    // beyond |x| = 6 in double.
    return xsimd::select(xsimd::isnan(x), x, xsimd::erf(detail::clamped_defined(x, -6.0, 6.0)));
  }
  return xsimd::erf(x);
#endif
}

template <class V> XGRAD_HD V log(const V& x) {
#if defined(__CUDA_ARCH__)
  return std::log(x);
#else
  if constexpr (xsimd::is_batch<V>::value) {
    if (detail::any_double_denormal(x)) return detail::log_scaled(x);  // rare: the common path stays as fast
  }
  return xsimd::log(x);
#endif
}

/// Signed integers (int32, int64): their + - * wrap around in two's complement, as NumPy's do,
/// instead of overflowing into undefined behaviour. bool is not one.
template <class V> inline constexpr bool signed_int = (std::is_integral_v<V> && std::is_signed_v<V>);

template <class V> XGRAD_HD V add(const V& a, const V& b) {
  if constexpr (signed_int<V>) {
    using U = std::make_unsigned_t<V>;
    return static_cast<V>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}
template <class V> XGRAD_HD V sub(const V& a, const V& b) {
  if constexpr (signed_int<V>) {
    using U = std::make_unsigned_t<V>;
    return static_cast<V>(static_cast<U>(static_cast<U>(a) - static_cast<U>(b)));
  } else {
    return a - b;
  }
}
template <class V> XGRAD_HD V mul(const V& a, const V& b) {
  if constexpr (signed_int<V>) {
    using U = std::make_unsigned_t<V>;
    return static_cast<V>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return a * b;
  }
}
template <class V> XGRAD_HD V neg(const V& x) {
  if constexpr (signed_int<V>)
    return sub(V(0), x);  // -INT_MIN wraps to INT_MIN
  else
    return -x;  // not 0 - x: -(+0) is -0
}

template <class V> XGRAD_HD V abs(const V& x) {
  if constexpr (signed_int<V>) {
    return x < V(0) ? neg(x) : x;  // abs(INT_MIN) wraps to INT_MIN
  } else {
#if defined(__CUDA_ARCH__)
    return std::abs(x);
#else
    return xsimd::abs(x);
#endif
  }
}

/// a / b: floating point as IEEE 754 (x / 0 is ±inf, 0 / 0 NaN); integers truncate toward zero
/// as C++ does, with x / 0 = 0 (NumPy's result) and INT_MIN / -1 = INT_MIN (the wrapped
/// quotient), so no input traps (SIGFPE). Branch-free, so integer loops still vectorize.
template <class V> XGRAD_HD V div(const V& a, const V& b) {
  if constexpr (std::is_integral_v<V>) {
    const bool zero = b == V(0);
    bool overflow = false;
    if constexpr (std::is_signed_v<V>) overflow = (a == std::numeric_limits<V>::min()) & (b == V(-1));
    // Either case divides by 1 instead: overflow then gives a / 1 = INT_MIN, the wrapped result.
    const V q = a / ((zero | overflow) ? V(1) : b);
    return zero ? V(0) : q;
  } else {
    return a / b;
  }
}

/// a ** b for integers: by repeated squaring, wrapping on overflow; a negative exponent gives the
/// real power truncated toward zero (1 for a = 1, ±1 for a = -1, else 0; 0 ** -n = 0 like x / 0).
template <class V> XGRAD_HD V ipow(V a, V b) {
  if (b < V(0)) {
    if (a == V(1)) return V(1);
    if (a == V(-1)) return (b & V(1)) ? V(-1) : V(1);
    return V(0);
  }
  V result(1);
  while (b != V(0)) {
    if (b & V(1)) result = mul(result, a);
    b = static_cast<V>(b >> 1);
    if (b != V(0)) a = mul(a, a);
  }
  return result;
}

/// a ** b as C's pow: xsimd 8.1's batch pow is exp(b * log|a|) with fix-ups that miss C's special
/// cases, which are put back here: pow(±0, b < 0) is +inf (±inf for odd integer b; xsimd gives 0),
/// pow(-0, odd b > 0) is -0, pow(0, NaN) NaN (xsimd: 0), pow(-inf, b) ±0 or ±inf (xsimd: NaN
/// for non-integer b), and pow(x, ±0), pow(1, y) and pow(-1, ±inf) are 1, NaN x or y included.
/// Scalars (the Thrust backend) call std::pow, which has them.
template <class V> XGRAD_HD V pow(const V& a, const V& b) {
#if defined(__CUDA_ARCH__)
  return std::pow(a, b);
#else
  if constexpr (xsimd::is_batch<V>::value) {
    using T = typename V::value_type;
    const V inf(std::numeric_limits<T>::infinity()), zero(T(0));
    const auto a_zero = a == zero, odd = xsimd::is_odd(b), negative = b < zero;
    // xsimd's formula, exp(b log|a|), through math::exp and math::log, which are defined for
    // every input and right on denormals (xsimd::pow calls xsimd's own).
    const V m = math::exp(b * math::log(xsimd::abs(a)));
    const V nan(std::numeric_limits<T>::quiet_NaN());
    V z =
        xsimd::select(a < zero, xsimd::select(xsimd::is_flint(b) | xsimd::isinf(b), xsimd::select(odd, -m, m), nan), m);
    z = xsimd::select(a_zero & negative, xsimd::select(odd, xsimd::copysign(inf, a), inf), z);
    z = xsimd::select(a_zero & (b > zero), xsimd::select(odd, a, zero), z);
    z = xsimd::select(a == -inf, xsimd::select(odd, -inf, inf), z);
    z = xsimd::select((a == -inf) & negative, xsimd::select(odd, -zero, zero), z);
    z = xsimd::select(xsimd::isnan(b), b, z);
    const auto one = (b == zero) | (a == V(T(1))) | ((a == V(T(-1))) & xsimd::isinf(b));
    return xsimd::select(one, V(T(1)), z);
  } else {
    return xsimd::pow(a, b);
  }
#endif
}

/// The larger of a and b, NaN when either is NaN (a when both are), as NumPy's maximum and
/// PyTorch's: a NaN counts as larger than every number. On ties (+0 and -0) it gives b, as x86's
/// maxps does, on scalars and batches alike so both agree bit for bit. Batches blend with a
/// NaN mask instead of branching, so the kernels keep their speed. The mask is xsimd::isnan, not
/// a != a: xsimd 8.1's batch != is an ordered compare on AVX (_CMP_NEQ_OQ), false for NaN.
template <class V> XGRAD_HD V max(const V& a, const V& b) {
  if constexpr (xsimd::is_batch<V>::value)
    return xsimd::select((a > b) | xsimd::isnan(a), a, b);
  else
    return (a > b || a != a) ? a : b;  // a != a is false for integers
}

/// The smaller of a and b, NaN when either is NaN (a when both are); b on ties (see max).
template <class V> XGRAD_HD V min(const V& a, const V& b) {
  if constexpr (xsimd::is_batch<V>::value)
    return xsimd::select((a < b) | xsimd::isnan(a), a, b);
  else
    return (a < b || a != a) ? a : b;
}

/// static_cast<U>(x) defined for every x, as Rust's `as`: a float to an integer truncates toward
/// zero, saturates to the integer type's min / max when out of range (±inf included) and maps
/// NaN to 0 (in C++ these are undefined behaviour). Every other conversion is C++'s own, which is
/// defined: to bool is x != 0 (NaN gives true), integers wrap modulo 2^bits (C++20), and a double
/// out of float's range becomes ±inf by IEEE 754 rounding.
template <class U, class T> XGRAD_HD U convert(const T& x) {
  if constexpr (std::is_floating_point_v<T> && signed_int<U>) {
    // -2^(bits-1) and 2^(bits-1) are exact in float and double; (lo, hi) converts exactly.
    constexpr T lo = static_cast<T>(std::numeric_limits<U>::min());
    constexpr T hi = -lo;
    if (x != x) return U(0);
    if (x <= lo) return std::numeric_limits<U>::min();
    if (x >= hi) return std::numeric_limits<U>::max();
    return static_cast<U>(x);
  } else {
    return static_cast<U>(x);
  }
}

/// a * b + c rounded once, on batches and on scalars alike, so both agree bit for bit.
/// xsimd 8's fma is a multiply then an add on AVX-512, so the batch form calls the
/// instructions itself, or std::fma per lane where there are none.
template <class V> XGRAD_HD V fma(const V& a, const V& b, const V& c) {
  if constexpr (xsimd::is_batch<V>::value) {
    using T = typename V::value_type;
    [[maybe_unused]] constexpr bool f32 = std::is_same_v<T, float>;
#if defined(__AVX512F__)
    if constexpr (sizeof(V) == 64 && f32) return V(_mm512_fmadd_ps(a, b, c));
    if constexpr (sizeof(V) == 64 && !f32) return V(_mm512_fmadd_pd(a, b, c));
#endif
#if defined(__FMA__)
    if constexpr (sizeof(V) == 32 && f32) return V(_mm256_fmadd_ps(a, b, c));
    if constexpr (sizeof(V) == 32 && !f32) return V(_mm256_fmadd_pd(a, b, c));
    if constexpr (sizeof(V) == 16 && f32) return V(_mm_fmadd_ps(a, b, c));
    if constexpr (sizeof(V) == 16 && !f32) return V(_mm_fmadd_pd(a, b, c));
#endif
    alignas(V::arch_type::alignment()) T x[V::size], y[V::size], z[V::size];
    a.store_aligned(x);
    b.store_aligned(y);
    c.store_aligned(z);
    for (std::size_t i = 0; i < V::size; ++i) x[i] = std::fma(x[i], y[i], z[i]);
    return V::load_aligned(x);
  } else {
    return std::fma(a, b, c);
  }
}

}  // namespace xgrad::math
