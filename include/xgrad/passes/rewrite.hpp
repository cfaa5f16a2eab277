// Graph edits the passes share, and what a pass is.
//
// A pass may rely on one rule of the IR: a node's kernel is determined by its op name, its
// attributes and the types of its inputs and outputs (Const nodes: by their value). So two
// nodes that agree on those compute the same thing, and a node may be rewired to another
// input of the same type.
#pragma once

#include <algorithm>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "xgrad/ir/graph.hpp"

namespace xgrad::passes {

/// What every pass may consult.
struct PassContext {
  /// Keep every floating-point operation as eager mode does it: no rewrite that can change a
  /// result's bits (x + 0 turns -0 into +0; exp(log x) rounds).
  bool strict = false;
};

/// A pass changes the graph in place and says whether it changed anything.
using PassFn = bool (*)(ir::Graph&, const PassContext&);

struct Pass {
  std::string_view name;
  PassFn run;
};

/// Makes every reader of `from` (nodes, outputs, effects) read `to` instead.
inline void replace_uses(ir::Graph& g, const ir::Value* from, ir::Value* to) {
  for (auto& node : g.nodes) std::replace(node->inputs.begin(), node->inputs.end(), const_cast<ir::Value*>(from), to);
  std::replace(g.outputs.begin(), g.outputs.end(), const_cast<ir::Value*>(from), to);
  for (auto& e : g.effects)
    if (e.value == from) e.value = to;
}

/// The node making `v`, when it is a Const; null otherwise.
inline const ir::Node* constant_node(const ir::Value* v) {
  return v->producer && v->producer->is<op::Const>() ? v->producer : nullptr;
}

/// True when every element of the Const `v` equals `x`.
inline bool is_constant(const ir::Value* v, double x) {
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

/// Drops the values no node, input or output refers to and numbers the rest in order, so
/// the printed graph reads %0, %1, ... again after nodes were removed.
inline void renumber(ir::Graph& g) {
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

/// Removes the nodes `dead` marks.
inline void erase_nodes(ir::Graph& g, const std::unordered_set<const ir::Node*>& dead) {
  std::erase_if(g.nodes, [&](const std::unique_ptr<ir::Node>& n) { return dead.count(n.get()) > 0; });
}

}  // namespace xgrad::passes
