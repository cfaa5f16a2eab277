// The op-call fuzzer's machinery (fuzz_ops.cpp has the harness): interesting values, the
// reader of an op's choices (In), the dtype choice and the row macros. The op table is split
// over fuzz_ops.cpp, fuzz_ops_shapes.cpp and fuzz_ops_nn.cpp so that its parts compile in
// parallel; new rows go at the end of the last part, so that saved inputs keep their row.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <xgrad/xgrad.hpp>

#include "fuzz_support.hpp"

namespace xg = xgrad;
namespace xf = xgrad::fuzz;

namespace xgrad::fuzz::ops {

using I32 = std::int32_t;
using I64 = std::int64_t;
template <class T> using Tn = xg::Tensor<T>;
template <class T> using Tv = std::vector<xg::Tensor<T>>;

// ---- Interesting values ---------------------------------------------------------------------

constexpr I64 kI64Max = std::numeric_limits<I64>::max();
constexpr I64 kI64Min = std::numeric_limits<I64>::min();
constexpr I64 kI32Max = std::numeric_limits<I32>::max();
constexpr I64 kI32Min = std::numeric_limits<I32>::min();

/// Sizes, axes, strides, counts: small ones most often, then the edges of every integer type.
constexpr I64 kInts[] = {0,
                         1,
                         2,
                         3,
                         -1,
                         4,
                         5,
                         -2,
                         7,
                         8,
                         16,
                         -3,
                         64,
                         1000,
                         65536,
                         kI32Max,
                         kI32Min,
                         I64{1} << 31,
                         I64{1} << 32,
                         I64{1} << 40,
                         I64{1} << 62,
                         kI64Max,
                         kI64Min,
                         kI64Min + 1,
                         kI64Max - 1,
                         -(I64{1} << 40),
                         I64{1} << 20};
/// Dimensions of input tensors: mostly small, sometimes 0 and rarely huge (with a 0 elsewhere
/// that still makes an empty tensor).
constexpr I64 kDims[] = {1, 2, 3, 0, 1, 2, 4, 5, 1, 3, 0, 2, 6, 1, 2, 7};
constexpr I64 kHugeDims[] = {I64{1} << 31, I64{1} << 40, kI64Max, I64{1} << 62, -1, kI32Max};

template <class T> T interesting_value(xf::Bytes& in) {
  using L = std::numeric_limits<T>;
  const std::uint8_t c = in.u8();
  if constexpr (std::is_same_v<T, bool>) {
    return c & 1;
  } else if constexpr (std::is_floating_point_v<T>) {
    const T table[] = {T(0),         T(1),         T(-1),     T(0.5),   T(2),       T(-0.0),          T(3),
                       T(-2.5),      T(100),       T(1e-3),   T(89),    T(-89),     L::quiet_NaN(),   L::infinity(),
                       -L::infinity(), L::max(),   L::lowest(), L::min(), L::denorm_min(), T(1e30), T(-1e30),
                       L::epsilon(), T(0.1),       T(7)};
    constexpr std::size_t n = sizeof table / sizeof table[0];
    if (c < 2 * n) return table[c % n];
    // Raw bits: any value at all, signalling NaNs and payloads included.
    T v;
    std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t> bits;
    bits = static_cast<decltype(bits)>(in.u64());
    std::memcpy(&v, &bits, sizeof v);
    return v;
  } else {
    const T table[] = {T(0), T(1), T(-1), T(2), T(-2), T(3), T(7), L::max(), L::min(), T(L::max() - 1), T(L::min() + 1),
                       T(255), static_cast<T>(65536), T(10)};
    constexpr std::size_t n = sizeof table / sizeof table[0];
    if (c < 2 * n) return table[c % n];
    return static_cast<T>(in.u64());
  }
}

// ---- The reader of an op's choices ------------------------------------------------------------

/// Eager vs. jit: which way a row's call runs.
enum class How { eager, backward, jit };

class In : public xf::Bytes {
 public:
  using Bytes::Bytes;

