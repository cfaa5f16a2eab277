// jit(f): traces f once per input signature (dtypes and shapes of its tensors, values of its
// other arguments) into a typed graph, verifies it, and runs the graph on later calls.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "xgrad/autograd/functional.hpp"
#include "xgrad/core/config.hpp"
#include "xgrad/jit/function.hpp"
#include "xgrad/jit/tree.hpp"
#include "xgrad/ops/record.hpp"
#include "xgrad/passes/pipeline.hpp"

namespace xgrad {

/// How much the optimizer does: O0 nothing, O1 simplifications (DCE, CSE, folding), O2 also
/// fusion and memory planning (MindSpore's jit_level).
enum class JitLevel { O0, O1, O2 };

struct JitConfig {
  JitLevel level = JitLevel::O2;
  /// How many times a jitted function may trace again for a new signature after its first
  /// trace; -1 for no limit (any other negative value is a ValueError). Going past it throws
  /// RetraceError saying what changed.
  int max_retraces = -1;
  /// Shown in logs, reports and saved graphs; "jit@file.cpp:12" when empty.
  std::string name = {};
  /// Keep every floating-point operation as eager mode does it, so results are bitwise equal
  /// to eager: passes skip rewrites that can change rounding (x + 0, exp(log x), a * b + c as
  /// an fma, a sum of k copies as one multiply).
  bool strict = false;
  /// Passes to skip, by name ("simplify", "layout", "fold", "cse", "dce", "fuse", "schedule",
  /// "plan_memory"), for debugging and tests.
  std::vector<std::string> disabled_passes = {};
  /// Debugging: fill each arena buffer with 0xFF bytes when the memory plan frees it, so a
  /// read after the planned last use gives NaNs rather than plausible stale values.
  bool poison_freed_buffers = false;
  /// Run the ops that read no argument (only tensors from outside the function) once, while
  /// tracing, and keep their results as constants: each call then does only the work that
  /// depends on its arguments, and sees those tensors as they were when it traced. linearize's
  /// linear function is compiled so.
  bool fold_captures = false;
};

/// Throws ValueError for a JitConfig that would otherwise be read in a way its writer did not
/// mean (a negative retrace limit other than -1, a level outside O0..O2, an unknown pass).
XGRAD_API void validate(const JitConfig& config);

/// Scope guard: a jitted function that traces while one is alive throws RetraceError, so a
/// test can show that a hot loop never recompiles.
class expect_cache_hit {
 public:
  expect_cache_hit() { ++depth(); }
  ~expect_cache_hit() { --depth(); }
  expect_cache_hit(const expect_cache_hit&) = delete;
  expect_cache_hit& operator=(const expect_cache_hit&) = delete;
  static int& depth() {
    thread_local int d = 0;
    return d;
  }
};

/// A compiled graph: its text (ir(), with fused groups as subgraphs and, at O2, where each
/// intermediate lives in the arena), Graphviz dot (dot()), size and memory plan.
class Lowered {
 public:
  explicit Lowered(std::shared_ptr<const backend::Program> program) : m_program(std::move(program)) {}
  XGRAD_API std::string ir() const;
  std::string dot() const { return ir::to_dot(graph()); }
  std::size_t num_nodes() const { return graph().nodes.size(); }
  const ir::Graph& graph() const { return m_program->graph(); }
  /// Bytes of the arena one call uses for intermediates (0 when memory is not planned).
  std::size_t peak_arena_bytes() const {
    const backend::MemoryPlan* plan = m_program->memory_plan();
    return plan ? plan->arena_bytes : 0;
  }
  /// The memory plan (null below O2 or with "plan_memory" disabled): per value its arena
  /// offset, which outputs are written in place of an input, which reuse a freed buffer.
  const backend::MemoryPlan* memory_plan() const { return m_program->memory_plan(); }

 private:
  std::shared_ptr<const backend::Program> m_program;
};

namespace tracing::detail {

/// The dtypes and shapes of a call's tensors and its static values.
struct Signature {
  std::vector<std::pair<DType, Shape>> tensors;
  std::vector<std::int64_t> statics;
  std::vector<std::int32_t> aliases;  // as Flat::aliases

