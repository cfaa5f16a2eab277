// Function transforms: grad, value_and_grad, vjp, jvp, jacrev, jacfwd, hessian, vmap, checkpoint,
// custom_vjp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <unordered_set>
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

/// x cut off from the tape, keeping its tangents: what a transform hands on, so that an
/// enclosing jvp sees through it.
template <class T> Tensor<T> detach_tape(const Tensor<T>& x) {
  Tensor<T> out = x.detach();
  out.impl()->tangents = x.impl()->tangents;
  return out;
}

/// A handle autodiff can differentiate with respect to: the tensor itself when an enclosing
/// transform already tracks it, else a fresh leaf sharing its storage (and its tangents).
template <FloatingPoint T> Tensor<T> differentiable(const Tensor<T>& x) {
  if (x.requires_grad() && is_grad_enabled()) return x;
  return detach_tape(x).set_requires_grad(true);
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
    return std::pair{scope.nested() ? out : detail::detach_tape(out), grads};
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
    return std::pair{detail::detach_tape(out), pullback};
  else
    return std::pair{std::apply([](const auto&... y) { return std::tuple{detail::detach_tape(y)...}; }, out), pullback};
}

namespace detail {

/// A forward-mode pass for a scope: a level of its own (never reused), innermost while it lasts.
class ForwardPass {
 public:
  ForwardPass() : m_level(++transform_levels().made) {
    transform_levels().forward.push_back({m_level});
    ++context().forward_passes;
  }
  ~ForwardPass() {
    transform_levels().forward.pop_back();
    --context().forward_passes;
  }
  ForwardPass(const ForwardPass&) = delete;
  ForwardPass& operator=(const ForwardPass&) = delete;
  std::uint64_t level() const { return m_level; }

 private:
  std::uint64_t m_level;
};

/// x carrying `tangent` in pass `level`: a new handle to x's data and autodiff state.
template <class T> Tensor<T> with_tangent(const Tensor<T>& x, const Tensor<T>& tangent, std::uint64_t level) {
  auto impl = std::make_shared<TensorImpl>(*x.impl());
  impl->tangents.push_back({level, tangent.impl()});
  return Tensor<T>(std::move(impl));
}

/// y's tangent in pass `level` (zeros where y does not depend on the primals), taken off y.
template <class T> Tensor<T> take_tangent(const Tensor<T>& y, std::uint64_t level) {
  const TensorBase t = tangent_at(y, level);
  std::erase_if(y.impl()->tangents, [level](const Tangent& x) { return x.level == level; });
  return t.defined() ? Tensor<T>(t) : zeros_like(y);
}

/// The primal, with `tangent` in pass `level`, after checking that they match.
template <class T>
Tensor<T> dual(std::size_t k, const Tensor<T>& primal, const Tensor<T>& tangent, std::uint64_t level) {
  if (tangent.shape() != primal.shape())
    throw ShapeError(
        concat("jvp: tangent ", k, " must have primal ", k, "'s shape ", primal.shape(), ", got ", tangent.shape()));
  return with_tangent(primal, tangent, level);
}

/// jvp's result: f's outputs and their tangents in pass `level`, of the same structure.
template <class Out> auto outputs_and_tangents(const Out& out, std::uint64_t level) {
  static_assert(OutputsOf<decltype(as_outputs(out))>::floating, "jvp: the function must return float tensors");
  if constexpr (is_tensor<Out>::value)
    return std::pair{out, take_tangent(out, level)};
  else
    return std::pair{out, std::apply([&](const auto&... y) { return std::tuple{take_tangent(y, level)...}; }, out)};
}

}  // namespace detail

