// Elementwise kernels: apply an op's `apply` body over (broadcast) inputs with xsimd batches.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include <xsimd/xsimd.hpp>
#if defined(__AVX__)
#include <immintrin.h>
#endif

// Without optimization GCC's AVX-512 intrinsics are macros whose casts reject xsimd 8's batch
// types (xsimd::log alone fails to compile): say so instead of a page of template errors.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__OPTIMIZE__) && defined(__AVX512BW__)
#error "xgrad with AVX-512 needs an optimized build (-Og, -O1 or higher; a CMake Debug build: add -Og)"
#endif

#include "xgrad/backend/cpu/thread_pool.hpp"
#include "xgrad/core/device.hpp"
#include "xgrad/core/shape.hpp"

namespace xgrad::cpu {

/// Elements per parallel_for chunk: big enough that waking a thread pays off.
inline constexpr std::int64_t kElementwiseGrain = 1 << 13;

/// The vector whose lane l holds l, as V's element type (window kernels offset it to positions).
template <class V> V lane_indices() {
  using T = typename V::value_type;
  alignas(64) std::array<T, V::size> lanes;
  for (std::size_t l = 0; l < V::size; ++l) lanes[l] = static_cast<T>(l);
  return V::load_aligned(lanes.data());
}

/// How N inputs are walked to produce an output: dims after merging axes that are contiguous
/// in every operand, and each input's element strides (0 along broadcast axes).
template <int N> struct BroadcastPlan {
  int rank = 0;
  std::array<std::int64_t, kMaxRank> dims{};
  std::array<std::array<std::int64_t, kMaxRank>, N> strides{};

  BroadcastPlan(const Shape& out, const std::array<const Shape*, N>& inputs) {
    // Strides of each input, aligned to the output's axes.
    std::array<std::array<std::int64_t, kMaxRank>, N> raw{};
    for (int k = 0; k < N; ++k) {
      const Shape& in = *inputs[k];
      std::int64_t step = 1;
      for (int i = out.ndim() - 1, j = in.ndim() - 1; i >= 0; --i, --j) {
        std::int64_t d = j >= 0 ? in[j] : 1;
        raw[k][i] = d == 1 ? 0 : step;
        step *= d;
      }
    }
    // Merge axis i into the previous one when every input steps across the seam uniformly.
    for (int i = 0; i < out.ndim(); ++i) {
      if (out[i] == 1) continue;  // size-1 axes carry no iteration
      bool merge = rank > 0;
      for (int k = 0; k < N && merge; ++k) merge = strides[k][rank - 1] == raw[k][i] * out[i];
      if (merge) {
        dims[rank - 1] *= out[i];
        for (int k = 0; k < N; ++k) strides[k][rank - 1] = raw[k][i];
      } else {
        dims[rank] = out[i];
        for (int k = 0; k < N; ++k) strides[k][rank] = raw[k][i];
        ++rank;
      }
    }
  }

  XGRAD_HD std::int64_t inner() const { return rank ? dims[rank - 1] : 1; }
  /// Rows of inner() elements: none when the output is empty (a [2^31, 0] output has no rows
  /// to walk, however many its outer axes count).
  XGRAD_HD std::int64_t outer() const {
    if (inner() == 0) return 0;
    std::int64_t n = 1;
    for (int i = 0; i + 1 < rank; ++i) n *= dims[i];
    return n;
  }
  /// Offset of outer row `row` in input k.
  XGRAD_HD std::int64_t row_offset(int k, std::int64_t row) const {
    std::int64_t off = 0;
    for (int i = rank - 2; i >= 0; --i) {
      off += (row % dims[i]) * strides[k][i];
      row /= dims[i];
    }
    return off;
  }
  XGRAD_HD std::int64_t inner_stride(int k) const { return rank ? strides[k][rank - 1] : 0; }
};

namespace detail {

/// Op bodies (XGRAD_HD under nvcc) must never see an xsimd batch in nvcc's device pass, which
/// rejects vector types in device code: there the CPU backend's loops take their scalar form.
template <class T> inline constexpr bool simd_type =
#if defined(__CUDA_ARCH__)
    false;
#else
    std::is_same_v<T, float> || std::is_same_v<T, double>;
#endif

template <class Op, class T>
concept SimdBody = simd_type<T> && requires(xsimd::batch<T> v) {
  { Op::apply(v) } -> std::same_as<xsimd::batch<T>>;
};
template <class Op, class T>
concept SimdBody2 = simd_type<T> && requires(xsimd::batch<T> v) {
  { Op::apply(v, v) } -> std::same_as<xsimd::batch<T>>;
};
/// A mask from batch<T>::size consecutive bools. xsimd's batch_bool::load_unaligned tests them
/// one by one; here each bool (one byte, 0 or 1) becomes a bit, eight through one multiply
/// (byte i lands on bit i of the top byte), and the bits become the mask: directly where masks
/// are registers of bits (AVX-512), else each lane testing its own bit.
template <class T> xsimd::batch_bool<T> load_mask(const bool* p) {
  using B = xsimd::batch_bool<T>;
  constexpr std::size_t n = B::size;
  std::uint64_t bits = 0;
  for (std::size_t k = 0; k < n; k += 8) {
    std::uint64_t word = 0;
    std::memcpy(&word, p + k, std::min<std::size_t>(8, n - k));
    bits |= ((word * 0x0102040810204080ull) >> 56) << k;
  }
  if constexpr (std::is_base_of_v<xsimd::avx512f, typename xsimd::batch<T>::arch_type>) {
    return B(static_cast<typename B::register_type>(bits));
  } else {
    using I = xsimd::batch<xsimd::as_integer_t<T>>;
    using Int = xsimd::as_integer_t<T>;
    alignas(I::arch_type::alignment()) Int lane_bit[I::size];
    for (std::size_t j = 0; j < I::size; ++j) lane_bit[j] = Int(1) << j;
    return xsimd::to_float(I(static_cast<Int>(bits)) & I::load_aligned(lane_bit)) != xsimd::batch<T>(T(0));
  }
}

#if defined(__AVX__)
/// AVX's mask for the first n lanes of a 256-bit vector of T: all ones in those lanes.
template <class T> __m256i head_mask_avx(std::int64_t n) {
  using Int = std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>;
  constexpr std::size_t lanes = 32 / sizeof(T);
  static constexpr auto ones_then_zeros = [] {
    std::array<Int, 2 * lanes> t{};
    for (std::size_t l = 0; l < lanes; ++l) t[l] = -1;
    return t;
  }();
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ones_then_zeros.data() + lanes - n));
}
#endif

