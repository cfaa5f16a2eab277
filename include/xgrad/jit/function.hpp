// Functions over flat lists of tensors, the form jit and the control-flow ops work on: their
// vector-Jacobian product (by running them again under autodiff) and their tracing into a
// subgraph of the graph being traced.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "xgrad/autograd/functional.hpp"
#include "xgrad/backend/executor.hpp"
#include "xgrad/ir/verify.hpp"
#include "xgrad/jit/diagnostics.hpp"

namespace xgrad::tracing::detail {

/// A function from a flat list of tensors to a flat list of tensors.
using FlatFn = std::function<std::vector<TensorBase>(std::span<const TensorBase>)>;

inline bool is_float(const TensorBase& t) { return t.dtype() == DType::float32 || t.dtype() == DType::float64; }

inline TensorBase zeros_of_type(DType dtype, const Shape& shape) {
  return dtype == DType::float64 ? TensorBase(zeros<double>(shape)) : TensorBase(zeros<float>(shape));
}
inline TensorBase zeros_of(const TensorBase& t) { return zeros_of_type(t.dtype(), t.shape()); }

/// t itself when autodiff tracks it already, else a new leaf on its data that requires grad.
inline TensorBase differentiable_leaf(const TensorBase& t) {
  if (t.requires_grad()) return t;
  auto impl = std::make_shared<TensorImpl>(t.shape(), t.dtype(), t.impl()->storage);
  impl->value = t.impl()->value;
  impl->autograd = std::make_shared<AutogradMeta>();
  impl->autograd->requires_grad = true;
  return TensorBase(impl);
}

/// Pulls the cotangents `cots` (one per output of fn; undefined for none) back through fn at
/// `args`: returns one gradient per float argument, then one per tensor of `targets` (tensors
/// fn reads from outside that require grad), zeros where nothing flows. Runs fn again under
/// autodiff, so it works eagerly, while tracing, and when differentiated again. Arguments
/// marked in `held` are passed as they are, not differentiated (their gradient is zeros).
inline std::vector<TensorBase> vjp_of(const FlatFn& fn, std::span<const TensorBase> args,
                                      std::span<const TensorBase> cots, const std::vector<TensorBase>& targets,
                                      const std::vector<bool>& held = {}) {
  xgrad::detail::TransformScope scope;
  enable_grad on;
  std::vector<TensorBase> leaves(args.begin(), args.end());
  std::vector<std::shared_ptr<AutogradMeta>> metas;
  std::vector<TensorBase> shapes_of;  // what each gradient's zeros look like
  for (std::size_t i = 0; i < leaves.size(); ++i)
    if (is_float(leaves[i])) {
      shapes_of.push_back(leaves[i]);
      const bool differentiated = i >= held.size() || !held[i];
      if (differentiated) leaves[i] = differentiable_leaf(leaves[i]);
      metas.push_back(differentiated ? leaves[i].impl()->autograd : nullptr);
    }
  for (const auto& t : targets) {
    shapes_of.push_back(t);
    metas.push_back(t.impl()->autograd);
  }
  std::vector<TensorBase> outs = fn(leaves);
  std::vector<TensorBase> roots, seeds;
  for (std::size_t j = 0; j < outs.size(); ++j)
    if (cots[j].defined() && is_float(outs[j])) {
      roots.push_back(outs[j]);
      seeds.push_back(cots[j]);
    }
  auto grads = autograd::run_backward(roots, seeds, metas, scope.nested());
  for (std::size_t i = 0; i < grads.size(); ++i)
    if (!grads[i].defined()) grads[i] = zeros_of(shapes_of[i]);
  return grads;
}

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
inline Subgraph trace_subgraph(const std::string& name, const FlatFn& fn, std::span<const TensorBase> args) {
  Tracer tracer(name);
  std::vector<TensorBase> symbolic;
  for (std::size_t i = 0; i < args.size(); ++i)
    symbolic.push_back(tracer.add_argument(args[i].dtype(), args[i].shape(), "arg" + std::to_string(i)));
  std::vector<TensorBase> outs = traced(tracer, [&] { return fn(symbolic); });
  auto graph = tracer.finish(outs);
  ir::verify(*graph);
  return {graph, std::make_shared<const backend::Program>(graph), tracer.captures(), outs};
}

}  // namespace xgrad::tracing::detail
