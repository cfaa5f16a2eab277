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

#include "xgrad/backend/executor.hpp"
#include "xgrad/ir/verify.hpp"
#include "xgrad/jit/diagnostics.hpp"
#include "xgrad/jit/tree.hpp"

namespace xgrad {

/// How much the optimizer does: O0 nothing, O1 simplifications (DCE, CSE, folding), O2 also
/// fusion and memory planning (MindSpore's jit_level).
enum class JitLevel { O0, O1, O2 };

struct JitConfig {
  JitLevel level = JitLevel::O2;
  /// How many times a jitted function may trace again for a new signature after its first
  /// trace; -1 for no limit. Going past it throws RetraceError saying what changed.
  int max_retraces = -1;
  /// Shown in logs, reports and saved graphs; "jit@file.cpp:12" when empty.
  std::string name = {};
};

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

/// A traced graph: its text (ir()), Graphviz dot (dot()) and size.
class Lowered {
 public:
  explicit Lowered(std::shared_ptr<const ir::Graph> graph) : m_graph(std::move(graph)) {}
  std::string ir() const { return ir::to_text(*m_graph); }
  std::string dot() const { return ir::to_dot(*m_graph); }
  std::size_t num_nodes() const { return m_graph->nodes.size(); }
  const ir::Graph& graph() const { return *m_graph; }

 private:
  std::shared_ptr<const ir::Graph> m_graph;
};

namespace tracing::detail {

/// The dtypes and shapes of a call's tensors and its static values.
struct Signature {
  std::vector<std::pair<DType, Shape>> tensors;
  std::vector<std::int64_t> statics;

  bool matches(const Flat& flat) const {
    if (tensors.size() != flat.tensors.size() || statics != flat.statics) return false;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const TensorImpl& t = *flat.tensors[i].impl();
      if (tensors[i].first != t.dtype || !(tensors[i].second == t.shape)) return false;
    }
    return true;
  }
  static Signature of(const Flat& flat) {
    Signature s;
    for (const auto& t : flat.tensors) s.tensors.emplace_back(t.dtype(), t.shape());
    s.statics = flat.statics;
    return s;
  }
};

/// One compiled signature.
struct Entry {
  Signature signature;
  backend::Program program;
  std::vector<TensorBase> captures;          // bound to the inputs after the arguments
  std::vector<std::int64_t> output_statics;  // container sizes of the result
};

/// What a trace of the user's function gives back.
struct TraceResult {
  std::vector<TensorBase> outputs;
  std::vector<std::int64_t> statics;
};

/// "argument 0: f32[32, 10] -> f32[16, 10]": how `now` differs from the closest of `cached`.
inline std::string explain_retrace(const Signature& now, const std::vector<std::string>& labels,
                                   const std::vector<const Signature*>& cached) {
  if (cached.empty()) return "first trace";
  auto differences = [&](const Signature& old) {
    std::vector<std::string> out;
    if (old.tensors.size() != now.tensors.size()) {
      out.push_back(xgrad::detail::concat("the number of tensor arguments changed from ", old.tensors.size(), " to ",
                                          now.tensors.size()));
    } else {
      for (std::size_t i = 0; i < now.tensors.size(); ++i)
        if (old.tensors[i] != now.tensors[i])
          out.push_back(xgrad::detail::concat(labels[i], ": ",
                                              ir::type_str(old.tensors[i].first, old.tensors[i].second), " -> ",
                                              ir::type_str(now.tensors[i].first, now.tensors[i].second)));
    }
    if (old.statics != now.statics) out.push_back("a non-tensor argument (or a container's size) changed");
    return out;
  };
  std::vector<std::string> best = differences(*cached.front());
  for (const Signature* s : cached) {
    auto d = differences(*s);
    if (d.size() < best.size()) best = d;
  }
  std::string text;
  for (const auto& d : best) text += (text.empty() ? "" : "; ") + d;
  return text + " (against the closest of " + std::to_string(cached.size()) + " compiled signature" +
         (cached.size() == 1 ? "" : "s") + ")";
}

/// The compiled signatures of one jitted function, shared by its copies and its threads.
class Cache {
 public:
  Cache(JitConfig config, SourceLoc loc) : m_config(std::move(config)), m_loc(loc) {
    if (m_config.name.empty()) m_config.name = "jit@" + loc.str();
  }

  const std::string& name() const { return m_config.name; }

  std::shared_ptr<const Entry> find(const Flat& flat) const {
    std::shared_lock lock(m_mutex);
    for (const auto& e : m_entries)
      if (e->signature.matches(flat)) return e;
    return nullptr;
  }

  std::size_t size() const {
    std::shared_lock lock(m_mutex);
    return m_entries.size();
  }

  /// Traces `body` for a signature not in the cache yet. `relabel` flattens the call again
  /// with labels, to say which argument changed.
  template <class Body, class Relabel>
  std::shared_ptr<const Entry> compile(const Flat& flat, Body&& body, Relabel&& relabel) {
    Signature signature = Signature::of(flat);
    check_retrace(signature, relabel);
    Tracer tracer(m_config.name);
    TraceResult result = traced(tracer, body);
    std::shared_ptr<const ir::Graph> graph = tracer.finish(result.outputs);
    ir::verify(*graph);
    save_stage(*graph, "trace");
    auto entry = std::make_shared<Entry>(
        Entry{std::move(signature), backend::Program(graph), tracer.captures(), std::move(result.statics)});
    std::unique_lock lock(m_mutex);
    // Another thread may have compiled the same signature meanwhile: keep one.
    for (const auto& e : m_entries)
      if (e->signature.matches(flat)) return e;
    m_entries.push_back(entry);
    return entry;
  }