/// Forward mode (MindSpore's ops.jvp, JAX's jax.jvp): f's outputs at `primals` and their
/// tangents along `tangents`, the Jacobian-vector product J·t, in one pass over f: each op
/// computes its output's tangent beside its value. `auto [y, ty] = jvp(f, std::tuple{x, w},
/// std::tuple{tx, tw})`; for a function returning a tuple, ty is a tuple too. Each tangent has
/// its primal's dtype and shape. Composes with grad (both ways), vjp, jit and itself.
template <class F, class... Ts>
auto jvp(F f, const std::tuple<Tensor<Ts>...>& primals, const std::tuple<Tensor<Ts>...>& tangents) {
  static_assert(sizeof...(Ts) > 0, "jvp: give at least one primal");
  static_assert((FloatingPoint<Ts> && ...), "jvp: every primal must be a float or double tensor");
  detail::ForwardPass pass;
  const auto duals = [&]<std::size_t... K>(std::index_sequence<K...>) {
    return std::tuple{detail::dual(K, std::get<K>(primals), std::get<K>(tangents), pass.level())...};
  }
  (std::index_sequence_for<Ts...>{});
  return detail::outputs_and_tangents(std::apply(f, duals), pass.level());
}

/// jvp of a function of a list of tensors, f(std::vector<Tensor<T>>), along one tangent per
/// primal: `auto [y, ty] = jvp(f, xs, txs)`.
template <class F, FloatingPoint T>
auto jvp(F f, const std::vector<Tensor<T>>& primals, const std::vector<Tensor<T>>& tangents) {
  if (tangents.size() != primals.size())
    throw ValueError(detail::concat("jvp: ", primals.size(), " primals need as many tangents, got ", tangents.size()));
  detail::ForwardPass pass;
  std::vector<Tensor<T>> duals;
  for (std::size_t k = 0; k < primals.size(); ++k)
    duals.push_back(detail::dual(k, primals[k], tangents[k], pass.level()));
  return detail::outputs_and_tangents(f(duals), pass.level());
}

/// jvp of a function of one tensor: `auto [y, ty] = jvp(f, x, tx)`.
template <class F, FloatingPoint T> auto jvp(F f, const Tensor<T>& primal, const Tensor<T>& tangent) {
  return jvp([&f](const Tensor<T>& x) { return f(x); }, std::tuple{primal}, std::tuple{tangent});
}

/// vmap's mark for an argument that is not mapped over: `xg::in_axes{0, xg::none}`.
struct None {};
inline constexpr None none{};

/// The axis of each argument that vmap maps over, or none for an argument every value shares.
class in_axes {
 public:
  class Axis {
   public:
    Axis(std::int64_t axis) : m_axis(axis) {}  // implicit: in_axes{0, 1}
    Axis(None) {}                              // implicit: in_axes{0, none}
    std::optional<std::int64_t> value() const { return m_axis; }

   private:
    std::optional<std::int64_t> m_axis;
  };
  /// Every argument along its axis 0.
  in_axes() = default;
  in_axes(std::initializer_list<Axis> axes) : m_axes(axes) {}
  const std::vector<Axis>& axes() const { return m_axes; }

 private:
  std::vector<Axis> m_axes;
};

namespace detail {

/// A vmap in progress for a scope: a level of its own (never reused), innermost while it lasts.
class VmapLevel {
 public:
  VmapLevel() : m_level(++transform_levels().made) {
    transform_levels().vmap.push_back(m_level);
    ++context().vmaps;
  }
  ~VmapLevel() {
    transform_levels().vmap.pop_back();
    --context().vmaps;
  }
  VmapLevel(const VmapLevel&) = delete;
  VmapLevel& operator=(const VmapLevel&) = delete;
  std::uint64_t level() const { return m_level; }

 private:
  std::uint64_t m_level;
};

}  // namespace detail

