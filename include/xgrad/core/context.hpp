// Thread-local execution context: the mode (eager or graph) and whether autodiff records.
#pragma once

namespace xgrad {

/// eager runs each op at once (PyNative); graph compiles Modules and train steps (GRAPH_MODE).
enum class Mode { eager, graph };

namespace detail {
struct Context {
  Mode mode = Mode::eager;
  bool grad_enabled = true;
  int transform_depth = 0;  // how many grad transforms are evaluating their function now
};
inline Context& context() {
  thread_local Context ctx;
  return ctx;
}
}  // namespace detail

/// Switches every Module call and Model::train between op-by-op and compiled execution.
inline void set_mode(Mode mode) { detail::context().mode = mode; }
/// The current execution mode (Mode::eager by default).
inline Mode get_mode() { return detail::context().mode; }

/// Scope guard: the execution mode inside the scope, the previous one restored after it.
class mode_scope {
 public:
  explicit mode_scope(Mode mode) : m_previous(get_mode()) { set_mode(mode); }
  ~mode_scope() { set_mode(m_previous); }
  mode_scope(const mode_scope&) = delete;
  mode_scope& operator=(const mode_scope&) = delete;

 private:
  Mode m_previous;
};

/// True when ops record on the autodiff tape.
inline bool is_grad_enabled() { return detail::context().grad_enabled; }

/// Scope guard: ops inside record nothing for autodiff (optimizer updates, evaluation).
class no_grad {
 public:
  no_grad() : m_previous(detail::context().grad_enabled) { detail::context().grad_enabled = false; }
  ~no_grad() { detail::context().grad_enabled = m_previous; }
  no_grad(const no_grad&) = delete;
  no_grad& operator=(const no_grad&) = delete;

 private:
  bool m_previous;
};

/// Scope guard: ops inside record for autodiff again, whatever the enclosing scope said.
class enable_grad {
 public:
  enable_grad() : m_previous(detail::context().grad_enabled) { detail::context().grad_enabled = true; }
  ~enable_grad() { detail::context().grad_enabled = m_previous; }
  enable_grad(const enable_grad&) = delete;
  enable_grad& operator=(const enable_grad&) = delete;

 private:
  bool m_previous;
};

}  // namespace xgrad