 private:
  template <class Relabel> void check_retrace(const Signature& signature, Relabel& relabel) {
    std::vector<std::string> labels;
    relabel(labels);
    std::vector<const Signature*> cached;
    {
      std::shared_lock lock(m_mutex);
      for (const auto& e : m_entries) cached.push_back(&e->signature);
    }
    const int traces = static_cast<int>(cached.size());
    // Entries are never removed, so the pointers stay valid.
    std::string why = explain_retrace(signature, labels, cached);
    std::string where = xgrad::detail::concat("jit '", m_config.name, "' (", m_loc.str(), ")");
    if (expect_cache_hit::depth() > 0)
      throw RetraceError(where + " traced inside an xg::expect_cache_hit scope: " + why);
    if (m_config.max_retraces >= 0 && traces > m_config.max_retraces)
      throw RetraceError(xgrad::detail::concat(
          where, " would trace a signature beyond the ", traces, " compiled but JitConfig::max_retraces is ",
          m_config.max_retraces, ": ", why, ". Keep shapes fixed (pad or bucket the inputs) or raise max_retraces"));
    if (traces > 0) log(xgrad::detail::concat("xgrad: ", where, " traces again: ", why));
  }

  JitConfig m_config;
  SourceLoc m_loc;
  mutable std::shared_mutex m_mutex;
  std::vector<std::shared_ptr<const Entry>> m_entries;
};

}  // namespace tracing::detail

/// A function compiled per input signature; copies share one cache. See xg::jit.
template <class F> class Jitted {
 public:
  Jitted(F f, JitConfig config, SourceLoc loc)
      : m_f(std::move(f)), m_cache(std::make_shared<tracing::detail::Cache>(std::move(config), loc)) {}

  /// Runs the compiled graph for these arguments' signature, tracing it on the first call.
  /// Called while another function is being traced, f is traced inline into that graph.
  template <class... Args> auto operator()(const Args&... args) const {
    using Out = std::invoke_result_t<const F&, tracing::detail::traced_t<Args>...>;
    if (tracing::Tracer::active()) return std::invoke(m_f, tracing::detail::traced_t<Args>(args)...);
    tracing::detail::Flat flat;
    (tracing::detail::flatten(args, flat, std::string()), ...);
    auto entry = entry_for(flat, args...);
    std::vector<TensorBase> inputs = std::move(flat.tensors);
    inputs.insert(inputs.end(), entry->captures.begin(), entry->captures.end());
    std::vector<TensorBase> outputs = entry->program.run(inputs);
    if constexpr (!std::is_void_v<Out>) {
      tracing::detail::Reader reader{outputs, entry->output_statics};
      return tracing::detail::rebuild<Out>(reader);
    }
  }

  /// The graph for these arguments' signature (traced now if it is not cached yet).
  template <class... Args> Lowered lower(const Args&... args) const {
    tracing::detail::Flat flat;
    (tracing::detail::flatten(args, flat, std::string()), ...);
    return Lowered(entry_for(flat, args...)->program.graph_ptr());
  }

  /// How many signatures have been compiled.
  std::size_t cache_size() const { return m_cache->size(); }

 private:
  template <class... Args> std::shared_ptr<const tracing::detail::Entry> entry_for(const tracing::detail::Flat& flat,
                                                                                   const Args&... args) const {
    if (auto entry = m_cache->find(flat)) return entry;
    auto body = [&] {
      tracing::Tracer& tracer = *tracing::Tracer::active();
      std::size_t k = 0;
      auto symbolic_args = std::tuple<tracing::detail::traced_t<Args>...>{
          tracing::detail::symbolic(args, tracer, "arg" + std::to_string(k++))...};
      tracing::detail::TraceResult result;
      tracing::detail::Flat out;
      if constexpr (std::is_void_v<std::invoke_result_t<const F&, tracing::detail::traced_t<Args>...>>) {
        std::apply(m_f, symbolic_args);
      } else {
        tracing::detail::flatten(std::apply(m_f, symbolic_args), out, std::string());
      }
      return tracing::detail::TraceResult{std::move(out.tensors), std::move(out.statics)};
    };
    auto relabel = [&](std::vector<std::string>& labels) {
      tracing::detail::Flat again;
      again.labels = &labels;
      std::size_t k = 0;
      (tracing::detail::flatten(args, again, "argument " + std::to_string(k++)), ...);
    };
    return m_cache->compile(flat, body, relabel);
  }

  F m_f;
  std::shared_ptr<tracing::detail::Cache> m_cache;
};

/// Compiles f (any callable taking tensors, containers of tensors and scalars) into a graph
/// per input signature: `auto fast = xg::jit([](auto x, auto y) { return x * y; });`.
template <class F> Jitted<F> jit(F f, JitConfig config = {}, SourceLoc loc = SourceLoc::current()) {
  return Jitted<F>(std::move(f), std::move(config), loc);
}

}  // namespace xgrad