/// f mapped over a batch (JAX's vmap, MindSpore's ops.vmap): each argument's axis in `axes`
/// (default 0; xg::none: shared by every value) is the batch, and f sees one value of it; the
/// results come back stacked along `out_axis`. One call of f, with every op running its
/// batching rule on the whole batch at once: `vmap(grad(loss))(w, xs)` with in_axes{none, 0}
/// gives per-example gradients. An op without a batching rule is an error naming it.
template <class F> auto vmap(F f, in_axes axes = {}, std::int64_t out_axis = 0, SourceLoc loc = SourceLoc::current()) {
  return [f, axes, out_axis, loc](const auto&... args) {
    static_assert((detail::is_tensor<std::decay_t<decltype(args)>>::value && ...), "vmap: every argument is a tensor");
    constexpr std::size_t count = sizeof...(args);
    if (!axes.axes().empty() && axes.axes().size() != count)
      throw ValueError(
          detail::op_message("vmap", loc, "in_axes has ", axes.axes().size(), " entries for ", count, " arguments"));
    detail::VmapLevel level;
    std::int64_t size = -1;
    std::size_t sized_by = 0, index = 0;
    auto wrap = [&](const auto& x) {
      using X = std::decay_t<decltype(x)>;
      const std::size_t k = index++;
      const std::optional<std::int64_t> axis =
          axes.axes().empty() ? std::optional<std::int64_t>(0) : axes.axes()[k].value();
      if (!axis) return x;
      if (*axis < -x.ndim() || *axis >= x.ndim())
        throw ShapeError(detail::op_message("vmap", loc, "argument ", k, " (", dtype_name(x.dtype()), x.shape(),
                                            ") has no axis ", *axis, " to map over"));
      const int a = static_cast<int>(*axis < 0 ? *axis + x.ndim() : *axis);
      if (size < 0) {
        size = x.shape()[a];
        sized_by = k;
      } else if (x.shape()[a] != size) {
        throw ShapeError(detail::op_message("vmap", loc, "argument ", k, " has ", x.shape()[a],
                                            " values along its mapped axis, argument ", sized_by, " has ", size));
      }
      return X(detail::batched(detail::move_axis(x, a, 0), level.level()));
    };
    const std::tuple<std::decay_t<decltype(args)>...> mapped{wrap(args)...};  // braces: in order
    if (size < 0)
      throw ValueError(detail::op_message("vmap", loc, "no argument is mapped: every in_axes entry is none"));
    const auto out = std::apply(f, mapped);
    auto unwrap = [&](const auto& y) {
      using Y = std::decay_t<decltype(y)>;
      const Y batch = detail::batched_at(y, level.level()) ? Y(y.impl()->physical)
                                                           : broadcast_to(y, detail::with_batch(size, y.shape()));
      if (out_axis < -batch.ndim() || out_axis >= batch.ndim())
        throw ShapeError(detail::op_message("vmap", loc, "out_axis ", out_axis, " is not an axis of the result (",
                                            dtype_name(batch.dtype()), batch.shape(), ")"));
      return detail::move_axis(batch, 0, static_cast<int>(out_axis < 0 ? out_axis + batch.ndim() : out_axis));
    };
    if constexpr (detail::is_tensor<std::decay_t<decltype(out)>>::value)
      return unwrap(out);
    else
      return std::apply([&](const auto&... ys) { return std::tuple{unwrap(ys)...}; }, out);
  };
}