  XGRAD_API bool matches(const Flat& flat) const;
  XGRAD_API static Signature of(const Flat& flat);
};

/// Fills flat.aliases (see Flat). Returns the position of the first tensor that has no data
/// (a tensor made inside a trace and kept after it), or -1 when every one has.
XGRAD_API std::ptrdiff_t note_aliases(Flat& flat);

/// How a message names input q of a call: its argument label, or the tensor read by reference.
XGRAD_API std::string input_label(std::size_t q, const std::vector<std::string>& labels,
                                  const std::vector<TensorBase>& captures);

/// The error for a write into an input that another input shares memory with.
XGRAD_API ValueError aliasing_error(const std::string& where, const std::string& written, const std::string& other,
                                    bool same_view);

/// The vectors one call of a jitted function fills (its flattened arguments, its outputs),
/// taken from a per-thread pool and given back emptied, so that a warm call allocates nothing
/// but its outputs. A pool, not one set: a call can run inside another.
class CallVectors {
 public:
  struct Vectors {
    Flat flat;
    std::vector<TensorBase> outputs;
  };

  XGRAD_API CallVectors();
  XGRAD_API ~CallVectors();
  CallVectors(const CallVectors&) = delete;
  CallVectors& operator=(const CallVectors&) = delete;

  Vectors* operator->() const { return m_vectors.get(); }

 private:
  XGRAD_API static std::vector<std::unique_ptr<Vectors>>& pool();

  std::unique_ptr<Vectors> m_vectors;
};

class Cache;

/// One compiled signature.
struct Entry {
  Signature signature;
  std::shared_ptr<const backend::Program> program;
  std::vector<TensorBase> captures;          // bound to the inputs after the arguments
  std::vector<std::int64_t> output_statics;  // container sizes of the result
  std::vector<std::size_t> written;          // the inputs the graph's effects write into
  // Per output: whether autodiff can reach it from the arguments, and from the captured
  // tensors that require grad (Parameters). A call records on the tape only outputs that
  // depend on something that requires grad.
  std::vector<bool> from_arguments;
  std::vector<bool> from_captures;
  // Per output, the compiled vector-Jacobian product, made when a backward pass first asks.
  mutable std::mutex vjp_mutex;
  mutable std::vector<std::shared_ptr<Cache>> vjps;
};

/// Which outputs of `g` depend on its arguments (a float output of any op reading one).
XGRAD_API std::vector<bool> reached_from_arguments(const ir::Graph& g);

/// What a trace of the user's function gives back.
struct TraceResult {
  std::vector<TensorBase> outputs;
  std::vector<std::int64_t> statics;
};

/// "argument 0: f32[32, 10] -> f32[16, 10]": how `now` differs from the closest of `cached`.
XGRAD_API std::string explain_retrace(const Signature& now, const std::vector<std::string>& labels,
                                      const std::vector<const Signature*>& cached);

/// Flattens a call's arguments again into `labels`, naming each tensor ("argument 1[2]"), for
/// the messages that say which argument is meant.
using Relabel = FunctionRef<void(std::vector<std::string>& labels)>;

/// The compiled signatures of one jitted function, shared by its copies and its threads.
class Cache {
 public:
  /// `keep_effects` false: graphs drop their writes into inputs (a gradient graph runs the
  /// function again and must not apply its updates a second time).
  XGRAD_API Cache(JitConfig config, SourceLoc loc, bool keep_effects = true);

  const std::string& name() const { return m_config.name; }
  SourceLoc loc() const { return m_loc; }
  const JitConfig& config() const { return m_config; }

  XGRAD_API std::shared_ptr<const Entry> find(const Flat& flat) const;

  std::size_t size() const {
    std::shared_lock lock(m_mutex);
    return m_entries.size();
  }

  /// Runs a flat function on concrete tensors, compiled per signature. A tensor the graph
  /// reads by reference that is among `replaced` is read from the same position of
  /// `replacements` instead.
  XGRAD_API std::vector<TensorBase> run(const FlatFn& fn, const std::vector<TensorBase>& args,
                                        std::span<const TensorBase> replaced = {},
                                        std::span<const TensorBase> replacements = {});

  /// Traces `body` for a signature not in the cache yet. `relabel` flattens the call again
  /// with labels, to say which argument changed.
  /// Thrown by compile when the function writes into an argument that another argument is
  /// (Flat::aliases) and the trace gave them separate symbolic tensors: trace again with one.
  struct NeedsMergedAliases {};

  XGRAD_API std::shared_ptr<const Entry> compile(const Flat& flat, FunctionRef<TraceResult()> body, Relabel relabel,
                                                 bool aliases_merged = false);

  /// "jit 'name' (file.cpp:12)", as messages name this function.
  XGRAD_API std::string where() const;

  /// On a cache hit of an entry that writes into its inputs: throws when an argument shares
  /// memory with a tensor the graph reads by reference and one of them is written (the
  /// arguments among themselves are part of the signature, checked when it was traced).
  XGRAD_API void check_call_aliases(const Entry& entry, const std::vector<TensorBase>& args, Relabel relabel) const;

