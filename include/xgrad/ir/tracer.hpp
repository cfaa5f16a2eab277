// The tracer: while jit runs a function on symbolic tensors, every op appends a node to the
// graph of the innermost active Tracer instead of running a kernel. Tensors that are not
// symbolic become graph inputs read by reference (they existed before the trace: Parameters,
// captured data) or constants (made during the trace: scalars, ones for a gradient seed).
#pragma once

#include <exception>
#include <initializer_list>
#include <map>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "xgrad/ir/graph.hpp"

namespace xgrad::tracing {

class Tracer;

namespace detail {
inline Tracer*& active_tracer() {
  thread_local Tracer* tracer = nullptr;
  return tracer;
}
inline std::vector<std::string>& scope_stack() {
  thread_local std::vector<std::string> scopes;
  return scopes;
}
}  // namespace detail

/// Scope guard naming the nodes traced inside it ("LeNet5/conv1"): Modules push their name.
class NameScope {
 public:
  explicit NameScope(std::string name) { detail::scope_stack().push_back(std::move(name)); }
  ~NameScope() { detail::scope_stack().pop_back(); }
  NameScope(const NameScope&) = delete;
  NameScope& operator=(const NameScope&) = delete;
};

/// Scope guard while autodiff runs one op's gradient rule: the nodes the rule traces are
/// placed at that op's source line, under the scope "Gradients", not inside xgrad's headers.
class GradientScope {
 public:
  explicit GradientScope(SourceLoc forward) : m_previous(location()) {
    location() = forward;
    detail::scope_stack().push_back("Gradients");
  }
  ~GradientScope() {
    location() = m_previous;
    detail::scope_stack().pop_back();
  }
  GradientScope(const GradientScope&) = delete;
  GradientScope& operator=(const GradientScope&) = delete;
  /// The forward op's line while a rule runs; line 0 otherwise.
  static SourceLoc& location() {
    thread_local SourceLoc loc;
    return loc;
  }

 private:
  SourceLoc m_previous;
};

/// The current scope path, "Outer/inner".
inline std::string scope_path() {
  std::string out;
  for (const auto& s : detail::scope_stack()) out += (out.empty() ? "" : "/") + s;
  return out;
}

/// The op that stopped a trace, as noted by the innermost op scope that threw.
struct Failure {
  std::string op;
  SourceLoc loc;
  std::vector<TensorBase> inputs;
  std::string scope;
};

/// Records one function's graph; the innermost Tracer alive on a thread is the active one.
class Tracer {
 public:
  explicit Tracer(std::string name) : m_graph(std::make_shared<ir::Graph>()), m_parent(detail::active_tracer()) {
    m_graph->name = std::move(name);
    m_first_serial = Storage::next_serial();
    detail::active_tracer() = this;
    ++xgrad::detail::context().trace_depth;
  }
  ~Tracer() {
    detail::active_tracer() = m_parent;
    --xgrad::detail::context().trace_depth;
  }
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  /// The tracer ops on this thread append to, or null when running eagerly.
  static Tracer* active() { return detail::active_tracer(); }

  ir::Graph& graph() { return *m_graph; }
  std::shared_ptr<ir::Graph> graph_ptr() const { return m_graph; }
  Tracer* parent() const { return m_parent; }
  /// The tensors bound to the inputs after the arguments, in order: concrete tensors read by
  /// reference for a top-level graph; the enclosing graph's tensors for a subgraph.
  const std::vector<TensorBase>& captures() const { return m_captures; }

  /// A new graph argument, as a symbolic tensor.
  TensorBase add_argument(DType dtype, const Shape& shape, std::string name) {
    if (!m_captures.empty()) throw std::logic_error("xgrad internal error: argument added after a capture");
    ir::Value* v = m_graph->new_value(dtype, shape, nullptr);
    v->name = std::move(name);
    m_input_of_value[v] = m_graph->inputs.size();
    m_graph->inputs.push_back(v);
    m_graph->num_args = m_graph->inputs.size();
    TensorBase t = symbolic(v);
    m_input_of_impl[t.impl().get()] = m_input_of_value[v];
    return t;
  }

  /// A symbolic tensor standing for `v`.
  TensorBase symbolic(const ir::Value* v) const {
    return TensorBase(std::make_shared<TensorImpl>(v->shape, v->dtype, m_graph->share(v)));
  }

  /// The value `t` stands for in this graph; lifts tensors from outside it as inputs.
  ir::Value* resolve(const TensorBase& t);

  /// Appends a node reading `inputs` and making values of the given types.
  std::vector<TensorBase> emit(std::shared_ptr<const ir::Primitive> primitive, SourceLoc loc,
                               std::span<const TensorBase> inputs, const std::vector<std::pair<DType, Shape>>& outputs,
                               ir::Kernel kernel, OpTraits traits = {},
                               std::vector<std::shared_ptr<const ir::Graph>> subgraphs = {}, bool has_effect = false) {
    auto node = std::make_unique<ir::Node>();
    node->primitive = std::move(primitive);
    SourceLoc forward = GradientScope::location();
    node->loc = forward.line() != 0 ? forward : loc;
    node->scope = scope_path();
    node->traits = traits;
    node->kernel = std::move(kernel);
    node->subgraphs = std::move(subgraphs);
    node->has_effect = has_effect;
    for (const auto& in : inputs) node->inputs.push_back(resolve(in));
    std::vector<TensorBase> out;
    for (const auto& [dtype, shape] : outputs) {
      node->outputs.push_back(m_graph->new_value(dtype, shape, node.get()));
      out.push_back(symbolic(node->outputs.back()));
    }
    m_graph->append(std::move(node));
    return out;
  }