namespace detail {

/// The standard basis of tensors like `like`, stacked along a new axis 0: [numel, like's
/// shape...], value i holding a 1 at element i.
template <class T> Tensor<T> basis(const Tensor<T>& like) {
  const auto n = static_cast<std::size_t>(like.numel());
  std::vector<T> values(n * n, T(0));
  for (std::size_t i = 0; i < n; ++i) values[i * n + i] = T(1);
  const Tensor<T> e = tensor(values, with_batch(like.numel(), like.shape()));
  return like.device() == Device::cpu ? e : e.to(like.device());
}

/// [out..., in...] as a Jacobian's shape.
inline std::vector<std::int64_t> jacobian_shape(const Shape& out, const Shape& in) {
  std::vector<std::int64_t> dims = out.to_vector();
  for (std::int64_t d : in) dims.push_back(d);
  return dims;
}

/// f of the arguments `args` with those at I... replaced by `selected`: the function of those
/// arguments that a transform differentiates.
template <class F, class Args, std::size_t... I> auto of_selected(const F& f, const Args& args, Argnums<I...>) {
  return [&f, &args](const auto&... selected) {
    Args all = args;
    ((std::get<I>(all) = selected), ...);
    return std::apply(f, all);
  };
}

template <class Out> void check_jacobian_output() {
  static_assert(is_tensor<std::decay_t<Out>>::value && FloatingPoint<typename std::decay_t<Out>::value_type>,
                "jacrev / jacfwd / hessian: the function must return one float tensor");
}

/// One tensor for one argument, the tuple for several.
template <class Tuple> auto one_or_tuple(Tuple t) {
  if constexpr (std::tuple_size_v<Tuple> == 1)
    return std::get<0>(t);
  else
    return t;
}

}  // namespace detail

/// f's Jacobian with respect to the arguments in argnums by reverse mode (JAX's jacrev,
/// MindSpore's ops.jacrev): the pullback of every basis vector of the output at once, under
/// vmap. For an output shaped O and an argument shaped A, a tensor shaped O + A (one tensor for
/// one index, a tuple for several).
template <class F, std::size_t... I> auto jacrev(F f, Argnums<I...> which) {
  static_assert(sizeof...(I) > 0, "jacrev: argnums needs at least one index");
  return [f, which](const auto&... args) {
    const auto all = std::make_tuple(args...);
    const auto result = vjp(detail::of_selected(f, all, which), std::get<I>(all)...);
    const auto& y = result.first;
    const auto& pullback = result.second;
    detail::check_jacobian_output<decltype(y)>();
    using T = typename std::decay_t<decltype(y)>::value_type;
    auto jacobian = [&](const auto& rows, const auto& x) {
      using X = std::decay_t<decltype(x)>;
      const auto dims = detail::jacobian_shape(y.shape(), x.shape());
      return y.numel() == 0 ? zeros<typename X::value_type>(Shape(dims)) : reshape(rows, dims);
    };
    if (y.numel() == 0) return detail::one_or_tuple(std::tuple{jacobian(std::get<I>(all), std::get<I>(all))...});
    const auto rows = vmap([&pullback](const Tensor<T>& u) { return pullback(u); })(detail::basis(y));
    return detail::one_or_tuple([&]<std::size_t... K>(std::index_sequence<K...>) {
      return std::tuple{jacobian(std::get<K>(rows), std::get<I>(all))...};
    }(std::make_index_sequence<sizeof...(I)>{}));
  };
}

/// f's Jacobian with respect to its first argument, by reverse mode.
template <class F> auto jacrev(F f) { return jacrev(std::move(f), argnums<0>); }

/// f's Jacobian with respect to the arguments in argnums by forward mode (JAX's jacfwd,
/// MindSpore's ops.jacfwd): the tangents of every basis vector of each argument at once, under
/// vmap; shaped as jacrev's.
template <class F, std::size_t... I> auto jacfwd(F f, Argnums<I...> which) {
  static_assert(sizeof...(I) > 0, "jacfwd: argnums needs at least one index");
  return [f, which](const auto&... args) {
    const auto all = std::make_tuple(args...);
    const auto selected = std::make_tuple(std::get<I>(all)...);
    const auto g = detail::of_selected(f, all, which);
    using Y = std::decay_t<decltype(std::apply(g, selected))>;
    detail::check_jacobian_output<Y>();
    auto jacobian = [&]<std::size_t K>(std::integral_constant<std::size_t, K>) {
      const auto& x = std::get<K>(selected);
      using X = std::decay_t<decltype(x)>;
      if (x.numel() == 0)
        return zeros<typename Y::value_type>(Shape(detail::jacobian_shape(std::apply(g, selected).shape(), x.shape())));
      const Y columns = vmap([&](const X& t) {
        auto tangents = std::apply([](const auto&... s) { return std::tuple{zeros_like(s)...}; }, selected);
        std::get<K>(tangents) = t;
        return jvp(g, selected, tangents).second;
      })(detail::basis(x));
      // [n, out...] -> [out..., n] -> [out..., x's shape...]
      std::vector<std::int64_t> perm;
      for (int i = 1; i < columns.ndim(); ++i) perm.push_back(i);
      perm.push_back(0);
      const Shape out_shape(columns.shape().begin() + 1, columns.shape().end());
      return reshape(transpose(columns, perm), detail::jacobian_shape(out_shape, x.shape()));
    };
    return detail::one_or_tuple([&]<std::size_t... K>(std::index_sequence<K...>) {
      return std::tuple{jacobian(std::integral_constant<std::size_t, K>{})...};
    }(std::make_index_sequence<sizeof...(I)>{}));
  };
}

