// Functions over flat lists of tensors, the form jit and the control-flow ops work on: their
// vector-Jacobian product (by running them again under autodiff) and their tracing into a
// subgraph of the graph being traced.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "xgrad/autograd/functional.hpp"
#include "xgrad/backend/executor.hpp"
#include "xgrad/core/config.hpp"
#include "xgrad/jit/diagnostics.hpp"

namespace xgrad::tracing::detail {

/// A callable passed to a function that calls it before returning and keeps nothing of it.
/// One type for every callable, where a std::function parameter would instantiate its machinery
/// for each: a jitted function's lambdas cross into the compiled part through these.
template <class Signature> class FunctionRef;
template <class R, class... Args> class FunctionRef<R(Args...)> {
 public:
  // Implicit, as std::function's.
  template <class F> FunctionRef(F&& f) noexcept
      requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> && std::is_invocable_r_v<R, F&, Args...>)
      : m_callable(const_cast<void*>(static_cast<const void*>(std::addressof(f)))), m_call(&call<F>) {}

  R operator()(Args... args) const { return m_call(m_callable, std::forward<Args>(args)...); }

 private:
  template <class F> static R call(void* callable, Args... args) {
    auto& fn = *static_cast<std::remove_reference_t<F>*>(callable);
    if constexpr (std::is_void_v<R>)
      std::invoke(fn, std::forward<Args>(args)...);
    else
      return std::invoke(fn, std::forward<Args>(args)...);
  }

  void* m_callable;
  R (*m_call)(void*, Args...);
};

/// A function from a flat list of tensors to a flat list of tensors.
using FlatFn = std::function<std::vector<TensorBase>(std::span<const TensorBase>)>;
/// The same, called and let go (FunctionRef).
using FlatFnRef = FunctionRef<std::vector<TensorBase>(std::span<const TensorBase>)>;

inline bool is_float(const TensorBase& t) { return t.dtype() == DType::float32 || t.dtype() == DType::float64; }

XGRAD_API TensorBase zeros_of_type(DType dtype, const Shape& shape);
inline TensorBase zeros_of(const TensorBase& t) { return zeros_of_type(t.dtype(), t.shape()); }

/// t itself when autodiff tracks it already, else a new leaf on its data that requires grad.
XGRAD_API TensorBase differentiable_leaf(const TensorBase& t);

/// Pulls the cotangents `cots` (one per output of fn; undefined for none) back through fn at
/// `args`: returns one gradient per float argument, then one per tensor of `targets` (tensors
/// fn reads from outside that require grad), zeros where nothing flows. Runs fn again under
/// autodiff, so it works eagerly, while tracing, and when differentiated again. Arguments
/// marked in `held` are passed as they are, not differentiated (their gradient is zeros).
XGRAD_API std::vector<TensorBase> vjp_of(const FlatFn& fn, std::span<const TensorBase> args,
                                         std::span<const TensorBase> cots, const std::vector<TensorBase>& targets,
                                         const std::vector<bool>& held = {});

/// A function traced into a subgraph of the active trace: the graph, its program, and the
/// tensors of the enclosing trace bound to its inputs after the arguments.
struct Subgraph {
  std::shared_ptr<const ir::Graph> graph;
  std::shared_ptr<const backend::Program> program;
  std::vector<TensorBase> captures;
  std::vector<TensorBase> outputs;  // symbolic, for their types and whether they require grad

  /// Runs the subgraph on concrete arguments and concrete captures.
  std::vector<TensorBase> run(std::vector<TensorBase> args, std::span<const TensorBase> bound_captures) const {
    args.insert(args.end(), bound_captures.begin(), bound_captures.end());
    return program->run(args);
  }
};

/// Traces fn on symbolic arguments typed like `args` into a subgraph named `name`.
XGRAD_API Subgraph trace_subgraph(const std::string& name, const FlatFn& fn, std::span<const TensorBase> args);

}  // namespace xgrad::tracing::detail

#if !defined(XGRAD_COMPILED)
#include "xgrad/jit/function-inl.hpp"
#endif