  I64 any_int() {
    const std::uint8_t c = u8();
    constexpr std::size_t n = sizeof kInts / sizeof kInts[0];
    if (c < 3 * n) return kInts[c % n];
    return static_cast<I64>(u64());
  }
  /// An axis for a tensor of `rank`: usually in [-rank, rank), sometimes just outside, sometimes anything.
  I64 axis(int rank) {
    const std::uint8_t c = u8();
    if (c < 200) return static_cast<I64>(c % (2 * rank + 3)) - rank - 1;
    return any_int();
  }
  std::vector<I64> axes(int rank) {
    std::vector<I64> out(pick(rank + 2));
    for (auto& a : out) a = axis(rank);
    return out;
  }
  /// Sizes for a shape argument (reshape, broadcast_to, a factory): anything at all, except
  /// that a valid shape of 2^20 to 2^26 elements is cut to at most 2^20. Such a result is
  /// legitimate and merely slow to fill under the sanitizers (seconds); smaller ones, and
  /// larger ones (which the allocation cap or the library refuses at once), are kept.
  std::vector<I64> sizes() {
    std::vector<I64> out(pick(10) < 8 ? pick(5) : pick(10));  // ranks 0-4, rarely up to 9
    for (auto& d : out) d = u8() < 192 ? kDims[u8() % 16] : any_int();
    auto elements = [&] {
      I64 n = 1;
      for (I64 d : out) {
        if (d <= 0) return I64{0};
        n = d > (I64{1} << 40) / n ? I64{1} << 40 : n * d;  // saturates far above 2^26
      }
      return n;
    };
    for (I64 n = elements(); n > (I64{1} << 20) && n <= (I64{1} << 26); n = elements())
      *std::max_element(out.begin(), out.end()) /= 2;
    return out;
  }

  /// A shape for an input tensor, rank 0-4: small dims, a 0 now and then; rarely a huge dim,
  /// kept only where another 0 makes the tensor empty.
  xg::Shape input_shape() {
    const int rank = static_cast<int>(pick(5));
    std::vector<I64> dims(static_cast<std::size_t>(rank));
    bool zero = false;
    for (auto& d : dims) {
      const std::uint8_t c = u8();
      d = c < 240 ? kDims[c % 16] : kHugeDims[c % 6];
      zero |= d == 0;
    }
    I64 numel = 1;
    for (auto& d : dims) {
      if (d < 0 || (!zero && d > 7)) d = 1;  // a negative dim is a factory's business, not an input's
      if (d > 0 && numel <= 4096) numel *= std::min<I64>(d, 4097);
    }
    if (!zero && numel > 4096)
      for (auto& d : dims) d = std::min<I64>(d, 2);
    return xg::Shape(dims);
  }
  /// A tensor of `shape` holding fuzzer-chosen values (a short pattern, repeated).
  template <class T> Tn<T> tensor(const xg::Shape& shape) {
    auto t = xg::zeros<T>(shape);
    const std::size_t n = static_cast<std::size_t>(t.numel());
    if (n == 0) return t;
    std::vector<T> pattern(1 + pick(8));
    for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = interesting_value<T>(*this);
    T* p = t.data();
    for (std::size_t i = 0; i < n; ++i) p[i] = pattern[i % pattern.size()];
    return t;
  }
  template <class T> Tn<T> tensor() { return tensor<T>(input_shape()); }
  /// Class labels: mostly in [0, classes), sometimes anything.
  Tn<I32> labels(const xg::Shape& shape, I64 classes) {
    auto t = tensor<I32>(shape);
    const bool wild = pick(4) == 0;
    for (I64 i = 0; i < t.numel() && !wild && classes > 0; ++i) {
      I64 v = t.data()[i] % classes;
      t.data()[i] = static_cast<I32>(v < 0 ? v + classes : v);
    }
    return t;
  }
  template <class T> Tv<T> tensors() {
    Tv<T> out(pick(4));
    const xg::Shape shape = input_shape();
    for (auto& t : out) t = tensor<T>(pick(3) ? shape : input_shape());  // mostly alike, sometimes not
    return out;
  }
  template <class T> T value() { return interesting_value<T>(*this); }
  xg::PadMode pad_mode() { return static_cast<xg::PadMode>(pick(3)); }
  xg::Reduction reduction() { return static_cast<xg::Reduction>(pick(3)); }

