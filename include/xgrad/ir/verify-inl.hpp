// Definitions of ir/verify.hpp: included by it when header-only, compiled once into the
// library (src/ir.cpp) otherwise.
#pragma once

#include <stdexcept>
#include <unordered_set>

#include "xgrad/ir/printer.hpp"
#include "xgrad/ir/verify.hpp"

namespace xgrad::ir {

XGRAD_API void verify(const Graph& graph) {
  auto fail = [&](const std::string& why) {
    throw std::logic_error(xgrad::detail::concat("xgrad internal error: graph '", graph.name, "' is malformed: ", why,
                                                 "\n", to_text(graph)));
  };
  std::unordered_set<const Value*> defined(graph.inputs.begin(), graph.inputs.end());
  if (graph.num_args > graph.inputs.size()) fail("more arguments than inputs");
  for (const Value* v : graph.inputs)
    if (v->producer || v->graph != &graph) fail(xgrad::detail::concat("input %", v->id, " is not an input of it"));
  for (const auto& node : graph.nodes) {
    for (const Value* in : node->inputs)
      if (!defined.count(in))
        fail(xgrad::detail::concat(node->op(), " reads %", in->id, " before it is defined (", node->loc.str(), ")"));
    for (const Value* out : node->outputs) {
      if (out->producer != node.get() || out->graph != &graph)
        fail(xgrad::detail::concat(node->op(), " lists %", out->id, " as an output it does not make"));
      if (!defined.insert(out).second) fail(xgrad::detail::concat("%", out->id, " is defined twice"));
    }
    if (!node->kernel) fail(xgrad::detail::concat(node->op(), " has no kernel"));
    for (const auto& sub : node->subgraphs) verify(*sub);
  }
  for (const Value* v : graph.outputs)
    if (!defined.count(v)) fail(xgrad::detail::concat("output %", v->id, " is not defined"));
  for (const auto& e : graph.effects) {
    if (e.input >= graph.inputs.size()) fail("an effect writes past the inputs");
    const Value& target = *graph.inputs[e.input];
    if (!defined.count(e.value) || e.value->dtype != target.dtype || !(e.value->shape == target.shape))
      fail(xgrad::detail::concat("effect on %", target.id, " writes %", e.value->id, " of another type"));
  }
}

}  // namespace xgrad::ir
