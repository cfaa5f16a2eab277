// Arguments and results of jitted functions as trees: tensors at the leaves of vectors,
// arrays, pairs and tuples; other scalars are static (part of the signature). Flattening
// lists the tensors in order; rebuilding puts a list of tensors back into the same shape.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "xgrad/ir/tracer.hpp"

namespace xgrad::tracing::detail {

/// A call's tensors in order, and what else decides the trace: container sizes and the
/// values of non-tensor arguments. `labels`, when set, names each tensor ("argument 1[2]").
struct Flat {
  std::vector<TensorBase> tensors;
  std::vector<std::int64_t> statics;
  std::vector<std::string>* labels = nullptr;
  /// Which tensors share memory (filled by jit before it looks up the signature): empty when
  /// none do; else per tensor -1 when no earlier one shares its storage, j when tensor j has
  /// the same storage, dtype and shape (when the function writes into one, the trace gives
  /// both one symbolic tensor, so the write shows through the other as it does eagerly), -2 - j
  /// when it shares tensor j's storage as another view.
  std::vector<std::int32_t> aliases;
};

template <class X>
concept StaticLeaf = std::is_arithmetic_v<X> || std::is_enum_v<X>;

template <class X> std::int64_t static_bits(X x) {
  if constexpr (std::is_floating_point_v<X>)
    return std::bit_cast<std::int64_t>(static_cast<double>(x));
  else
    return static_cast<std::int64_t>(x);
}

/// The type a traced function sees in place of X: Parameters become plain tensors.
template <class X> struct Traced { using type = X; };
template <class T> struct Traced<Parameter<T>> { using type = Tensor<T>; };
template <class X> struct Traced<std::vector<X>> { using type = std::vector<typename Traced<X>::type>; };
template <class X, std::size_t N> struct Traced<std::array<X, N>> {
  using type = std::array<typename Traced<X>::type, N>;
};
template <class A, class B> struct Traced<std::pair<A, B>> {
  using type = std::pair<typename Traced<A>::type, typename Traced<B>::type>;
};
template <class... Xs> struct Traced<std::tuple<Xs...>> { using type = std::tuple<typename Traced<Xs>::type...>; };
template <class X> using traced_t = typename Traced<std::decay_t<X>>::type;

// as_traced: x as the traced function receives it (Parameters as plain tensor handles).
template <class X>
requires std::is_same_v<traced_t<X>, X>
const X& as_traced(const X& x) { return x; }
template <class T> Tensor<T> as_traced(const Parameter<T>& p) { return p; }
template <class X> traced_t<std::vector<X>> as_traced(const std::vector<X>& xs) {
  traced_t<std::vector<X>> out;
  for (const auto& x : xs) out.push_back(as_traced(x));
  return out;
}
template <class X, std::size_t N> traced_t<std::array<X, N>> as_traced(const std::array<X, N>& xs) {
  traced_t<std::array<X, N>> out;
  for (std::size_t i = 0; i < N; ++i) out[i] = as_traced(xs[i]);
  return out;
}
template <class A, class B> traced_t<std::pair<A, B>> as_traced(const std::pair<A, B>& p) {
  return {as_traced(p.first), as_traced(p.second)};
}
template <class... Xs> traced_t<std::tuple<Xs...>> as_traced(const std::tuple<Xs...>& t) {
  return std::apply([](const auto&... xs) { return traced_t<std::tuple<Xs...>>{as_traced(xs)...}; }, t);
}

// flatten: appends x's tensors and statics to `flat`.
template <Element T> void flatten(const Tensor<T>& x, Flat& flat, const std::string& label) {
  if (!x.defined()) throw ValueError("jit: an undefined tensor (an empty handle) was passed to a jitted function");
  flat.tensors.push_back(x);
  if (flat.labels) flat.labels->push_back(label);
}
template <StaticLeaf X> void flatten(X x, Flat& flat, const std::string&) { flat.statics.push_back(static_bits(x)); }
template <class X> void flatten(const std::vector<X>& xs, Flat& flat, const std::string& label);
template <class X, std::size_t N> void flatten(const std::array<X, N>& xs, Flat& flat, const std::string& label);
template <class A, class B> void flatten(const std::pair<A, B>& p, Flat& flat, const std::string& label);
template <class... Xs> void flatten(const std::tuple<Xs...>& t, Flat& flat, const std::string& label);

inline std::string sub_label(const Flat& flat, const std::string& label, std::size_t i) {
  return flat.labels ? label + "[" + std::to_string(i) + "]" : std::string();
}
template <class X> void flatten(const std::vector<X>& xs, Flat& flat, const std::string& label) {
  flat.statics.push_back(static_cast<std::int64_t>(xs.size()));
  for (std::size_t i = 0; i < xs.size(); ++i) flatten(xs[i], flat, sub_label(flat, label, i));
}
template <class X, std::size_t N> void flatten(const std::array<X, N>& xs, Flat& flat, const std::string& label) {
  for (std::size_t i = 0; i < N; ++i) flatten(xs[i], flat, sub_label(flat, label, i));
}
template <class A, class B> void flatten(const std::pair<A, B>& p, Flat& flat, const std::string& label) {
  flatten(p.first, flat, sub_label(flat, label, 0));
  flatten(p.second, flat, sub_label(flat, label, 1));
}
template <class... Xs> void flatten(const std::tuple<Xs...>& t, Flat& flat, const std::string& label) {
  [&]<std::size_t... I>(std::index_sequence<I...>) { (flatten(std::get<I>(t), flat, sub_label(flat, label, I)), ...); }
  (std::index_sequence_for<Xs...>{});
}

// symbolic: x with every tensor replaced by a new argument of `tracer`'s graph.
template <Element T> Tensor<T> symbolic(const Tensor<T>& x, Tracer& tracer, const std::string& name) {
  return Tensor<T>(tracer.add_argument(x.dtype(), x.shape(), name));
}
template <StaticLeaf X> X symbolic(X x, Tracer&, const std::string&) { return x; }
// Declared before any is defined, so that containers nest in any order (a vector of pairs).
template <class X> traced_t<std::vector<X>> symbolic(const std::vector<X>& xs, Tracer& tracer, const std::string& name);
template <class X, std::size_t N>
traced_t<std::array<X, N>> symbolic(const std::array<X, N>& xs, Tracer& tracer, const std::string& name);
template <class A, class B>
traced_t<std::pair<A, B>> symbolic(const std::pair<A, B>& p, Tracer& tracer, const std::string& name);
template <class... Xs>
traced_t<std::tuple<Xs...>> symbolic(const std::tuple<Xs...>& t, Tracer& tracer, const std::string& name);
template <class X>
traced_t<std::vector<X>> symbolic(const std::vector<X>& xs, Tracer& tracer, const std::string& name) {
  traced_t<std::vector<X>> out;
  for (std::size_t i = 0; i < xs.size(); ++i)
    out.push_back(symbolic(xs[i], tracer, name + "[" + std::to_string(i) + "]"));
  return out;
}
template <class X, std::size_t N>
traced_t<std::array<X, N>> symbolic(const std::array<X, N>& xs, Tracer& tracer, const std::string& name) {
  traced_t<std::array<X, N>> out;
  for (std::size_t i = 0; i < N; ++i) out[i] = symbolic(xs[i], tracer, name + "[" + std::to_string(i) + "]");
  return out;
}
template <class A, class B>
traced_t<std::pair<A, B>> symbolic(const std::pair<A, B>& p, Tracer& tracer, const std::string& name) {
  return {symbolic(p.first, tracer, name + ".first"), symbolic(p.second, tracer, name + ".second")};
}
template <class... Xs>
traced_t<std::tuple<Xs...>> symbolic(const std::tuple<Xs...>& t, Tracer& tracer, const std::string& name) {
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    return traced_t<std::tuple<Xs...>>{symbolic(std::get<I>(t), tracer, name + "[" + std::to_string(I) + "]")...};
  }
  (std::index_sequence_for<Xs...>{});
}