 private:
  /// After a trace: throws when an effect writes into an input that another input shares
  /// memory with, unless both are arguments the trace gave one symbolic tensor (Flat::aliases).
  XGRAD_API void check_written_aliases(const ir::Graph& g, const Flat& flat, const std::vector<TensorBase>& captures,
                                       Relabel relabel, bool aliases_merged) const;
  XGRAD_API void check_retrace(const Signature& signature, Relabel relabel);

  JitConfig m_config;
  SourceLoc m_loc;
  bool m_keep_effects;
  passes::Pipeline m_pipeline;
  mutable std::shared_mutex m_mutex;
  std::vector<std::shared_ptr<const Entry>> m_entries;
};

/// Copies of the inputs the call writes into, in Entry::written's order. An argument that
/// requires grad may not be written: eagerly that is refused too (outside no_grad), and its
/// gradient would have to flow through the write.
XGRAD_API std::vector<TensorBase> values_before_writes(const Cache& cache, const Entry& entry,
                                                       const std::vector<TensorBase>& inputs, std::size_t num_args,
                                                       Relabel relabel);

/// Jitted::vjp once f is a flat function `fn`: the gradients of output k of `entry` with respect
/// to every input, given its gradient g.
XGRAD_API autograd::Grads jitted_vjp(const Cache& cache, const Entry& entry, std::size_t k,
                                     const std::vector<TensorBase>& inputs, std::size_t num_args,
                                     const std::vector<TensorBase>& before, const TensorBase& g, FlatFnRef fn);

}  // namespace tracing::detail

/// A function compiled per input signature; copies share one cache. See xg::jit.
template <class F> class Jitted {
 public:
  Jitted(F f, JitConfig config, SourceLoc loc)
      : m_f(std::make_shared<const F>(std::move(f))),
        m_cache(std::make_shared<tracing::detail::Cache>(std::move(config), loc)) {}

  /// Runs the compiled graph for these arguments' signature, tracing it on the first call.
  /// Called while another function is being traced, f is traced inline into that graph.
  /// Outputs that depend on tensors requiring grad are recorded on the tape as one op, whose
  /// gradient is itself a compiled graph (grad(jit(f)) works and stays compiled).
  template <class... Args> auto operator()(const Args&... args) const {
    using Out = std::invoke_result_t<const F&, tracing::detail::traced_t<Args>...>;
    if (tracing::Tracer::active()) return std::invoke(*m_f, tracing::detail::as_traced(args)...);
    tracing::detail::CallVectors call;
    tracing::detail::Flat& flat = call->flat;
    (tracing::detail::flatten(args, flat, std::string()), ...);
    // Under jvp or vmap, f's ops run one by one, each computing its output's tangent beside its
    // value or running its batching rule (jit(jvp(f)) and jit(vmap(f)) compile the whole).
    if (xgrad::detail::carries_tangents(flat.tensors.begin(), flat.tensors.end()) ||
        xgrad::detail::batch_level_of("jit", m_cache->loc(), flat.tensors))
      return std::invoke(*m_f, args...);
    bind(flat, args...);
    auto entry = entry_for(flat, args...);
    if (!entry->written.empty()) m_cache->check_call_aliases(*entry, flat.tensors, relabeler(args...));
    const std::size_t num_args = flat.tensors.size();
    std::vector<TensorBase>& inputs = flat.tensors;
    inputs.insert(inputs.end(), entry->captures.begin(), entry->captures.end());
    std::vector<TensorBase>& outputs = call->outputs;
    const GradNeeds needs(inputs, num_args);
    const bool records = needs.records_any(*entry);
    // The backward pass runs f again; it must see the values this call read, not what the
    // call's writes into its inputs left there.
    std::vector<TensorBase> before;
    if (records && !entry->written.empty())
      before = tracing::detail::values_before_writes(*m_cache, *entry, inputs, num_args, relabeler(args...));
    entry->program->run(inputs, outputs);
    if constexpr (!std::is_void_v<Out>) {
      if (records) record<Args...>(entry, inputs, num_args, outputs, needs, flat.statics, before);
      tracing::detail::Reader reader{outputs, entry->output_statics};
      return tracing::detail::rebuild<Out>(reader);
    }
  }

  /// The graph for these arguments' signature (traced now if it is not cached yet).
  template <class... Args> Lowered lower(const Args&... args) const {
    tracing::detail::Flat flat;
    (tracing::detail::flatten(args, flat, std::string()), ...);
    bind(flat, args...);
    return Lowered(entry_for(flat, args...)->program);
  }

  /// How many signatures have been compiled.
  std::size_t cache_size() const { return m_cache->size(); }

 private:
  using Entry = tracing::detail::Entry;

  /// Flattens the call's arguments again, naming each tensor ("argument 1[2]").
  template <class... Args> static auto relabeler(const Args&... args) {
    return [&args...](std::vector<std::string>& labels) {
      tracing::detail::Flat again;
      again.labels = &labels;
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        (tracing::detail::flatten(args, again, "argument " + std::to_string(I)), ...);
      }
      (std::index_sequence_for<Args...>{});
    };
  }