/// f's Jacobian with respect to its first argument, by forward mode.
template <class F> auto jacfwd(F f) { return jacfwd(std::move(f), argnums<0>); }

/// The Hessian of f with respect to argument I: jacfwd of jacrev, forward over reverse; for an
/// output shaped O and an argument shaped A, shaped O + A + A (A + A for a scalar f).
template <class F, std::size_t I> auto hessian(F f, Argnums<I> which) {
  return jacfwd(jacrev(std::move(f), which), which);
}

/// The Hessian of f with respect to its first argument.
template <class F> auto hessian(F f) { return hessian(std::move(f), argnums<0>); }

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
      detail::TangentsPaused no_tangents;
      return forward(inputs...);
    }();
    using Out = decltype(out);
    detail::push_tangents(out, {inputs...}, detail::no_tangent_rule("CustomVjp", loc));
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

namespace detail {
/// Scope guard: the ops inside recompute a checkpoint's function (traced, their nodes carry a
/// number of their own, so CSE keeps them apart from the forward pass's).
class Recomputing {
 public:
  Recomputing() : m_previous(context().recompute) { context().recompute = ++context().recomputes_made; }
  ~Recomputing() { context().recompute = m_previous; }
  Recomputing(const Recomputing&) = delete;
  Recomputing& operator=(const Recomputing&) = delete;

