// Definitions of ir/tracer.hpp: included by it when header-only, compiled once into the library
// (src/ir.cpp) otherwise.
#pragma once

#include <algorithm>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "xgrad/ir/tracer.hpp"

namespace xgrad::tracing {

XGRAD_API std::string scope_path() {
  std::string out;
  for (const auto& s : detail::scope_stack()) out += (out.empty() ? "" : "/") + s;
  return out;
}

XGRAD_API Tracer::Tracer(std::string name) : m_graph(std::make_shared<ir::Graph>()), m_parent(detail::active_tracer()) {
  m_graph->name = std::move(name);
  m_first_serial = Storage::next_serial();
  detail::active_tracer() = this;
  ++xgrad::detail::context().trace_depth;
}

XGRAD_API Tracer::~Tracer() {
  detail::active_tracer() = m_parent;
  --xgrad::detail::context().trace_depth;
}

XGRAD_API TensorBase Tracer::add_argument(DType dtype, const Shape& shape, std::string name) {
  if (!m_captures.empty()) throw std::logic_error("xgrad internal error: argument added after a capture");
  ir::Value* v = m_graph->new_value(dtype, shape, nullptr);
  v->name = std::move(name);
  m_input_of_value[v] = m_graph->inputs.size();
  m_graph->inputs.push_back(v);
  m_graph->num_args = m_graph->inputs.size();
  TensorBase t = symbolic(v);
  m_input_of_impl[t.impl().get()] = m_input_of_value[v];
  return t;
}

XGRAD_API ir::Value* Tracer::resolve(const TensorBase& t) {
  const TensorImpl* impl = t.impl().get();
  if (!impl) throw ValueError("jit: an undefined tensor (an empty handle) was used while tracing");
  if (impl->physical)
    throw ValueError(xgrad::detail::concat("jit: a batched tensor (", dtype_name(impl->dtype), impl->shape,
                                           ", inside vmap) reached an op that has no batching rule for vmap yet "
                                           "(a collective's start form)"));
  if (auto it = m_lifted.find(impl); it != m_lifted.end()) return it->second;
  if (impl->value && impl->value->graph == m_graph.get()) return impl->value.get();
  ir::Value* v = nullptr;
  if (!impl->storage) {
    bool enclosing = false;
    for (Tracer* p = m_parent; p && !enclosing; p = p->m_parent) enclosing = impl->value->graph == p->m_graph.get();
    if (!enclosing)
      throw ValueError(xgrad::detail::concat(
          "jit: a traced tensor (", dtype_name(impl->dtype), impl->shape,
          ") escaped the function that made it: it was kept (in a global, a member or a captured variable) "
          "after its jit function returned; return it from that function instead"));
    v = add_input(t, false);
  } else if (impl->storage->serial() >= m_first_serial) {
    v = add_constant(t);
  } else {
    v = add_input(t, m_parent == nullptr);
  }
  m_lifted[impl] = v;
  return v;
}

XGRAD_API std::vector<TensorBase> Tracer::emit(std::shared_ptr<const ir::Primitive> primitive, SourceLoc loc,
                                               std::span<const TensorBase> inputs,
                                               const std::vector<std::pair<DType, Shape>>& outputs, ir::Kernel kernel,
                                               OpTraits traits, std::vector<std::shared_ptr<const ir::Graph>> subgraphs,
                                               bool has_effect) {
  if (m_evaluate_concrete && subgraphs.empty() && !has_effect &&
      std::all_of(inputs.begin(), inputs.end(), [](const TensorBase& t) { return t.impl()->storage != nullptr; })) {
    std::vector<TensorBase> out(outputs.size());
    kernel(inputs, out);
    return out;
  }
  auto node = std::make_unique<ir::Node>();
  node->primitive = std::move(primitive);
  SourceLoc forward = GradientScope::location();
  node->loc = forward.line() != 0 ? forward : loc;
  node->scope = scope_path();
  node->traits = traits;
  node->kernel = std::move(kernel);
  node->subgraphs = std::move(subgraphs);
  node->has_effect = has_effect;
  node->recompute = xgrad::detail::context().recompute;
  for (const auto& in : inputs) node->inputs.push_back(resolve(in));
  std::vector<TensorBase> out;
  for (const auto& [dtype, shape] : outputs) {
    node->outputs.push_back(m_graph->new_value(dtype, shape, node.get()));
    out.push_back(symbolic(node->outputs.back()));
  }
  m_graph->append(std::move(node));
  return out;
}

XGRAD_API void Tracer::rebind(const TensorBase& target, const TensorBase& value, SourceLoc loc) {
  ir::Value* v = resolve(value);
  ir::Value* old = resolve(target);
  if (m_parent && !old->producer && m_input_of_value.at(old) >= m_graph->num_args)
    throw ValueError(xgrad::detail::concat(
        "jit: an in-place update (at ", loc.str(),
        ") of a tensor from outside a cond / while_loop / fori_loop body; return the new value from the body "
        "instead"));
  TensorImpl& impl = *target.impl();
  ++impl.rebinds;
  if (!impl.storage && impl.value.get() == old)
    impl.value = m_graph->share(v);
  else
    m_lifted[&impl] = v;
  if (auto input = m_input_of_impl.find(&impl); input != m_input_of_impl.end() && !m_parent)
    m_effects[input->second] = {input->second, v, loc};
}

XGRAD_API std::shared_ptr<ir::Graph> Tracer::finish(std::span<const TensorBase> outputs) {
  for (const auto& out : outputs) m_graph->outputs.push_back(resolve(out));
  for (auto& [input, effect] : m_effects) m_graph->effects.push_back(effect);
  return m_graph;
}

XGRAD_API void Tracer::note_failure(std::string_view op, SourceLoc loc, std::vector<TensorBase> inputs) noexcept {
  if (m_failure) return;
  try {
    m_failure = std::make_unique<Failure>(Failure{std::string(op), loc, std::move(inputs), scope_path()});
  } catch (...) {
  }
}

XGRAD_API ir::Value* Tracer::add_input(const TensorBase& t, bool by_reference) {
  ir::Value* v = m_graph->new_value(t.dtype(), t.shape(), nullptr);
  v->by_reference = by_reference;
  if (t.impl()->autograd) v->name = t.impl()->autograd->name;
  m_input_of_value[v] = m_graph->inputs.size();
  if (by_reference) m_input_of_impl[t.impl().get()] = m_graph->inputs.size();
  m_graph->inputs.push_back(v);
  m_captures.push_back(t);
  return v;
}

XGRAD_API ir::Value* Tracer::add_constant(const TensorBase& t) {
  auto node = std::make_unique<ir::Node>();
  node->primitive = ir::make_primitive(op::Const{t});
  node->scope = scope_path();
  node->kernel = [t](std::span<const TensorBase>, std::span<TensorBase> out) { out[0] = t; };
  node->outputs.push_back(m_graph->new_value(t.dtype(), t.shape(), node.get()));
  return m_graph->append(std::move(node))->outputs[0];
}

}  // namespace xgrad::tracing
