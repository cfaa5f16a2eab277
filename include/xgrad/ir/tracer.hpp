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

#include "xgrad/core/config.hpp"
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
XGRAD_API std::string scope_path();

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
  XGRAD_API explicit Tracer(std::string name);
  XGRAD_API ~Tracer();
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

  /// From now on, an op whose inputs are all concrete tensors (none comes from an argument) runs
  /// at once and its result joins the graph as a constant: the graph keeps only the work that
  /// depends on its arguments (linearize's linear function), and reads those tensors as they
  /// are now, not at each call.
  void evaluate_concrete_ops() { m_evaluate_concrete = true; }

  /// A new graph argument, as a symbolic tensor.
  XGRAD_API TensorBase add_argument(DType dtype, const Shape& shape, std::string name);

  /// A symbolic tensor standing for `v`.
  TensorBase symbolic(const ir::Value* v) const {
    return TensorBase(std::make_shared<TensorImpl>(v->shape, v->dtype, m_graph->share(v)));
  }

  /// The value `t` stands for in this graph; lifts tensors from outside it as inputs.
  XGRAD_API ir::Value* resolve(const TensorBase& t);

  /// Appends a node reading `inputs` and making values of the given types.
  XGRAD_API std::vector<TensorBase> emit(std::shared_ptr<const ir::Primitive> primitive, SourceLoc loc,
                                         std::span<const TensorBase> inputs,
                                         const std::vector<std::pair<DType, Shape>>& outputs, ir::Kernel kernel,
                                         OpTraits traits = {},
                                         std::vector<std::shared_ptr<const ir::Graph>> subgraphs = {},
                                         bool has_effect = false);

  /// An in-place write: from now on `target` stands for `value`. A write into an argument or
  /// into a tensor read by reference becomes an effect, applied when a call finishes.
  XGRAD_API void rebind(const TensorBase& target, const TensorBase& value, SourceLoc loc);

  /// Sets the graph's outputs and effects; the tracer's work is done.
  XGRAD_API std::shared_ptr<ir::Graph> finish(std::span<const TensorBase> outputs);

  /// Called by the op that threw, while the stack unwinds; the innermost op wins.
  XGRAD_API void note_failure(std::string_view op, SourceLoc loc, std::vector<TensorBase> inputs) noexcept;
  const Failure* failure() const { return m_failure.get(); }

 private:
  XGRAD_API ir::Value* add_input(const TensorBase& t, bool by_reference);

  XGRAD_API ir::Value* add_constant(const TensorBase& t);

  std::shared_ptr<ir::Graph> m_graph;
  Tracer* m_parent;
  std::uint64_t m_first_serial = 0;
  bool m_evaluate_concrete = false;
  std::vector<TensorBase> m_captures;
  std::unordered_map<const TensorImpl*, ir::Value*> m_lifted;          // tensors from outside, and rebound ones
  std::unordered_map<const ir::Value*, std::size_t> m_input_of_value;  // input values -> position
  std::unordered_map<const TensorImpl*, std::size_t> m_input_of_impl;  // tensors an effect writes back to
  std::map<std::size_t, ir::Graph::Effect> m_effects;                  // by input position
  std::unique_ptr<Failure> m_failure;
};

}  // namespace xgrad::tracing

#if !defined(XGRAD_COMPILED)
#include "xgrad/ir/tracer-inl.hpp"
#endif