/// The first n (0 <= n <= batch size) elements at p as a batch whose other lanes are 0, and the
/// first n lanes of v stored to p: a run's tail. Masked moves where the target has them (AVX,
/// AVX-512): a copy through a stack buffer leaves narrow stores that the wide load cannot take
/// its data from (a blocked store forward: stalls that took a quarter of a fused softmax over
/// rows of 1000); elsewhere that copy.
template <class T> xsimd::batch<T> load_head(const T* p, std::int64_t n) {
  using V = xsimd::batch<T>;
  using Arch = typename V::arch_type;
#if defined(__AVX512F__)
  if constexpr (std::is_base_of_v<xsimd::avx512f, Arch>) {
    if constexpr (std::is_same_v<T, float>)
      return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p);
    else
      return _mm512_maskz_loadu_pd(static_cast<__mmask8>((1u << n) - 1), p);
  }
#endif
#if defined(__AVX__)
  if constexpr (std::is_base_of_v<xsimd::avx, Arch>) {
    if constexpr (std::is_same_v<T, float>)
      return _mm256_maskload_ps(p, head_mask_avx<T>(n));
    else
      return _mm256_maskload_pd(p, head_mask_avx<T>(n));
  }
#endif
  alignas(Arch::alignment()) T lanes[V::size] = {};
  std::copy(p, p + n, lanes);
  return V::load_aligned(lanes);
}
template <class T> void store_head(const xsimd::batch<T>& v, T* p, std::int64_t n) {
  using V = xsimd::batch<T>;
  using Arch = typename V::arch_type;
#if defined(__AVX512F__)
  if constexpr (std::is_base_of_v<xsimd::avx512f, Arch>) {
    if constexpr (std::is_same_v<T, float>)
      _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1), v);
    else
      _mm512_mask_storeu_pd(p, static_cast<__mmask8>((1u << n) - 1), v);
    return;
  }
