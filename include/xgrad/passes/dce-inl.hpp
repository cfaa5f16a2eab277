// Definitions of passes/dce.hpp: included by it when header-only, compiled once into the
// library (src/passes.cpp) otherwise.
#pragma once

#include "xgrad/passes/dce.hpp"
#include "xgrad/passes/rewrite.hpp"

namespace xgrad::passes {

XGRAD_API bool dce(ir::Graph& g, const PassContext&) {
  std::unordered_set<const ir::Value*> live(g.outputs.begin(), g.outputs.end());
  for (const auto& e : g.effects) live.insert(e.value);
  std::unordered_set<const ir::Node*> dead;
  for (auto it = g.nodes.rbegin(); it != g.nodes.rend(); ++it) {
    const ir::Node& node = **it;
    bool used = node.has_effect;
    for (const ir::Value* v : node.outputs) used = used || live.count(v);
    if (!used) {
      dead.insert(&node);
      continue;
    }
    live.insert(node.inputs.begin(), node.inputs.end());
  }
  erase_nodes(g, dead);
  return !dead.empty();
}

}  // namespace xgrad::passes