  /// Calls f(args...) the way the next byte says: eagerly; eagerly with backward() through the
  /// result (every floating-point input requiring grad); or eagerly and then jitted, checking
  /// that both refuse or both give the same result. f returns one tensor.
  template <class F, class... A> void run(F f, const A&... args) {
    using R = decltype(f(args...));
    static_assert(std::is_base_of_v<xg::TensorBase, R>, "run() takes a row function returning one tensor");
    Pack packed;
    (pack(packed, args), ...);
    run_erased(erase(std::move(f), args...), packed, slot<typename R::value_type>);
  }
  /// For rows that change their input in place: eager only.
  template <class F, class... A> void run_eager(F f, const A&... args) {
    using R = std::decay_t<decltype(f(args...))>;
    if constexpr (std::is_base_of_v<xg::TensorBase, R>)
      check_tensor(f(args...));
    else
      (void)f(args...);
  }

 private:
  // Every row runs through one function type, Erased: the arguments travel as a Pack, one
  // vector of tensors per dtype, from which the row's own function is unpacked. So the three
  // ways to run, and xg::jit, are compiled once rather than once per row and dtype.
  using Pack = std::tuple<Tv<float>, Tv<double>, Tv<I32>, Tv<I64>, Tv<bool>>;
  using Erased = std::function<Pack(const Pack&)>;
  template <class T> static constexpr std::size_t slot = std::is_same_v<T, float>    ? 0
                                                         : std::is_same_v<T, double> ? 1
                                                         : std::is_same_v<T, I32>    ? 2
                                                         : std::is_same_v<T, I64>    ? 3
                                                                                     : 4;
  template <class X> static void pack(Pack& p, const X& x) {
    if constexpr (std::is_base_of_v<xg::TensorBase, X>) {
      std::get<slot<typename X::value_type>>(p).push_back(x);
    } else {
      for (const auto& t : x) pack(p, t);
    }
  }
  template <class X> static X unpack(const Pack& p, std::array<std::size_t, 5>& cursor, std::size_t count) {
    if constexpr (std::is_base_of_v<xg::TensorBase, X>) {
      constexpr std::size_t k = slot<typename X::value_type>;
      return std::get<k>(p).at(cursor[k]++);
    } else {
      X out;
      for (std::size_t i = 0; i < count; ++i) out.push_back(unpack<typename X::value_type>(p, cursor, 1));
      return out;
    }
  }
  template <class X> static std::size_t count_of(const X& x) {
    if constexpr (std::is_base_of_v<xg::TensorBase, X>)
      return 1;
    else
      return x.size();
  }
  template <class F, class... A> static Erased erase(F f, const A&... args) {
    const std::array<std::size_t, sizeof...(A)> counts{count_of(args)...};
    return [f = std::move(f), counts](const Pack& p) {
      std::array<std::size_t, 5> cursor{};
      std::size_t i = 0;
      std::tuple<A...> xs{unpack<A>(p, cursor, counts[i++])...};  // braced: in order
      (void)counts;
      (void)i;
      Pack out;
      pack(out, std::apply(f, xs));
      return out;
    };
  }
  /// Calls visit(vector of tensors) for each dtype's vector of p, float first.
  template <class P, class Visit> static void each_slot(P& p, Visit visit) {
    std::apply([&](auto&... tensors) { (visit(tensors), ...); }, p);
  }