#endif
#if defined(__AVX__)
  if constexpr (std::is_base_of_v<xsimd::avx, Arch>) {
    if constexpr (std::is_same_v<T, float>)
      _mm256_maskstore_ps(p, head_mask_avx<T>(n), v);
    else
      _mm256_maskstore_pd(p, head_mask_avx<T>(n), v);
    return;
  }
#endif
  alignas(Arch::alignment()) T lanes[V::size];
  v.store_aligned(lanes);
  std::copy(lanes, lanes + n, p);
}

/// A ternary op's first operand as a batch: a mask when it is bool (where's condition).
template <class C, class T> inline constexpr bool simd_first = std::is_same_v<C, T> || std::is_same_v<C, bool>;
template <class C, class T> using FirstBatch =
    std::conditional_t<std::is_same_v<C, bool>, xsimd::batch_bool<T>, xsimd::batch<T>>;
template <class Op, class C, class T>
concept SimdBody3 = simd_type<T> && simd_first<C, T> && requires(FirstBatch<C, T> c, xsimd::batch<T> v) {
  { Op::apply(c, v, v) } -> std::same_as<xsimd::batch<T>>;
};

/// Calls f(load...) with one element loader per (pointer, stride) pair, in order: p[i] for
/// stride 1, p[0] read once for stride 0. Each stride pattern gets a loop of its own with no
/// stride arithmetic in it, which the compiler vectorizes where the op has no batch body
/// (comparisons writing bool, where reading a bool condition, integers).
template <class F> void with_loaders(F&& f) { f(); }
template <class F, class P, class... Rest>
void with_loaders(F&& f, const P* p, std::int64_t stride, const Rest&... rest) {
  if (stride)
    with_loaders([&](auto... more) { f([p](std::int64_t i) { return p[i]; }, more...); }, rest...);
  else
    with_loaders([&](auto... more) { f([v = *p](std::int64_t) { return v; }, more...); }, rest...);
}

/// One contiguous run of a unary op.
template <class Op, class T, class R> void unary_run(const T* x, R* y, std::int64_t n) {
  if constexpr (std::is_same_v<T, R> && SimdBody<Op, T>) {
    using V = xsimd::batch<T>;
    constexpr auto w = static_cast<std::int64_t>(V::size);
    std::int64_t i = 0;
    for (; i + w <= n; i += w) Op::apply(V::load_unaligned(x + i)).store_unaligned(y + i);
    // The tail goes through the batch code too: xsimd's batch exp and std::exp can differ in
    // the last bit, and an element must get the same bits wherever a run (eager's, or a fused
    // block's) happens to end.
    if (i < n) store_head(Op::apply(load_head(x + i, n - i)), y + i, n - i);
  } else {
    for (std::int64_t i = 0; i < n; ++i) y[i] = static_cast<R>(Op::apply(x[i]));
  }
}

