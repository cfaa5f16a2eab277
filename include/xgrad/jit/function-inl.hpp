// Definitions of jit/function.hpp: included by it when header-only, compiled once into the
// library (src/jit.cpp) otherwise.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "xgrad/ir/verify.hpp"
#include "xgrad/jit/function.hpp"

namespace xgrad::tracing::detail {

XGRAD_API TensorBase zeros_of_type(DType dtype, const Shape& shape) {
  return dtype == DType::float64 ? TensorBase(zeros<double>(shape)) : TensorBase(zeros<float>(shape));
}

XGRAD_API TensorBase differentiable_leaf(const TensorBase& t) {
  if (t.requires_grad()) return t;
  auto impl = std::make_shared<TensorImpl>(t.shape(), t.dtype(), t.impl()->storage);
  impl->value = t.impl()->value;
  impl->autograd = std::make_shared<AutogradMeta>();
  impl->autograd->requires_grad = true;
  return TensorBase(impl);
}

XGRAD_API std::vector<TensorBase> vjp_of(const FlatFn& fn, std::span<const TensorBase> args,
                                         std::span<const TensorBase> cots, const std::vector<TensorBase>& targets,
                                         const std::vector<bool>& held) {
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

XGRAD_API Subgraph trace_subgraph(const std::string& name, const FlatFn& fn, std::span<const TensorBase> args) {
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