  void run_erased(const Erased& f, const Pack& args, std::size_t result_slot) {
    const std::uint8_t c = u8();
    const How how = c % 4 == 3 ? How::jit : c % 4 == 2 ? How::backward : How::eager;
    const auto level = static_cast<xg::JitLevel>((c >> 2) % 3);
    if (how == How::eager) {
      check_result(f(args), result_slot, "an op");
    } else if (how == How::backward) {
      Pack inputs = args;
      each_slot(inputs, [](auto& tensors) {
        for (auto& t : tensors) t = requiring_grad(t);
      });
      const Pack out = f(inputs);
      check_result(out, result_slot, "an op");
      each_slot(out, [](const auto& tensors) {
        if constexpr (is_float_tensor<typename std::decay_t<decltype(tensors)>::value_type>)
          for (auto y : tensors)
            if (y.requires_grad()) y.backward();
      });
      each_slot(inputs, [](const auto& tensors) {
        for (const auto& t : tensors) check_grad(t);
      });
    } else {
      Pack eager;
      std::string eager_error;
      try {
        eager = f(args);
      } catch (const std::invalid_argument& e) {  // xgrad's ValueError, ShapeError
        eager_error = e.what();
      }
      Pack jitted;
      std::string jit_error;
      try {
        jitted = xg::jit(f, {.level = level, .strict = true, .poison_freed_buffers = true})(args);
      } catch (const std::invalid_argument& e) {
        jit_error = e.what();
      }
      if (eager_error.empty() != jit_error.empty())
        xf::finding("eager and jit disagree: one refuses, the other does not",
                    "eager: " + (eager_error.empty() ? std::string("ok") : eager_error) +
                        "\n    jit: " + (jit_error.empty() ? std::string("ok") : jit_error));
      if (!eager_error.empty()) throw xg::ValueError(eager_error);  // a refusal, both ways
      check_result(eager, result_slot, "an op");
      check_result(jitted, result_slot, "jit");
      same_result(eager, jitted);
    }
  }

  template <class X> static constexpr bool is_float_tensor =
      std::is_same_v<X, Tn<float>> || std::is_same_v<X, Tn<double>>;