  /// An in-place write: from now on `target` stands for `value`. A write into an argument or
  /// into a tensor read by reference becomes an effect, applied when a call finishes.
  void rebind(const TensorBase& target, const TensorBase& value, SourceLoc loc) {
    ir::Value* v = resolve(value);
    ir::Value* old = resolve(target);
    if (m_parent && !old->producer && m_input_of_value.at(old) >= m_graph->num_args)
      throw ValueError(xgrad::detail::concat(
          "jit: an in-place update (at ", loc.str(),
          ") of a tensor from outside a cond / while_loop / fori_loop body; return the new value from the body "
          "instead"));
    TensorImpl& impl = *target.impl();
    ++impl.rebinds;
    if (!impl.storage && impl.value.get() == old)
      impl.value = m_graph->share(v);
    else
      m_lifted[&impl] = v;
    if (auto input = m_input_of_impl.find(&impl); input != m_input_of_impl.end() && !m_parent)
      m_effects[input->second] = {input->second, v, loc};
  }

  /// Sets the graph's outputs and effects; the tracer's work is done.
  std::shared_ptr<ir::Graph> finish(std::span<const TensorBase> outputs) {
    for (const auto& out : outputs) m_graph->outputs.push_back(resolve(out));
    for (auto& [input, effect] : m_effects) m_graph->effects.push_back(effect);
    return m_graph;
  }

  /// Called by the op that threw, while the stack unwinds; the innermost op wins.
  void note_failure(std::string_view op, SourceLoc loc, std::vector<TensorBase> inputs) noexcept {
    if (m_failure) return;
    try {
      m_failure = std::make_unique<Failure>(Failure{std::string(op), loc, std::move(inputs), scope_path()});
    } catch (...) {
    }
  }
  const Failure* failure() const { return m_failure.get(); }

 private:
  ir::Value* add_input(const TensorBase& t, bool by_reference) {
    ir::Value* v = m_graph->new_value(t.dtype(), t.shape(), nullptr);
    v->by_reference = by_reference;
    if (t.impl()->autograd) v->name = t.impl()->autograd->name;
    m_input_of_value[v] = m_graph->inputs.size();
    if (by_reference) m_input_of_impl[t.impl().get()] = m_graph->inputs.size();
    m_graph->inputs.push_back(v);
    m_captures.push_back(t);
    return v;
  }

  ir::Value* add_constant(const TensorBase& t);

  std::shared_ptr<ir::Graph> m_graph;
  Tracer* m_parent;
  std::uint64_t m_first_serial = 0;
  std::vector<TensorBase> m_captures;
  std::unordered_map<const TensorImpl*, ir::Value*> m_lifted;          // tensors from outside, and rebound ones
  std::unordered_map<const ir::Value*, std::size_t> m_input_of_value;  // input values -> position
  std::unordered_map<const TensorImpl*, std::size_t> m_input_of_impl;  // tensors an effect writes back to
  std::map<std::size_t, ir::Graph::Effect> m_effects;                  // by input position
  std::unique_ptr<Failure> m_failure;
};

inline ir::Value* Tracer::resolve(const TensorBase& t) {
  const TensorImpl* impl = t.impl().get();
  if (!impl) throw ValueError("jit: an undefined tensor (an empty handle) was used while tracing");
  if (auto it = m_lifted.find(impl); it != m_lifted.end()) return it->second;
  if (impl->value && impl->value->graph == m_graph.get()) return impl->value.get();
  ir::Value* v = nullptr;
  if (!impl->storage) {
    bool enclosing = false;
    for (Tracer* p = m_parent; p && !enclosing; p = p->m_parent) enclosing = impl->value->graph == p->m_graph.get();
    if (!enclosing)
      throw ValueError(xgrad::detail::concat(
          "jit: a traced tensor (", dtype_name(impl->dtype), impl->shape,
          ") escaped the function that made it: it was kept (in a global, a member or a captured variable) "
          "after its jit function returned; return it from that function instead"));
    v = add_input(t, false);
  } else if (impl->storage->serial() >= m_first_serial) {
    v = add_constant(t);
  } else {
    v = add_input(t, m_parent == nullptr);
  }
  m_lifted[impl] = v;
  return v;
}

inline ir::Value* Tracer::add_constant(const TensorBase& t) {
  auto node = std::make_unique<ir::Node>();
  node->primitive = ir::make_primitive(op::Const{t});
  node->scope = scope_path();
  node->kernel = [t](std::span<const TensorBase>, std::span<TensorBase> out) { out[0] = t; };
  node->outputs.push_back(m_graph->new_value(t.dtype(), t.shape(), node.get()));
  return m_graph->append(std::move(node))->outputs[0];
}

}  // namespace xgrad::tracing