/// Reads leaves back, in the order flatten wrote them.
struct Reader {
  std::span<const TensorBase> tensors;
  std::span<const std::int64_t> statics;
  std::size_t next_tensor = 0, next_static = 0;
};

template <class X> X rebuild(Reader& r);
template <class X> struct Rebuild;
template <Element T> struct Rebuild<Tensor<T>> {
  static Tensor<T> read(Reader& r) { return Tensor<T>(r.tensors[r.next_tensor++]); }
};
template <class X> struct Rebuild<std::vector<X>> {
  static std::vector<X> read(Reader& r) {
    auto n = static_cast<std::size_t>(r.statics[r.next_static++]);
    std::vector<X> out;
    out.reserve(n);
    for (std::size_t i = 0; i < n; ++i) out.push_back(rebuild<X>(r));
    return out;
  }
};
template <class X, std::size_t N> struct Rebuild<std::array<X, N>> {
  static std::array<X, N> read(Reader& r) {
    std::array<X, N> out;
    for (auto& x : out) x = rebuild<X>(r);
    return out;
  }
};
template <class A, class B> struct Rebuild<std::pair<A, B>> {
  static std::pair<A, B> read(Reader& r) {
    A a = rebuild<A>(r);
    return {std::move(a), rebuild<B>(r)};
  }
};
template <class... Xs> struct Rebuild<std::tuple<Xs...>> {
  static std::tuple<Xs...> read(Reader& r) { return std::tuple<Xs...>{rebuild<Xs>(r)...}; }
};
template <class X> X rebuild(Reader& r) {
  if constexpr (StaticLeaf<X>) {
    std::int64_t bits = r.statics[r.next_static++];
    if constexpr (std::is_floating_point_v<X>)
      return static_cast<X>(std::bit_cast<double>(bits));
    else
      return static_cast<X>(bits);
  } else {
    return Rebuild<X>::read(r);
  }
}

}  // namespace xgrad::tracing::detail
