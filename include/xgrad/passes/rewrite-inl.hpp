// Definitions of passes/rewrite.hpp: included by it when header-only, compiled once into the
// library (src/passes.cpp) otherwise.
#pragma once

#include <algorithm>
#include <cmath>

#include "xgrad/passes/rewrite.hpp"

namespace xgrad::passes {

XGRAD_API void replace_uses(ir::Graph& g, const ir::Value* from, ir::Value* to) {
  for (auto& node : g.nodes) std::replace(node->inputs.begin(), node->inputs.end(), const_cast<ir::Value*>(from), to);
  std::replace(g.outputs.begin(), g.outputs.end(), const_cast<ir::Value*>(from), to);
  for (auto& e : g.effects)
    if (e.value == from) e.value = to;
}

XGRAD_API const ir::Node* constant_node(const ir::Value* v) {
  return v->producer && v->producer->is<op::Const>() ? v->producer : nullptr;
}

XGRAD_API bool is_constant(const ir::Value* v, double x) {
  const ir::Node* c = constant_node(v);
  if (!c) return false;
  const TensorBase t = ir::on_host(c->params<op::Const>().value);
  const void* data = t.impl()->storage->data();
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    double e = t.dtype() == DType::float32   ? static_cast<const float*>(data)[i]
               : t.dtype() == DType::float64 ? static_cast<const double*>(data)[i]
               : t.dtype() == DType::int32   ? static_cast<const std::int32_t*>(data)[i]
               : t.dtype() == DType::int64   ? static_cast<double>(static_cast<const std::int64_t*>(data)[i])
                                             : static_cast<const bool*>(data)[i];
    if (e != x) return false;
  }
  return true;
}

XGRAD_API bool is_positive_zero(const ir::Value* v) {
  if (!is_constant(v, 0)) return false;
  const TensorBase t = ir::on_host(constant_node(v)->params<op::Const>().value);
  const void* data = t.impl()->storage->data();
  for (std::int64_t i = 0; i < t.numel(); ++i)
    if ((t.dtype() == DType::float32 && std::signbit(static_cast<const float*>(data)[i])) ||
        (t.dtype() == DType::float64 && std::signbit(static_cast<const double*>(data)[i])))
      return false;
  return true;
}

XGRAD_API std::size_t readers(const ir::Graph& g, const ir::Value* v) {
  std::size_t count = static_cast<std::size_t>(std::count(g.outputs.begin(), g.outputs.end(), v));
  for (const auto& node : g.nodes)
    count += static_cast<std::size_t>(std::count(node->inputs.begin(), node->inputs.end(), v));
  for (const auto& e : g.effects) count += e.value == v;
  return count;
}

XGRAD_API std::size_t position_of(const ir::Graph& g, const ir::Node* node) {
  return static_cast<std::size_t>(
      std::find_if(g.nodes.begin(), g.nodes.end(), [&](const auto& p) { return p.get() == node; }) - g.nodes.begin());
}

XGRAD_API void renumber(ir::Graph& g) {
  std::vector<std::shared_ptr<ir::Value>> kept;
  std::unordered_map<const ir::Value*, std::shared_ptr<ir::Value>> owner;
  for (auto& v : g.values) owner[v.get()] = v;
  auto keep = [&](ir::Value* v) {
    v->id = static_cast<int>(kept.size());
    kept.push_back(owner.at(v));
  };
  for (ir::Value* v : g.inputs) keep(v);
  for (auto& node : g.nodes)
    for (ir::Value* v : node->outputs) keep(v);
  g.values = std::move(kept);
}

XGRAD_API void erase_nodes(ir::Graph& g, const std::unordered_set<const ir::Node*>& dead) {
  std::erase_if(g.nodes, [&](const std::unique_ptr<ir::Node>& n) { return dead.count(n.get()) > 0; });
}

}  // namespace xgrad::passes