  template <class X> static X requiring_grad(const X& x) {
    if constexpr (is_float_tensor<X>) {
      auto y = x.detach();
      y.set_requires_grad(true);
      return y;
    } else {
      return x;
    }
  }
  template <class X> static void check_grad(const X& x) {
    if constexpr (is_float_tensor<X>) {
      const auto g = x.grad();
      if (g.defined()) {
        if (!(g.shape() == x.shape())) xf::finding("a gradient's shape differs from its input's");
        (void)g.to_vector();
      }
    }
  }
  /// A call's result: one tensor, of the row's dtype.
  static void check_result(const Pack& r, std::size_t result_slot, const char* who) {
    std::size_t count = 0, in_slot = 0, k = 0;
    each_slot(r, [&](const auto& tensors) {
      count += tensors.size();
      if (k++ == result_slot) in_slot = tensors.size();
      for (const auto& t : tensors) check_tensor(t);
    });
    if (count != 1 || in_slot != 1)
      xf::finding(std::string(who) + " returned " + std::to_string(count) + " tensors, or one of the wrong dtype");
  }
  template <class R> static void check_tensor(const R& r) {
    using T = typename R::value_type;
    if (!r.defined()) xf::finding("an op returned an undefined tensor");
    if (r.dtype() != xg::dtype_of<T>()) xf::finding("an op returned a tensor of the wrong dtype");
    I64 n = 1;
    for (I64 d : r.shape()) {
      if (d < 0) xf::finding("an op returned a negative dimension");
      n = d == 0 || n == 0 ? 0 : n * d;  // the library has checked that this fits
    }
    if (r.numel() != n) xf::finding("an op returned a tensor whose numel is not its shape's product");
    (void)r.to_vector();  // reads every element: ASan sees storage smaller than the shape
  }
  /// Eager's and jit's results: the same shapes and bits.
  static void same_result(const Pack& a, const Pack& b) {
    [&]<std::size_t... k>(std::index_sequence<k...>) { (same_tensors(std::get<k>(a), std::get<k>(b)), ...); }
    (std::make_index_sequence<std::tuple_size_v<Pack>>{});
  }
  template <class T> static void same_tensors(const Tv<T>& xs, const Tv<T>& ys) {
    for (std::size_t i = 0; i < xs.size() && i < ys.size(); ++i) same_tensor(xs[i], ys[i]);
  }
  template <class R> static void same_tensor(const R& a, const R& b) {
    if (!(a.shape() == b.shape())) xf::finding("eager and jit give different shapes");
    const auto x = a.to_vector(), y = b.to_vector();
    for (std::size_t i = 0; i < x.size(); ++i) {
      if constexpr (std::is_floating_point_v<typename R::value_type>) {
        if (std::isnan(x[i]) && std::isnan(y[i])) continue;
      }
      const typename R::value_type xi = x[i], yi = y[i];
      if (std::memcmp(&xi, &yi, sizeof xi) != 0 && !(xi == yi))
        xf::finding("eager and strict jit give different values", "at flat index " + std::to_string(i));
    }
  }
};

// ---- Type choice --------------------------------------------------------------------------

enum : unsigned { kF32 = 1, kF64 = 2, kI32 = 4, kI64 = 8, kBool = 16 };
constexpr unsigned kFloat = kF32 | kF64, kInt = kI32 | kI64, kNum = kFloat | kInt, kAll = kNum | kBool;

/// Calls body(std::type_identity<T>{}) for one of the dtypes in Mask, chosen by the next byte.
template <unsigned Mask, class Body> void with_type(In& in, Body&& body) {
  const int count = std::popcount(Mask);
  int choice = static_cast<int>(in.pick(static_cast<std::size_t>(count)));
  if constexpr ((Mask & kF32) != 0)
    if (choice-- == 0) return body(std::type_identity<float>{});
  if constexpr ((Mask & kF64) != 0)
    if (choice-- == 0) return body(std::type_identity<double>{});
  if constexpr ((Mask & kI32) != 0)
    if (choice-- == 0) return body(std::type_identity<I32>{});
  if constexpr ((Mask & kI64) != 0)
    if (choice-- == 0) return body(std::type_identity<I64>{});
  if constexpr ((Mask & kBool) != 0)
    if (choice-- == 0) return body(std::type_identity<bool>{});
}

/// A binary op as tensor-tensor, tensor-scalar or (unless ScalarLeft is false) scalar-tensor.
template <class T, bool ScalarLeft = true, class F> void binary(In& in, F f) {
  switch (in.pick(ScalarLeft ? 3 : 2)) {
    case 0:
      return in.run([f](const Tn<T>& a, const Tn<T>& b) { return f(a, b); }, in.tensor<T>(), in.tensor<T>());
    case 1: {
      const T s = in.value<T>();
      return in.run([f, s](const Tn<T>& a) { return f(a, s); }, in.tensor<T>());
    }
    default: {
      if constexpr (ScalarLeft) {
        const T s = in.value<T>();
        return in.run([f, s](const Tn<T>& b) { return f(s, b); }, in.tensor<T>());
      }
    }
  }
}

// ---- The op table: one row per op ---------------------------------------------------------

struct Row {
  const char* name;
  void (*run)(In&);
};

#define ROW(name, mask, ...)                                            \
  Row {                                                                 \
    name, [](In& in) {                                                  \
      with_type<mask>(in, [&](auto tag) {                               \
        using T = typename decltype(tag)::type;                         \
        (void)sizeof(T);                                                \
        __VA_ARGS__;                                                    \
      });                                                               \
    }                                                                   \
  }
#define UNARY(fn, mask) ROW(#fn, mask, in.run([](const Tn<T>& x) { return xg::fn(x); }, in.tensor<T>()))
#define BINARY(fn, mask) ROW(#fn, mask, binary<T>(in, [](const auto& a, const auto& b) { return xg::fn(a, b); }))
#define OPERATOR(sym, mask, scalar_left) ROW("operator" #sym, mask, binary<T, scalar_left>(in, [](const auto& a, const auto& b) { return a sym b; }))
#define INPLACE(sym, mask) ROW("operator" #sym "=", mask, \
    if (in.flag()) { in.run_eager([](Tn<T> a, const Tn<T>& b) { return a sym## = b; }, in.tensor<T>(), in.tensor<T>()); } \
    else { const T s = in.value<T>(); in.run_eager([s](Tn<T> a) { return a sym## = s; }, in.tensor<T>()); })

extern const std::vector<Row> kRowsValues;  // fuzz_ops.cpp: factories, methods, elementwise
extern const std::vector<Row> kRowsShapes;  // fuzz_ops_shapes.cpp: linalg, shapes, reductions, nn ops
extern const std::vector<Row> kRowsNn;      // fuzz_ops_nn.cpp: layers, losses, optimizers, control flow, jit

}  // namespace xgrad::fuzz::ops
