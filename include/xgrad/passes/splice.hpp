// How a pass writes a replacement with the ops users call: the replacement is traced into a
// fragment (so its nodes get the kernels, types and attributes eager mode's ops give them) and
// the fragment's nodes are moved into the graph.
#pragma once

#include <span>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "xgrad/ir/tracer.hpp"

namespace xgrad::passes {

/// Traces `build(stand_ins)` (one tensor per value in `args`, one tensor back), inserts the
/// nodes it makes into `g` before position `at`, with the source location and scope of the
/// node they replace, and returns the value it computes.
template <class Build> ir::Value* splice(ir::Graph& g, std::size_t at, const std::vector<ir::Value*>& args,
                                         const ir::Node& replaced, Build build) {
  std::shared_ptr<ir::Graph> fragment;
  {
    tracing::Tracer tracer("splice");
    std::vector<TensorBase> stand_ins;
    for (const ir::Value* v : args) stand_ins.push_back(tracer.add_argument(v->dtype, v->shape, "arg"));
    const TensorBase result = build(std::span<const TensorBase>(stand_ins));
    fragment = tracer.finish(std::span<const TensorBase>(&result, 1));
  }
  if (fragment->inputs.size() != args.size())
    throw std::logic_error("xgrad internal error: a spliced replacement read a tensor from outside");
  std::unordered_map<const ir::Value*, ir::Value*> to;
  for (std::size_t i = 0; i < args.size(); ++i) to[fragment->inputs[i]] = args[i];
  for (auto& node : fragment->nodes) {
    for (ir::Value*& in : node->inputs) in = to.at(in);
    for (ir::Value*& out : node->outputs) {
      ir::Value* moved = g.new_value(out->dtype, out->shape, node.get());
      to[out] = moved;
      out = moved;
    }
    node->loc = replaced.loc;
    node->scope = replaced.scope;
  }
  ir::Value* result = to.at(fragment->outputs[0]);
  g.nodes.insert(g.nodes.begin() + static_cast<std::ptrdiff_t>(at), std::make_move_iterator(fragment->nodes.begin()),
                 std::make_move_iterator(fragment->nodes.end()));
  return result;
}

}  // namespace xgrad::passes