  /// Notes which arguments share memory; refuses a tensor made inside a trace that ended.
  template <class... Args> void bind(tracing::detail::Flat& flat, const Args&... args) const {
    const std::ptrdiff_t escaped = tracing::detail::note_aliases(flat);
    if (escaped < 0) [[likely]]
      return;
    std::vector<std::string> labels;
    relabeler(args...)(labels);
    const TensorBase& t = flat.tensors[static_cast<std::size_t>(escaped)];
    throw ValueError(xgrad::detail::concat(
        m_cache->where(), ": ", labels[static_cast<std::size_t>(escaped)], " (", dtype_name(t.dtype()), t.shape(),
        ") is a tensor made inside a jit trace and kept after that trace ended (in a global, a member or a captured "
        "variable); it stands for a value of that graph and has no data. Return it from the jitted function and use "
        "the returned tensor instead"));
  }

  template <class... Args>
  std::shared_ptr<const Entry> entry_for(const tracing::detail::Flat& flat, const Args&... args) const {
    if (auto entry = m_cache->find(flat)) return entry;
    bool merge_aliases = false;
    auto body = [&] {
      tracing::Tracer& tracer = *tracing::Tracer::active();
      auto symbolic_args = [&]<std::size_t... I>(std::index_sequence<I...>) {
        return std::tuple<tracing::detail::traced_t<Args>...>{
            tracing::detail::symbolic(args, tracer, "arg" + std::to_string(I))...};
      }
      (std::index_sequence_for<Args...>{});
      if (merge_aliases) {
        // Arguments that are one tensor get one symbolic tensor, so that an in-place write
        // into one shows through the other as it does eagerly. Only when the function writes
        // into one: otherwise the graph keeps one input per argument.
        tracing::detail::Flat leaves;
        tracing::detail::flatten(symbolic_args, leaves, std::string());
        for (std::size_t i = 0; i < flat.aliases.size(); ++i)
          if (flat.aliases[i] >= 0) leaves.tensors[i] = leaves.tensors[static_cast<std::size_t>(flat.aliases[i])];
        tracing::detail::Reader reader{leaves.tensors, leaves.statics};
        symbolic_args = tracing::detail::rebuild<std::tuple<tracing::detail::traced_t<Args>...>>(reader);
      }
      tracing::detail::Flat out;
      if constexpr (std::is_void_v<std::invoke_result_t<const F&, tracing::detail::traced_t<Args>...>>)
        std::apply(*m_f, symbolic_args);
      else
        tracing::detail::flatten(std::apply(*m_f, symbolic_args), out, std::string());
      return tracing::detail::TraceResult{std::move(out.tensors), std::move(out.statics)};
    };
    try {
      return m_cache->compile(flat, body, relabeler(args...));
    } catch (const tracing::detail::Cache::NeedsMergedAliases&) {
      merge_aliases = true;
      return m_cache->compile(flat, body, relabeler(args...), true);
    }
  }

  /// Whether any of a call's arguments, and any of its captured tensors, require grad.
  struct GradNeeds {
    bool arguments = false, captures = false;

    GradNeeds(const std::vector<TensorBase>& inputs, std::size_t num_args) {
      if (!is_grad_enabled()) return;
      for (std::size_t i = 0; i < inputs.size(); ++i)
        (i < num_args ? arguments : captures) |= inputs[i].requires_grad();
    }
    /// Whether output k goes on the tape: it depends on a tensor that requires grad.
    bool records(const Entry& entry, std::size_t k) const {
      return (arguments && entry.from_arguments[k]) || (captures && entry.from_captures[k]);
    }
    bool records_any(const Entry& entry) const {
      for (std::size_t k = 0; (arguments || captures) && k < entry.from_arguments.size(); ++k)
        if (records(entry, k)) return true;
      return false;
    }
  };