/// One run of a binary op; each input's stride is 0 (broadcast) or 1.
template <class Op, class A, class B, class R>
void binary_run(const A* a, std::int64_t sa, const B* b, std::int64_t sb, R* out, std::int64_t n) {
  if constexpr (std::is_same_v<A, B> && std::is_same_v<A, R> && SimdBody2<Op, A>) {
    using V = xsimd::batch<A>;
    constexpr auto w = static_cast<std::int64_t>(V::size);
    std::int64_t i = 0;
    // One loop per stride pattern, so no load tests a stride.
    auto batches = [&](auto load_a, auto load_b) {
      for (; i + w <= n; i += w) Op::apply(load_a(i), load_b(i)).store_unaligned(out + i);
    };
    auto contiguous = [](const A* p) { return [p](std::int64_t k) { return V::load_unaligned(p + k); }; };
    auto broadcast = [](const A* p) { return [v = V(p[0])](std::int64_t) { return v; }; };
    if (sa && sb)
      batches(contiguous(a), contiguous(b));
    else if (sa)
      batches(contiguous(a), broadcast(b));
    else if (sb)
      batches(broadcast(a), contiguous(b));
    else
      batches(broadcast(a), broadcast(b));
    if (i < n) {  // the tail through the same batch code (see unary_run)
      auto head = [&](const A* p, std::int64_t stride) { return stride ? load_head(p + i, n - i) : V(p[0]); };
      store_head(Op::apply(head(a, sa), head(b, sb)), out + i, n - i);
    }
  } else {
    with_loaders(
        [&](auto load_a, auto load_b) {
          for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<R>(Op::apply(load_a(i), load_b(i)));
        },
        a, sa, b, sb);
  }
}

/// One run of a ternary op (where, fma); each input's stride is 0 or 1.
template <class Op, class C, class A, class B, class R> void ternary_run(const C* c, std::int64_t sc, const A* a,
                                                                         std::int64_t sa, const B* b, std::int64_t sb,
                                                                         R* out, std::int64_t n) {
  if constexpr (std::is_same_v<A, B> && std::is_same_v<A, R> && SimdBody3<Op, C, A>) {
    using V = xsimd::batch<A>;
    using CV = FirstBatch<C, A>;
    constexpr auto w = static_cast<std::int64_t>(V::size);
    // A stride-0 input is one value for every lane; the test is the same every batch.
    auto load = []<class P>(const P* p, std::int64_t stride, std::int64_t i) {
      using PV = std::conditional_t<std::is_same_v<P, C>, CV, V>;
      if constexpr (std::is_same_v<P, bool>)
        return stride ? load_mask<A>(p + i) : PV(*p);
      else
        return stride ? PV::load_unaligned(p + i) : PV(*p);
    };
    std::int64_t i = 0;
    for (; i + w <= n; i += w) Op::apply(load(c, sc, i), load(a, sa, i), load(b, sb, i)).store_unaligned(out + i);
    if (i < n) {  // the tail through the same batch code (see unary_run)
      auto head = [&]<class P>(const P* p, std::int64_t stride) {
        if constexpr (std::is_same_v<P, bool>) {
          bool lanes[V::size] = {};
          for (std::int64_t j = i; j < n; ++j) lanes[j - i] = p[j * stride];
          return load_mask<A>(lanes);
        } else {
          return stride ? load_head(p + i, n - i) : V(p[0]);
        }
      };
      store_head(Op::apply(head(c, sc), head(a, sa), head(b, sb)), out + i, n - i);
    }
  } else {
    with_loaders(
        [&](auto load_c, auto load_a, auto load_b) {
          for (std::int64_t i = 0; i < n; ++i) out[i] = Op::apply(load_c(i), load_a(i), load_b(i));
        },
        c, sc, a, sa, b, sb);
  }
}

}  // namespace detail

/// y[i] = Op::apply(x[i]) over n contiguous elements, in parallel when large.
template <class Op, class T, class R> void map_unary(const T* x, R* y, std::int64_t n) {
  parallel_for(0, n, kElementwiseGrain,
               [&](std::int64_t lo, std::int64_t hi) { detail::unary_run<Op>(x + lo, y + lo, hi - lo); });
}

/// out = Op::apply(a, b) with NumPy broadcasting, as laid out by `plan`.
template <class Op, class A, class B, class R>
void map_binary(const BroadcastPlan<2>& plan, const A* a, const B* b, R* out) {
  const std::int64_t inner = plan.inner(), outer = plan.outer();
  const std::int64_t sa = plan.inner_stride(0), sb = plan.inner_stride(1);
  if (outer == 1) {
    parallel_for(0, inner, kElementwiseGrain, [&](std::int64_t lo, std::int64_t hi) {
      detail::binary_run<Op>(a + lo * sa, sa, b + lo * sb, sb, out + lo, hi - lo);
    });
    return;
  }
  const std::int64_t grain = std::max<std::int64_t>(1, kElementwiseGrain / std::max<std::int64_t>(inner, 1));
  parallel_for(0, outer, grain, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t row = lo; row < hi; ++row)
      detail::binary_run<Op>(a + plan.row_offset(0, row), sa, b + plan.row_offset(1, row), sb, out + row * inner,
                             inner);
  });
}

