// Definitions of passes/fold.hpp: included by it when header-only, compiled once into the
// library (src/passes.cpp) otherwise.
#pragma once

#include <vector>

#include "xgrad/ir/printer.hpp"
#include "xgrad/passes/fold.hpp"
#include "xgrad/passes/rewrite.hpp"

namespace xgrad::passes {

XGRAD_API bool fold(ir::Graph& g, const PassContext&) {
  bool changed = false;
  for (std::size_t k = 0; k < g.nodes.size(); ++k) {
    ir::Node& node = *g.nodes[k];
    if (node.is<op::Const>() || node.has_effect || !node.subgraphs.empty() || node.inputs.empty()) continue;
    std::vector<TensorBase> in;
    std::int64_t in_numel = 0, out_numel = 0;
    for (const ir::Value* v : node.inputs) {
      const ir::Node* c = constant_node(v);
      if (!c) break;
      in.push_back(c->params<op::Const>().value);
      in_numel += v->shape.numel();
    }
    if (in.size() != node.inputs.size()) continue;
    for (const ir::Value* v : node.outputs) out_numel += v->shape.numel();
    // Folding must not turn a small constant into a larger one: a broadcast of a scalar stays
    // a broadcast, which elementwise readers then skip (simplify), reading the scalar itself.
    if (out_numel > std::max<std::int64_t>(in_numel, 64)) continue;
    std::vector<TensorBase> out(node.outputs.size());
    node.kernel(in, out);
    // The node becomes a Const per output; each output value keeps its id and readers.
    std::vector<std::unique_ptr<ir::Node>> consts;
    for (std::size_t i = 0; i < out.size(); ++i) {
      auto c = std::make_unique<ir::Node>();
      c->primitive = ir::make_primitive(op::Const{out[i]});
      c->loc = node.loc;
      c->scope = node.scope;
      c->kernel = [t = out[i]](std::span<const TensorBase>, std::span<TensorBase> o) { o[0] = t; };
      c->outputs.push_back(node.outputs[i]);
      node.outputs[i]->producer = c.get();
      consts.push_back(std::move(c));
    }
    g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(k));
    for (auto& c : consts) g.nodes.insert(g.nodes.begin() + static_cast<std::ptrdiff_t>(k++), std::move(c));
    --k;
    changed = true;
  }
  return changed;
}

}  // namespace xgrad::passes