  /// Links each output that needs it to the call's inputs on the tape. `before` holds the
  /// pre-call values of the inputs the call wrote into (Entry::written), which the gradient
  /// reads in their place.
  template <class... Args> void record(const std::shared_ptr<const Entry>& entry, const std::vector<TensorBase>& inputs,
                                       std::size_t num_args, std::vector<TensorBase>& outputs, const GradNeeds& needs,
                                       const std::vector<std::int64_t>& statics, std::vector<TensorBase> before) const {
    const std::vector<std::reference_wrapper<const TensorBase>> refs(inputs.begin(), inputs.end());
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      if (!needs.records(*entry, k)) continue;
      xgrad::detail::record_range(outputs[k], "Jit", m_cache->loc(), refs.begin(), refs.end(), {}, false,
                                  [f = m_f, cache = m_cache, entry, k, inputs, num_args, statics, before](
                                      const TensorBase&, const TensorBase& g) {
                                    return vjp<Args...>(*f, *cache, *entry, k, inputs, num_args, statics, before, g);
                                  });
      // The gradient reads the inputs again: a later write into one fails the backward pass
      // loudly. The written ones it reads from `before`, which nobody else can change.
      auto& saved = outputs[k].impl()->autograd->grad_fn->saved;
      for (std::size_t i = 0; i < inputs.size(); ++i)
        if (std::find(entry->written.begin(), entry->written.end(), i) == entry->written.end())
          saved.push_back(autograd::Node::Saved::of(inputs[i]));
    }
  }

  /// The gradients of output k with respect to every input, given its gradient g. Runs f
  /// again under autodiff: compiled (and cached) normally; op by op on the tape when the
  /// backward pass is itself differentiated, or traced inline inside another jit.
  template <class... Args> static autograd::Grads vjp(const F& f, const tracing::detail::Cache& cache,
                                                      const Entry& entry, std::size_t k,
                                                      const std::vector<TensorBase>& inputs, std::size_t num_args,
                                                      const std::vector<std::int64_t>& statics,
                                                      const std::vector<TensorBase>& before, const TensorBase& g) {
    using namespace tracing::detail;
    // The arguments f ran on stay alive until the gradients are made: a loop body or a cond
    // branch that captured one of them by reference runs again in the backward pass.
    std::vector<std::shared_ptr<const void>> keep_alive;
    auto fn = [&f, &statics, &keep_alive](std::span<const TensorBase> leaves) {
      Reader reader{leaves, statics};
      // Braces: the leaves are read in order.
      auto typed = std::make_shared<std::tuple<traced_t<Args>...>>(
          std::tuple<traced_t<Args>...>{rebuild<traced_t<Args>>(reader)...});
      keep_alive.push_back(typed);
      Flat out;
      flatten(std::apply(f, *typed), out, std::string());
      return out.tensors;
    };
    return jitted_vjp(cache, entry, k, inputs, num_args, before, g, fn);
  }

  std::shared_ptr<const F> m_f;
  std::shared_ptr<tracing::detail::Cache> m_cache;
};

/// Compiles f (any callable taking tensors, containers of tensors and scalars) into a graph
/// per input signature: `auto fast = xg::jit([](auto x, auto y) { return x * y; });`.
template <class F> Jitted<F> jit(F f, JitConfig config = {}, SourceLoc loc = SourceLoc::current()) {
  return Jitted<F>(std::move(f), std::move(config), loc);
}

/// f's outputs at `primals` and f linearized there (JAX's linearize): `auto [y, f_jvp] =
/// linearize(f, x)`, then `f_jvp(t)` is J·t, jvp(f, x, t)'s tangent, for any tangent of x's
/// dtype and shape (one per primal; a tuple for a function returning a tuple). The linear
/// function is compiled now, with the primal computation run once while tracing: its graph holds
/// only the tangent's ops, reading the primal values they need as constants. Later writes into
/// the primals do not reach it.
template <class F, class... Ts> auto linearize(F f, const Tensor<Ts>&... primals) {
  static_assert(sizeof...(Ts) > 0, "linearize: give at least one primal");
  static_assert((FloatingPoint<Ts> && ...), "linearize: every primal must be a float or double tensor");
  auto outputs = f(primals...);
  auto linear = jit([f, point = std::tuple{primals.detach()...}](
                        const Tensor<Ts>&... tangents) { return jvp(f, point, std::tuple{tangents...}).second; },
                    {.name = "linearize", .fold_captures = true});
  (void)linear.lower(zeros_like(primals)...);
  return std::pair{outputs, linear};
}

}  // namespace xgrad

#if !defined(XGRAD_COMPILED)
#include "xgrad/jit/jit-inl.hpp"
#endif
