// Common subexpression elimination: of nodes that compute the same thing from the same
// inputs (same op, attributes and types; Consts: same value), the first is kept.
#pragma once

#include <cstring>
#include <string>

#include "xgrad/passes/rewrite.hpp"

namespace xgrad::passes {

namespace detail {

/// What identifies a node's computation, or "" for nodes CSE must leave alone.
inline std::string cse_key(const ir::Node& node) {
  if (node.has_effect || !node.subgraphs.empty() || node.outputs.empty()) return {};
  std::string key = node.op;
  for (const auto& a : node.attrs) key += "|" + a.name + "=" + a.value;
  for (const ir::Value* v : node.inputs) key += "|%" + std::to_string(v->id);
  for (const ir::Value* v : node.outputs) key += "|" + xgrad::detail::concat(dtype_short_name(v->dtype), v->shape);
  if (node.op == "Const") {
    const TensorBase& t = node.constant;
    const std::size_t bytes = static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype());
    if (bytes > 256) return {};  // large constants are not compared
    key.append("|").append(static_cast<const char*>(t.impl()->storage->data()), bytes);
  }
  return key;
}

}  // namespace detail

inline bool cse(ir::Graph& g, const PassContext&) {
  std::unordered_map<std::string, const ir::Node*> seen;
  std::unordered_set<const ir::Node*> dead;
  for (auto& node : g.nodes) {
    std::string key = detail::cse_key(*node);
    if (key.empty()) continue;
    auto [first, fresh] = seen.try_emplace(key, node.get());
    if (fresh) continue;
    for (std::size_t i = 0; i < node->outputs.size(); ++i) replace_uses(g, node->outputs[i], first->second->outputs[i]);
    dead.insert(node.get());
  }
  erase_nodes(g, dead);
  return !dead.empty();
}

}  // namespace xgrad::passes
