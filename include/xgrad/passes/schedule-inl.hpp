// Definitions of passes/schedule.hpp: included by it when header-only, compiled once into the
// library (src/passes.cpp) otherwise.
#pragma once

#include <algorithm>
#include <memory>
#include <unordered_map>
#include <vector>

#include "xgrad/backend/schedule.hpp"
#include "xgrad/passes/schedule.hpp"

namespace xgrad::passes {

XGRAD_API bool schedule(ir::Graph& g) {
  struct Slot {
    std::vector<std::unique_ptr<ir::Node>> nodes;
    bool side_by_side = false;
  };
  // Constants first: one made late (the optimizer's momentum) must not hold back its readers.
  std::vector<Slot> slots(1);
  std::unordered_map<const ir::Node*, std::size_t> slot_of;
  std::vector<const ir::Node*> before;
  for (auto& node : g.nodes) {
    before.push_back(node.get());
    if (node->inputs.empty() && !node->has_effect && node->subgraphs.empty()) {
      slot_of[node.get()] = 0;
      slots[0].nodes.push_back(std::move(node));
      continue;
    }
    std::size_t ready = 0;
    for (const ir::Value* v : node->inputs)
      if (v->producer) ready = std::max(ready, slot_of.at(v->producer) + 1);
    const bool side_by_side = backend::runs_beside_others(*node);
    std::size_t s = slots.size();
    if (side_by_side)
      for (std::size_t t = ready; t < slots.size(); ++t)
        if (slots[t].side_by_side) {
          s = t;
          break;
        }
    if (s == slots.size()) slots.push_back({{}, side_by_side});
    slot_of[node.get()] = s;
    slots[s].nodes.push_back(std::move(node));
  }
  g.nodes.clear();
  for (Slot& slot : slots)
    for (auto& node : slot.nodes) g.nodes.push_back(std::move(node));
  for (std::size_t k = 0; k < before.size(); ++k)
    if (g.nodes[k].get() != before[k]) return true;
  return false;
}

}  // namespace xgrad::passes
