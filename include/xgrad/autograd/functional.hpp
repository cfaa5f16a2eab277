// Function transforms: grad, value_and_grad, vjp, custom_vjp.
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "xgrad/autograd/engine.hpp"
#include "xgrad/ops/record.hpp"

namespace xgrad {

/// Which arguments grad differentiates: grad(f, argnums<0, 1>).
template <std::size_t... I> struct Argnums {};
template <std::size_t... I> inline constexpr Argnums<I...> argnums{};

namespace detail {

/// Counts grad transforms whose function is being evaluated. A transform entered while
/// another evaluates records its backward pass, so the outer one can differentiate it.
class TransformScope {
 public:
  TransformScope() : m_nested(context().transform_depth > 0) { ++context().transform_depth; }
  ~TransformScope() { --context().transform_depth; }
  bool nested() const { return m_nested; }

 private:
  bool m_nested;
};

template <class T> struct is_tensor : std::false_type {};
template <class T> struct is_tensor<Tensor<T>> : std::true_type {};

/// A handle autodiff can differentiate with respect to: the tensor itself when an enclosing
/// transform already tracks it, else a fresh leaf sharing its storage.
template <FloatingPoint T> Tensor<T> differentiable(const Tensor<T>& x) {
  if (x.requires_grad() && is_grad_enabled()) return x;
  return x.detach().set_requires_grad(true);
}

/// A compile-time error, not a run-time one, for a function that returns no float tensor.
template <class Out> void check_output() {
  static_assert(is_tensor<std::decay_t<Out>>::value, "grad: the function must return an xg::Tensor");
  static_assert(FloatingPoint<typename std::decay_t<Out>::value_type>,
                "grad: the function must return a float or double tensor");
}

/// Gradients of `out` with respect to `wrt` (zeros where out does not depend on one).
template <class Out, class... Ts>
std::tuple<Tensor<Ts>...> gradients(const Out& out, bool create_graph, SourceLoc loc, const Tensor<Ts>&... wrt) {
  if (!out.requires_grad()) return {zeros_like(wrt)...};
  auto results = autograd::run_backward(out, ones_like(out), {wrt.impl()->autograd...}, create_graph, loc);
  std::size_t i = 0;
  auto pick = [&](const auto& x) {
    using X = std::decay_t<decltype(x)>;
    const TensorBase& r = results[i++];
    return r.defined() ? X(r) : zeros_like(x);
  };
  return {pick(wrt)...};
}

}  // namespace detail

/// f's gradient with respect to the arguments in argnums. The result returns one tensor for
/// one index and a tuple for several; a non-scalar output is differentiated as its sum.
template <class F, std::size_t... I> auto grad(F f, Argnums<I...>, SourceLoc loc = SourceLoc::current()) {
  static_assert(sizeof...(I) > 0, "grad: argnums needs at least one index");
  return [f, loc](auto... args) {
    detail::TransformScope scope;
    enable_grad on;
    auto inputs = std::make_tuple(args...);
    ((std::get<I>(inputs) = detail::differentiable(std::get<I>(inputs))), ...);
    auto out = std::apply(f, inputs);
    detail::check_output<decltype(out)>();
    auto grads = detail::gradients(out, scope.nested(), loc, std::get<I>(inputs)...);
    if constexpr (sizeof...(I) == 1)
      return std::get<0>(grads);
    else
      return grads;
  };
}

/// f's gradient with respect to its first argument.
template <class F> auto grad(F f, SourceLoc loc = SourceLoc::current()) { return grad(f, argnums<0>, loc); }

/// value_and_grad below that also calls on_gradient(i, g) as soon as parameter i's gradient g
/// is final, during the backward pass: work on it (data-parallel training starts reducing a
/// bucket of gradients there) overlaps the rest of the pass. A parameter no gradient reaches
/// gets zeros, told at the end.
template <class F, class Params>
auto value_and_grad(F f, Params params, autograd::GradientReady on_gradient, SourceLoc loc = SourceLoc::current()) {
  return [f, params, on_gradient, loc](auto&&... args) {
    detail::TransformScope scope;
    enable_grad on;
    auto out = f(args...);
    detail::check_output<decltype(out)>();
    using P = std::decay_t<decltype(*std::begin(params))>;
    using T = typename P::value_type;
    std::vector<Tensor<T>> grads;
    if (!out.requires_grad()) {
      for (const auto& p : params) grads.push_back(zeros_like(Tensor<T>(p)));
      if (on_gradient)
        for (std::size_t i = 0; i < grads.size(); ++i) on_gradient(i, grads[i]);
      return std::pair{out, grads};
    }
    std::vector<std::shared_ptr<AutogradMeta>> targets;
    for (const auto& p : params) {
      if (!p.requires_grad())
        throw AutogradError(
            detail::concat("value_and_grad: parameter '", p.name(), "' does not require grad (at ", loc.str(), ")"));
      targets.push_back(p.impl()->autograd);
    }
    const std::vector<Tensor<T>> param_list(std::begin(params), std::end(params));
    autograd::GradientReady ready;
    if (on_gradient)
      ready = [&](std::size_t i, const TensorBase& g) {
        on_gradient(i, g.defined() ? Tensor<T>(g) : zeros_like(param_list[i]));
      };
    auto results = autograd::run_backward(out, ones_like(out), targets, scope.nested(), loc, ready);
    std::size_t i = 0;
    for (const auto& p : params) {
      const TensorBase& r = results[i++];
      grads.push_back(r.defined() ? Tensor<T>(r) : zeros_like(Tensor<T>(p)));
    }
    return std::pair{scope.nested() ? out : out.detach(), grads};
  };
}

/// A function returning f's value together with its gradients with respect to `params`
/// (one per parameter, in order): auto [loss, grads] = value_and_grad(loss_fn, params)(x, y).
template <class F, class Params> auto value_and_grad(F f, Params params, SourceLoc loc = SourceLoc::current()) {
  return value_and_grad(f, params, autograd::GradientReady{}, loc);
}

namespace detail {

/// f's outputs as a tuple: one tensor, or the tuple of tensors f returned.
template <class Out> auto as_outputs(const Out& out) {
  if constexpr (is_tensor<Out>::value)
    return std::tuple<Out>{out};
  else
    return out;
}

template <class Out> struct OutputsOf;
template <class... Us> struct OutputsOf<std::tuple<Tensor<Us>...>> {
  static constexpr bool floating = (FloatingPoint<Us> && ...);
  using Cotangents = std::tuple<Tensor<Us>...>;
};

/// vjp's pullback: the tape from f's outputs back to its primals, kept while this lives.
template <class Outputs, class... Ts> class Pullback {
 public:
  Pullback(Outputs outputs, std::tuple<Tensor<Ts>...> primals)
      : m_outputs(std::move(outputs)), m_primals(std::move(primals)) {}

  /// The primals' cotangents (sum over the outputs of each cotangent times the output's
  /// derivative), one per primal, zeros where no output depends on it; one cotangent per
  /// output, of its dtype and shape. Recorded, so differentiable, inside another transform.
  template <class... Cs> std::tuple<Tensor<Ts>...> operator()(const Cs&... cotangents) const {
    static_assert(sizeof...(Cs) == std::tuple_size_v<Outputs>,
                  "vjp: the pullback takes one cotangent per output of the function");
    static_assert(std::is_same_v<std::tuple<std::decay_t<Cs>...>, typename OutputsOf<Outputs>::Cotangents>,
                  "vjp: each cotangent must be a tensor of its output's dtype");
    std::vector<TensorBase> roots, seeds;
    std::size_t i = 0;
    auto take = [&](const TensorBase& out, const TensorBase& cotangent) {
      if (cotangent.shape() != out.shape())
        throw ShapeError(concat("vjp: cotangent ", i, " must have output ", i, "'s shape ", out.shape(), ", got ",
                                cotangent.shape()));
      ++i;
      if (!out.requires_grad()) return;
      roots.push_back(out);
      seeds.push_back(cotangent);
    };
    std::apply([&](const auto&... outs) { (take(outs, cotangents), ...); }, m_outputs);
    if (roots.empty()) return std::apply([](const auto&... x) { return std::tuple{zeros_like(x)...}; }, m_primals);
    std::vector<std::shared_ptr<AutogradMeta>> targets;
    std::apply([&](const auto&... x) { (targets.push_back(x.impl()->autograd), ...); }, m_primals);
    const bool nested = context().transform_depth > 0;  // an enclosing transform differentiates the result
    const std::vector<TensorBase> results = autograd::run_backward(roots, seeds, targets, nested);
    std::size_t k = 0;
    return std::apply(
        [&](const auto&... x) {
          auto pick = [&](const auto& primal) {
            using X = std::decay_t<decltype(primal)>;
            const TensorBase& r = results[k++];
            return r.defined() ? X(r) : zeros_like(primal);
          };
          return std::tuple<Tensor<Ts>...>{pick(x)...};
        },
        m_primals);
  }

 private:
  Outputs m_outputs;
  std::tuple<Tensor<Ts>...> m_primals;
};

}  // namespace detail

/// f's outputs at `primals` and its pullback (MindSpore's ops.vjp, JAX's jax.vjp): `auto [y, pb]
/// = vjp(f, x, w)`, then `auto [gx, gw] = pb(u)` gives the cotangents of x and w for the
/// cotangent u of y (a tuple of cotangents for a function returning a tuple), as often as
/// asked. f returns a float tensor or a tuple of them; every primal is a float tensor.
template <class F, class... Ts> auto vjp(F f, const Tensor<Ts>&... primals) {
  static_assert(sizeof...(Ts) > 0, "vjp: give at least one primal");
  static_assert((FloatingPoint<Ts> && ...), "vjp: every primal must be a float or double tensor");
  detail::TransformScope scope;
  enable_grad on;
  std::tuple<Tensor<Ts>...> inputs{detail::differentiable(primals)...};
  const auto out = std::apply(f, inputs);
  using Outputs = decltype(detail::as_outputs(out));
  static_assert(detail::OutputsOf<Outputs>::floating, "vjp: the function must return float tensors");
  detail::Pullback<Outputs, Ts...> pullback(detail::as_outputs(out), inputs);
  if (scope.nested()) return std::pair{out, pullback};
  if constexpr (detail::is_tensor<std::decay_t<decltype(out)>>::value)
    return std::pair{out.detach(), pullback};
  else
    return std::pair{std::apply([](const auto&... y) { return std::tuple{y.detach()...}; }, out), pullback};
}

namespace detail {
template <class... Ts, std::size_t... I>
std::tuple<Ts...> typed_inputs_impl(const std::vector<TensorBase>& saved, std::index_sequence<I...>) {
  return {Ts(saved[I])...};
}
template <class... Ts> std::tuple<Ts...> typed_inputs(const std::vector<TensorBase>& saved) {
  return typed_inputs_impl<Ts...>(saved, std::index_sequence_for<Ts...>{});
}
}  // namespace detail

/// A function with a hand-written gradient. forward(inputs...) computes the value;
/// backward(inputs..., out, grad_out) returns the gradient for each input (a tensor for one
/// input, a tuple for several), written with xgrad ops so it can be differentiated again.
template <class Forward, class Backward>
auto custom_vjp(Forward forward, Backward backward, SourceLoc loc = SourceLoc::current()) {
  return [forward, backward, loc](const auto&... inputs) {
    auto out = [&] {
      no_grad off;
      return forward(inputs...);
    }();
    using Out = decltype(out);
    if (!detail::should_record(inputs...)) return out;
    std::vector<std::reference_wrapper<const TensorBase>> refs{std::cref(static_cast<const TensorBase&>(inputs))...};
    std::vector<TensorBase> saved{inputs...};
    detail::record_range(out, "CustomVjp", loc, refs.begin(), refs.end(), {}, true,
                         [backward, saved](const TensorBase& y, const TensorBase& g) {
                           return std::apply(
                               [&](const auto&... in) {
                                 auto grads = backward(in..., Out(y), Out(g));
                                 if constexpr (detail::is_tensor<decltype(grads)>::value)
                                   return autograd::Grads{grads};
                                 else
                                   return std::apply([](const auto&... gs) { return autograd::Grads{gs...}; }, grads);
                               },
                               detail::typed_inputs<std::decay_t<decltype(inputs)>...>(saved));
                         });
    // The rule reads every input: check their versions at backward like any op's.
    for (const auto& in : saved) out.impl()->autograd->grad_fn->saved.push_back(autograd::Node::Saved::of(in));
    return out;
  };
}

}  // namespace xgrad
