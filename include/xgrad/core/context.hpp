// Execution context: the mode (eager or graph), process-wide as MindSpore's
// set_context(mode=...), with a per-thread override by mode_scope; and, per thread, whether
// autodiff records, how deep grad transforms and jit traces are nested, and which forward-mode
// (jvp) passes and vmaps are in progress.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

namespace xgrad {

/// eager runs each op at once (PyNative); graph compiles Modules and train steps (GRAPH_MODE).
enum class Mode { eager, graph };

namespace detail {
struct Context {
  bool grad_enabled = true;
  int transform_depth = 0;  // how many grad transforms are evaluating their function now
  int trace_depth = 0;      // how many jit traces are running on this thread (tracing::Tracer keeps it)
  int mode_override = -1;   // the Mode a mode_scope set on this thread, or -1 for the process's mode
  // How many jvp passes and vmaps are in progress (their levels: transform_levels()). Counts
  // here keep the Context trivially destructible, which makes every op's look at it a plain
  // thread-local read.
  int forward_passes = 0;
  int vmaps = 0;
  std::uint64_t recompute = 0;  // nonzero while a checkpoint recomputes its function (its number)
  std::uint64_t recomputes_made = 0;
};
inline Context& context() {
  thread_local Context ctx;
  return ctx;
}

/// The jvp passes and vmaps in progress on this thread, innermost last. Each has a level of its
/// own, never reused, so a tangent or batch left on a tensor by an ended one matches none.
struct TransformLevels {
  struct Forward {
    std::uint64_t id;
    bool paused = false;  // while its own tangent rules run
  };
  std::vector<Forward> forward;
  std::vector<std::uint64_t> vmap;
  std::uint64_t made = 0;
};
inline TransformLevels& transform_levels() {
  thread_local TransformLevels levels;
  return levels;
}
inline std::atomic<Mode>& process_mode() {
  static std::atomic<Mode> mode{Mode::eager};
  return mode;
}
}  // namespace detail

/// Switches every Module call and Model::train between op-by-op and compiled execution, for
/// the whole process (every thread), as MindSpore's set_context(mode=...) does. Inside a
/// mode_scope it also sets this thread's scoped mode, so get_mode() returns what was set.
inline void set_mode(Mode mode) {
  detail::process_mode().store(mode, std::memory_order_relaxed);
  if (detail::context().mode_override >= 0) detail::context().mode_override = static_cast<int>(mode);
}
/// This thread's execution mode: its innermost mode_scope's, else the process's (set_mode;
/// Mode::eager by default).
inline Mode get_mode() {
  const int scoped = detail::context().mode_override;
  return scoped >= 0 ? static_cast<Mode>(scoped) : detail::process_mode().load(std::memory_order_relaxed);
}

/// Scope guard: the execution mode of this thread inside the scope (other threads keep the
/// process's mode), the previous one restored after it.
class mode_scope {
 public:
  explicit mode_scope(Mode mode) : m_previous(detail::context().mode_override) {
    detail::context().mode_override = static_cast<int>(mode);
  }
  ~mode_scope() { detail::context().mode_override = m_previous; }
  mode_scope(const mode_scope&) = delete;
  mode_scope& operator=(const mode_scope&) = delete;

 private:
  int m_previous;
};

/// True while jit traces a function on this thread (ops then record graph nodes).
inline bool is_tracing() { return detail::context().trace_depth > 0; }

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
