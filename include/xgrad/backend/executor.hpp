// The graph executor: runs a verified graph on concrete tensors, node by node, through the
// kernels eager mode uses, dropping each intermediate after its last use.
#pragma once

#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <vector>

#include "xgrad/ir/printer.hpp"

namespace xgrad::backend {

/// A graph ready to run. Immutable once built, so one Program serves concurrent calls.
class Program {
 public:
  Program() = default;
  explicit Program(std::shared_ptr<const ir::Graph> graph) : m_graph(std::move(graph)) {
    const auto& nodes = m_graph->nodes;
    std::vector<std::ptrdiff_t> last_use(m_graph->values.size(), -1);
    for (std::size_t k = 0; k < nodes.size(); ++k)
      for (const ir::Value* v : nodes[k]->inputs)
        last_use[static_cast<std::size_t>(v->id)] = static_cast<std::ptrdiff_t>(k);
    for (const ir::Value* v : m_graph->outputs) last_use[static_cast<std::size_t>(v->id)] = -1;
    for (const auto& e : m_graph->effects) last_use[static_cast<std::size_t>(e.value->id)] = -1;
    m_release.resize(nodes.size());
    for (std::size_t id = 0; id < last_use.size(); ++id)
      if (last_use[id] >= 0) m_release[static_cast<std::size_t>(last_use[id])].push_back(static_cast<int>(id));
  }

  const ir::Graph& graph() const { return *m_graph; }
  const std::shared_ptr<const ir::Graph>& graph_ptr() const { return m_graph; }

  /// Runs the graph on `inputs` (one per graph input, of its dtype and shape), applies its
  /// effects to those inputs and returns its outputs.
  std::vector<TensorBase> run(std::span<const TensorBase> inputs) const {
    const ir::Graph& g = *m_graph;
    std::vector<TensorBase> env(g.values.size());
    for (std::size_t i = 0; i < g.inputs.size(); ++i) env[static_cast<std::size_t>(g.inputs[i]->id)] = inputs[i];
    std::vector<TensorBase> in, out;
    for (std::size_t k = 0; k < g.nodes.size(); ++k) {
      const ir::Node& node = *g.nodes[k];
      in.clear();
      for (const ir::Value* v : node.inputs) in.push_back(env[static_cast<std::size_t>(v->id)]);
      out.assign(node.outputs.size(), TensorBase());
      node.kernel(in, out);
      for (std::size_t j = 0; j < out.size(); ++j) {
        const ir::Value& v = *node.outputs[j];
        if (!out[j].defined() || out[j].dtype() != v.dtype || !(out[j].shape() == v.shape))
          throw std::logic_error(
              xgrad::detail::concat("xgrad internal error: ", node.op, " (", node.loc.str(), ") made ",
                                    out[j].defined() ? ir::type_str(out[j].dtype(), out[j].shape()) : "nothing",
                                    " where the graph expects ", ir::type_str(v.dtype, v.shape)));
        env[static_cast<std::size_t>(v.id)] = std::move(out[j]);
      }
      for (int id : m_release[k]) env[static_cast<std::size_t>(id)] = TensorBase();
    }
    apply_effects(inputs, env);
    std::vector<TensorBase> results;
    results.reserve(g.outputs.size());
    for (const ir::Value* v : g.outputs) {
      const TensorBase& t = env[static_cast<std::size_t>(v->id)];
      // A constant belongs to the graph: the caller gets a copy it may change.
      results.push_back(v->producer && v->producer->op == "Const" ? copy_of(t) : t);
    }
    return results;
  }

 private:
  /// Writes every effect's value into its input. A value that is itself another effect's
  /// target (a swap) is copied first, so each write sees the values from before the call.
  void apply_effects(std::span<const TensorBase> inputs, std::vector<TensorBase>& env) const {
    const auto& effects = m_graph->effects;
    std::vector<TensorBase> sources;
    for (const auto& e : effects) {
      TensorBase src = env[static_cast<std::size_t>(e.value->id)];
      for (const auto& other : effects)
        if (&other != &e && inputs[other.input].impl()->storage == src.impl()->storage) {
          src = copy_of(src);
          break;
        }
      sources.push_back(src);
    }
    for (std::size_t i = 0; i < effects.size(); ++i) write_into(inputs[effects[i].input], sources[i]);
  }

  static TensorBase copy_of(const TensorBase& t) {
    auto copy = TensorImpl::allocate(t.shape(), t.dtype());
    std::memcpy(copy->storage->data(), t.impl()->storage->data(), copy->storage->bytes());
    return TensorBase(copy);
  }

  static void write_into(const TensorBase& dst, const TensorBase& src) {
    Storage& to = *dst.impl()->storage;
    const Storage& from = *src.impl()->storage;
    if (&to != &from)
      std::memcpy(to.data(), from.data(), static_cast<std::size_t>(dst.numel()) * dtype_size(dst.dtype()));
    to.bump_version();
  }

  std::shared_ptr<const ir::Graph> m_graph;
  std::vector<std::vector<int>> m_release;  // per node: the values no later node reads
};

}  // namespace xgrad::backend