/// out = Op::apply(c, a, b) with broadcasting (where, fma).
template <class Op, class C, class A, class B, class R>
void map_ternary(const BroadcastPlan<3>& plan, const C* c, const A* a, const B* b, R* out) {
  const std::int64_t inner = plan.inner(), outer = plan.outer();
  const std::int64_t sc = plan.inner_stride(0), sa = plan.inner_stride(1), sb = plan.inner_stride(2);
  if (outer == 1) {
    parallel_for(0, inner, kElementwiseGrain, [&](std::int64_t lo, std::int64_t hi) {
      detail::ternary_run<Op>(c + lo * sc, sc, a + lo * sa, sa, b + lo * sb, sb, out + lo, hi - lo);
    });
    return;
  }
  parallel_for(0, outer, std::max<std::int64_t>(1, kElementwiseGrain / std::max<std::int64_t>(inner, 1)),
               [&](std::int64_t lo, std::int64_t hi) {
                 for (std::int64_t row = lo; row < hi; ++row)
                   detail::ternary_run<Op>(c + plan.row_offset(0, row), sc, a + plan.row_offset(1, row), sa,
                                           b + plan.row_offset(2, row), sb, out + row * inner, inner);
               });
}

// Block kernels: an op over one contiguous block of a fused group (backend/cpu/fused.hpp),
// through the same runs as the whole-tensor drivers above.

template <class Op, class T, class R>
void unary_block(const void* const* in, const std::int64_t*, void* out, std::int64_t n) {
  detail::unary_run<Op>(static_cast<const T*>(in[0]), static_cast<R*>(out), n);
}

template <class Op, class T, class R>
void binary_block(const void* const* in, const std::int64_t* stride, void* out, std::int64_t n) {
  detail::binary_run<Op>(static_cast<const T*>(in[0]), stride[0], static_cast<const T*>(in[1]), stride[1],
                         static_cast<R*>(out), n);
}

/// A broadcast's block kernel: in a fused group its input is already laid out for the block
/// (gathered, or a scalar at stride 0), so it copies.
template <class T> void copy_block(const void* const* in, const std::int64_t* stride, void* out, std::int64_t n) {
  const T* x = static_cast<const T*>(in[0]);
  T* y = static_cast<T*>(out);
  if (stride[0] == 0)
    std::fill_n(y, n, *x);
  else
    std::copy_n(x, n, y);
}

template <class Op, class C, class T>
void ternary_block(const void* const* in, const std::int64_t* stride, void* out, std::int64_t n) {
  detail::ternary_run<Op>(static_cast<const C*>(in[0]), stride[0], static_cast<const T*>(in[1]), stride[1],
                          static_cast<const T*>(in[2]), stride[2], static_cast<T*>(out), n);
}

// Merged block kernels: a unary op and one cheap neighbour of its fused group (the op feeding
// it, or the op it feeds) in one loop, the value between them kept in a register instead of a
// scratch block. Each op still runs its own batch body, so results are bitwise those of the
// two block kernels one after the other.

