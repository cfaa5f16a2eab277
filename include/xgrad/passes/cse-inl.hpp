// Definitions of passes/cse.hpp: included by it when header-only, compiled once into the
// library (src/passes.cpp) otherwise.
#pragma once

#include <unordered_set>

#include "xgrad/passes/cse.hpp"
#include "xgrad/passes/rewrite.hpp"

namespace xgrad::passes {

namespace detail {

/// What identifies a node's computation: its primitive (typed parameters), inputs and output
/// types.
struct CseKey {
  const ir::Node* node;
  bool operator==(const CseKey& other) const {
    const ir::Node &a = *node, &b = *other.node;
    if (a.inputs != b.inputs || a.outputs.size() != b.outputs.size() || a.recompute != b.recompute) return false;
    for (std::size_t i = 0; i < a.outputs.size(); ++i)
      if (a.outputs[i]->dtype != b.outputs[i]->dtype || !(a.outputs[i]->shape == b.outputs[i]->shape)) return false;
    return a.primitive->equals(*b.primitive);
  }
};
struct CseHash {
  std::size_t operator()(const CseKey& key) const {
    std::size_t h = key.node->primitive->hash();
    for (const ir::Value* v : key.node->inputs) h = h * 31 + static_cast<std::size_t>(v->id);
    return h;
  }
};

/// Nodes CSE must leave alone: effects, subgraphs, no outputs.
inline bool cse_candidate(const ir::Node& node) {
  return !node.has_effect && node.subgraphs.empty() && !node.outputs.empty();
}

}  // namespace detail

XGRAD_API bool cse(ir::Graph& g, const PassContext&) {
  std::unordered_set<detail::CseKey, detail::CseHash> seen;
  std::unordered_set<const ir::Node*> dead;
  for (auto& node : g.nodes) {
    if (!detail::cse_candidate(*node)) continue;
    auto [first, fresh] = seen.insert({node.get()});
    if (fresh) continue;
    for (std::size_t i = 0; i < node->outputs.size(); ++i) replace_uses(g, node->outputs[i], first->node->outputs[i]);
    dead.insert(node.get());
  }
  erase_nodes(g, dead);
  return !dead.empty();
}

}  // namespace xgrad::passes