 private:
  std::uint64_t m_previous;
};

/// Throws when the tape of `out` reaches a tensor that requires grad other than through `known`
/// (a checkpoint's arguments and declared reads): its gradient could not leave the checkpoint,
/// whose tape entry links only those.
inline void check_only_known_reads(const TensorBase& out, const std::vector<TensorBase>& known, SourceLoc loc) {
  std::vector<const AutogradMeta*> stops;
  for (const auto& t : known)
    if (t.impl()->autograd) stops.push_back(t.impl()->autograd.get());
  std::vector<const AutogradMeta*> pending{out.impl()->autograd.get()};
  std::unordered_set<const autograd::Node*> seen;
  while (!pending.empty()) {
    const AutogradMeta* meta = pending.back();
    pending.pop_back();
    if (!meta || std::find(stops.begin(), stops.end(), meta) != stops.end()) continue;
    if (const autograd::Node* node = meta->grad_fn.get()) {
      if (!seen.insert(node).second) continue;
      for (const auto& in : node->inputs) pending.push_back(in.meta.get());
    } else if (meta->requires_grad) {
      throw AutogradError(
          op_message("Checkpoint", loc, "the function reads a tensor that requires grad (",
                     meta->name.empty() ? std::string("unnamed") : "'" + meta->name + "'",
                     ") from outside its arguments: a checkpoint differentiates its arguments only; pass it as one "
                     "(nn::Module::recompute() passes a module's parameters)"));
    }
  }
}

/// checkpoint below, for an f that also reads `reads` from outside (a module's parameters):
/// their gradients flow too. `replay`, when set, runs just before the backward pass runs f
/// again, and the function it returns right after (a module puts back, for the second run, the
/// state its forward saw, then the state it has now).
template <class F> auto checkpoint_reading(F f, std::vector<TensorBase> reads,
                                           std::function<std::function<void()>()> replay, SourceLoc loc) {
  return [f, reads, replay, loc](const auto&... inputs) {
    static_assert((is_tensor<std::decay_t<decltype(inputs)>>::value && ...),
                  "checkpoint: the function's arguments are tensors");
    auto out = [&] {
      no_grad off;
      return f(inputs...);
    }();
    static_assert(is_tensor<decltype(out)>::value, "checkpoint: the function returns one tensor");
    bool reads_tracked = false;
    for (const auto& r : reads) reads_tracked = reads_tracked || r.requires_grad();
    if (!should_record(inputs...) && !(reads_tracked && is_grad_enabled())) return out;
    std::vector<TensorBase> recorded{inputs...};
    const std::size_t num_inputs = recorded.size();
    recorded.insert(recorded.end(), reads.begin(), reads.end());
    record_range(out, "Checkpoint", loc, recorded.begin(), recorded.end(), {inputs...}, false,
                 [f, recorded, num_inputs, replay, loc](const TensorBase&, const TensorBase& g) {
                   // The backward pass records when it is itself differentiated.
                   const bool create_graph = is_grad_enabled();
                   enable_grad on;
                   Recomputing recomputing;
                   std::function<void()> undo = replay ? replay() : std::function<void()>();
                   struct Undo {
                     std::function<void()>& undo;
                     ~Undo() {
                       if (undo) undo();
                     }
                   } undo_at_exit{undo};
                   // f runs on aliases of its inputs (a recorded view of each): the gradients
                   // stop there, not flowing on into the inputs' own history (the enclosing
                   // backward pass does that), yet stay connected to it.
                   std::vector<TensorBase> aliases;
                   const auto again = std::apply(
                       [&](const auto&... in) {
                         auto alias = [&](const auto& x) {
                           aliases.push_back(x.requires_grad() ? reshape(x, x.shape().to_vector()) : x);
                           return std::decay_t<decltype(x)>(aliases.back());
                         };
                         return std::apply([&](const auto&... a) { return f(a...); }, std::tuple{alias(in)...});
                       },
                       typed_inputs<std::decay_t<decltype(inputs)>...>(recorded));
                   autograd::Grads grads(recorded.size());
                   if (!again.requires_grad()) return grads;
                   std::vector<TensorBase> known = aliases;
                   known.insert(known.end(), recorded.begin() + static_cast<std::ptrdiff_t>(num_inputs),
                                recorded.end());
                   check_only_known_reads(again, known, loc);
                   std::vector<std::shared_ptr<AutogradMeta>> targets;
                   std::vector<std::size_t> of_target;
                   for (std::size_t k = 0; k < recorded.size(); ++k)
                     if (recorded[k].requires_grad()) {
                       targets.push_back((k < num_inputs ? aliases[k] : recorded[k]).impl()->autograd);
                       of_target.push_back(k);
                     }
                   const auto found = autograd::run_backward({again}, {g}, targets, create_graph);
                   for (std::size_t i = 0; i < found.size(); ++i) grads[of_target[i]] = found[i];
                   return grads;
                 });
    return out;
  };
}

}  // namespace detail

/// Rematerialization (JAX's checkpoint, MindSpore's Cell.recompute): f's value, with nothing
/// of f kept for the backward pass but its inputs; the backward pass runs f again, recording
/// it, and differentiates that. Memory for compute: f's intermediates never wait for the
/// backward pass. f takes tensors and returns one tensor. Only its arguments are differentiated:
/// a tensor requiring grad that f reads from outside is an AutogradError in the backward pass
/// (nn::Module::recompute passes a module's parameters).
template <class F> auto checkpoint(F f, SourceLoc loc = SourceLoc::current()) {
  return detail::checkpoint_reading(std::move(f), {}, {}, loc);
}

}  // namespace xgrad