namespace detail {

/// Operands of a batch body: 2 or 3 (binary ops, fma).
template <class Op, class T> inline constexpr std::size_t batch_arity = SimdBody3<Op, T, T> ? 3 : 2;

/// v, hidden from the optimizer: a value passed between two ops' bodies must be rounded as when
/// it went through memory. Without this GCC (-ffp-contract=fast, its default) may fuse a multiply
/// ending one body and an add starting the next into one fma: square(x) + y rounded once.
template <class V> V opaque(V v) {
  auto reg = v.data;
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  asm("" : "+v"(reg));
#elif defined(__GNUC__) && defined(__aarch64__)
  asm("" : "+w"(reg));
#endif
  return V(reg);
}

/// out[i] = f(operand batches) over n elements of K operands of stride 0 or 1. A stride-0
/// operand is read from a batch filled with it, so the loop has no branch on strides; the tail
/// runs through the same batch code on zero-padded lanes (see unary_run).
template <std::size_t K, class T, class F>
void merged_run(const void* const* in, const std::int64_t* stride, T* out, std::int64_t n, F&& f) {
  using V = xsimd::batch<T>;
  constexpr auto w = static_cast<std::int64_t>(V::size);
  alignas(V::arch_type::alignment()) T filled[K][V::size];
  std::array<const T*, K> p;
  std::array<std::int64_t, K> step;
  for (std::size_t k = 0; k < K; ++k) {
    const T* x = static_cast<const T*>(in[k]);
    step[k] = stride[k] ? w : 0;
    if (stride[k]) {
      p[k] = x;
    } else {
      V(*x).store_aligned(filled[k]);
      p[k] = filled[k];
    }
  }
  auto batch = [&]<std::size_t... k>(std::index_sequence<k...>, auto load) { return f(load(k)...); };
  constexpr auto operands = std::make_index_sequence<K>{};
  std::int64_t i = 0;
  for (; i + w <= n; i += w) {
    batch(operands, [&](std::size_t k) { return V::load_unaligned(p[k]); }).store_unaligned(out + i);
    for (std::size_t k = 0; k < K; ++k) p[k] += step[k];
  }
  if (i < n) {
    const auto head = [&](std::size_t k) { return stride[k] ? load_head(p[k], n - i) : V::load_aligned(p[k]); };
    store_head(batch(operands, head), out + i, n - i);
  }
}

/// Whether every one of src[0, n) is finite: x - x is 0 for a number and NaN for an infinity or
/// a NaN, and a NaN stays in the running sum.
template <class T> bool all_finite(const T* src, int64_t n) {
  using V = xsimd::batch<T>;
  constexpr int64_t L = static_cast<int64_t>(V::size);
  V acc(T(0));
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const V v = V::load_unaligned(src + i);
    acc += v - v;
  }
  bool finite = xsimd::all(acc == V(T(0)));
  for (; i < n; ++i) finite &= std::isfinite(src[i]);
  return finite;
}

}  // namespace detail

/// Op(P(a, b[, c])): P's operands are the kernel's inputs.
template <class Op, class P, class T>
void unary_after_block(const void* const* in, const std::int64_t* stride, void* out, std::int64_t n) {
  if constexpr (detail::simd_type<T>)  // false in nvcc's device pass, which cannot hold batches
    detail::merged_run<detail::batch_arity<P, T>>(in, stride, static_cast<T*>(out), n, [](const auto&... v) {
      return Op::apply(detail::opaque(P::apply(v...)));
    });
}

/// E(..., Op(x), ...) with Op(x) as E's operand `pos`: input 0 is x, then E's other operands.
template <class Op, class E, std::size_t pos, class T>
void unary_into_block(const void* const* in, const std::int64_t* stride, void* out, std::int64_t n) {
  constexpr std::size_t arity = detail::batch_arity<E, T>;
  if constexpr (detail::simd_type<T>)  // false in nvcc's device pass, which cannot hold batches
    detail::merged_run<arity>(in, stride, static_cast<T*>(out), n, [](const auto& x, const auto&... rest) {
      const auto u = detail::opaque(Op::apply(x));
      const auto others = std::tie(rest...);
      auto operand = [&]<std::size_t j>(std::integral_constant<std::size_t, j>) -> const auto& {
        if constexpr (j == pos)
          return u;
        else
          return std::get<(j < pos ? j : j - 1)>(others);
      };
      return [&]<std::size_t... j>(std::index_sequence<j...>) {
        return E::apply(operand(std::integral_constant<std::size_t, j>{})...);
      }
      (std::make_index_sequence<arity>{});
    });
}

}  // namespace xgrad::cpu
