// Definitions of jit/jit.hpp: included by it when header-only, compiled once into the library
// (src/jit.cpp) otherwise.
#pragma once

#include <algorithm>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "xgrad/ir/verify.hpp"
#include "xgrad/jit/jit.hpp"
#include "xgrad/passes/fuse.hpp"
#include "xgrad/passes/schedule.hpp"

namespace xgrad {

XGRAD_API void validate(const JitConfig& config) {
  if (config.max_retraces < -1)
    throw ValueError(xgrad::detail::concat(
        "JitConfig::max_retraces must be -1 (no limit) or a count of 0 or more, got ", config.max_retraces));
  const int level = static_cast<int>(config.level);
  if (level < 0 || level > 2)
    throw ValueError(xgrad::detail::concat("JitConfig::level must be JitLevel::O0, O1 or O2, got the value ", level));
  passes::pipeline(level, config.disabled_passes);  // throws for an unknown pass name
}

XGRAD_API std::string Lowered::ir() const {
  const backend::MemoryPlan* plan = m_program->memory_plan();
  // Nodes that run at once: "[stage 3 of 4 nodes]" on each; "[background]" on those that run
  // beside the stages after theirs.
  std::unordered_map<const ir::Node*, std::string> stage_notes;
  const std::span<const backend::Stage> stages = m_program->stages();
  for (std::size_t s = 0; s < stages.size(); ++s)
    if (stages[s].size() > 1)
      for (std::size_t k = stages[s].begin; k < stages[s].end; ++k)
        stage_notes[graph().nodes[k].get()] =
            xgrad::detail::concat("  [stage ", s, " of ", stages[s].size(), " nodes]");
  for (std::size_t k : m_program->background_nodes()) stage_notes[graph().nodes[k].get()] += "  [background]";
  auto note = [&](const ir::Node& node) {
    const auto it = stage_notes.find(&node);
    return (plan ? plan->note(node) : std::string()) + (it == stage_notes.end() ? std::string() : it->second);
  };
  return (plan ? "# memory plan: " + plan->summary() + "\n" : std::string()) + ir::to_text(graph(), nullptr, note);
}

namespace tracing::detail {

XGRAD_API bool Signature::matches(const Flat& flat) const {
  if (tensors.size() != flat.tensors.size() || statics != flat.statics || aliases != flat.aliases) return false;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorImpl& t = *flat.tensors[i].impl();
    if (tensors[i].first != t.dtype || !(tensors[i].second == t.shape)) return false;
  }
  return true;
}

XGRAD_API Signature Signature::of(const Flat& flat) {
  Signature s;
  for (const auto& t : flat.tensors) s.tensors.emplace_back(t.dtype(), t.shape());
  s.statics = flat.statics;
  s.aliases = flat.aliases;
  return s;
}

XGRAD_API std::ptrdiff_t note_aliases(Flat& flat) {
  const auto& ts = flat.tensors;
  const std::size_t n = ts.size();
  flat.aliases.clear();
  auto storage = [&](std::size_t i) { return ts[i].impl()->storage.get(); };
  for (std::size_t i = 0; i < n; ++i)
    if (!storage(i)) return static_cast<std::ptrdiff_t>(i);
  auto note = [&](std::size_t i, std::size_t j) {  // j < i shares i's storage; j is the first that does
    if (flat.aliases.empty()) flat.aliases.assign(n, -1);
    std::int32_t alias = -2 - static_cast<std::int32_t>(j);
    for (std::size_t k = j; k < i; ++k)
      if (storage(k) == storage(i) && ts[k].dtype() == ts[i].dtype() && ts[k].shape() == ts[i].shape()) {
        alias = static_cast<std::int32_t>(k);
        break;
      }
    flat.aliases[i] = alias;
  };
  if (n <= 16) {  // the usual call: no allocation
    for (std::size_t i = 1; i < n; ++i)
      for (std::size_t j = 0; j < i; ++j)
        if (storage(j) == storage(i)) {
          note(i, j);
          break;
        }
    return -1;
  }
  std::vector<std::pair<const Storage*, std::size_t>> sorted;
  sorted.reserve(n);
  for (std::size_t i = 0; i < n; ++i) sorted.emplace_back(storage(i), i);
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t a = 1; a < n; ++a)
    if (sorted[a].first == sorted[a - 1].first) {
      std::size_t first = a - 1;
      while (first > 0 && sorted[first - 1].first == sorted[a].first) --first;
      note(sorted[a].second, sorted[first].second);
    }
  return -1;
}

XGRAD_API std::string input_label(std::size_t q, const std::vector<std::string>& labels,
                                  const std::vector<TensorBase>& captures) {
  if (q < labels.size()) return labels[q];
  const TensorBase& c = captures[q - labels.size()];
  const std::string name = c.impl()->autograd ? c.impl()->autograd->name : std::string();
  return "the tensor " + (name.empty() ? std::string() : "'" + name + "' ") + "(" + ir::type_str(c.dtype(), c.shape()) +
         ") that the function reads by reference";
}

XGRAD_API ValueError aliasing_error(const std::string& where, const std::string& written, const std::string& other,
                                    bool same_view) {
  return ValueError(xgrad::detail::concat(
      where, ": ", written, " and ", other, " share memory", same_view ? "" : " (one is a view of the other)",
      ", and the function writes into ", written,
      " in place. Eagerly the write would show through the other, which the compiled graph cannot follow: pass a "
      "copy of one of them, or keep the tensor the function updates out of its arguments"));
}

XGRAD_API CallVectors::CallVectors() {
  auto& idle = pool();
  if (idle.empty()) {
    m_vectors = std::make_unique<Vectors>();
  } else {
    m_vectors = std::move(idle.back());
    idle.pop_back();
  }
}

XGRAD_API CallVectors::~CallVectors() {
  // Emptied, so the pool keeps capacity but no tensor alive.
  m_vectors->flat.tensors.clear();
  m_vectors->flat.statics.clear();
  m_vectors->flat.aliases.clear();
  m_vectors->outputs.clear();
  pool().push_back(std::move(m_vectors));
}

XGRAD_API std::vector<std::unique_ptr<CallVectors::Vectors>>& CallVectors::pool() {
  thread_local std::vector<std::unique_ptr<Vectors>> idle;
  return idle;
}

XGRAD_API std::vector<bool> reached_from_arguments(const ir::Graph& g) {
  std::vector<bool> reached(g.values.size(), false);
  for (std::size_t i = 0; i < g.num_args; ++i) reached[static_cast<std::size_t>(g.inputs[i]->id)] = true;
  for (const auto& node : g.nodes) {
    bool any = false;
    for (const ir::Value* v : node->inputs) any = any || reached[static_cast<std::size_t>(v->id)];
    for (const ir::Value* v : node->outputs) reached[static_cast<std::size_t>(v->id)] = any;
  }
  std::vector<bool> out;
  for (const ir::Value* v : g.outputs)
    out.push_back(reached[static_cast<std::size_t>(v->id)] &&
                  (v->dtype == DType::float32 || v->dtype == DType::float64));
  return out;
}

XGRAD_API std::string explain_retrace(const Signature& now, const std::vector<std::string>& labels,
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
    if (old.aliases != now.aliases) out.push_back("which arguments share memory changed");
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

XGRAD_API Cache::Cache(JitConfig config, SourceLoc loc, bool keep_effects)
    : m_config((validate(config), std::move(config))),
      m_loc(loc),
      m_keep_effects(keep_effects),
      m_pipeline(passes::pipeline(static_cast<int>(m_config.level), m_config.disabled_passes)) {
  if (m_config.name.empty()) m_config.name = "jit@" + loc.str();
}

XGRAD_API std::shared_ptr<const Entry> Cache::find(const Flat& flat) const {
  std::shared_lock lock(m_mutex);
  for (const auto& e : m_entries)
    if (e->signature.matches(flat)) return e;
  return nullptr;
}

XGRAD_API std::vector<TensorBase> Cache::run(const FlatFn& fn, const std::vector<TensorBase>& args,
                                             std::span<const TensorBase> replaced,
                                             std::span<const TensorBase> replacements) {
  Flat flat;
  flat.tensors = args;
  auto entry = find(flat);
  if (!entry) {
    auto body = [&] {
      Tracer& tracer = *Tracer::active();
      std::vector<TensorBase> symbolic;
      for (std::size_t i = 0; i < args.size(); ++i)
        symbolic.push_back(tracer.add_argument(args[i].dtype(), args[i].shape(), "arg" + std::to_string(i)));
      return TraceResult{fn(symbolic), {}};
    };
    auto labels = [&](std::vector<std::string>& out) {
      for (std::size_t i = 0; i < args.size(); ++i) out.push_back("argument " + std::to_string(i));
    };
    entry = compile(flat, body, labels);
  }
  std::vector<TensorBase> inputs = args;
  for (const TensorBase& c : entry->captures) {
    auto it = std::find_if(replaced.begin(), replaced.end(), [&](const TensorBase& r) { return r.impl() == c.impl(); });
    inputs.push_back(it == replaced.end() ? c : replacements[static_cast<std::size_t>(it - replaced.begin())]);
  }
  return entry->program->run(inputs);
}

XGRAD_API std::string Cache::where() const {
  return xgrad::detail::concat("jit '", m_config.name, "' (", m_loc.str(), ")");
}

XGRAD_API std::shared_ptr<const Entry> Cache::compile(const Flat& flat, FunctionRef<TraceResult()> body,
                                                      Relabel relabel, bool aliases_merged) {
  Signature signature = Signature::of(flat);
  check_retrace(signature, relabel);
  Tracer tracer(m_config.name);
  if (m_config.fold_captures) tracer.evaluate_concrete_ops();
  TraceResult result = traced(tracer, body);
  std::vector<bool> from_captures;
  for (const auto& out : result.outputs) from_captures.push_back(out.requires_grad());
  std::shared_ptr<ir::Graph> graph = tracer.finish(result.outputs);
  if (!m_keep_effects) graph->effects.clear();
  check_written_aliases(*graph, flat, tracer.captures(), relabel, aliases_merged);
  ir::verify(*graph);
  save_stage(*graph, "trace");
  passes::optimize(*graph, m_pipeline.rewrites, {.strict = m_config.strict}, [&](std::string_view pass) {
    ir::verify(*graph);
    save_stage(*graph, std::string(pass));
  });
  if (m_pipeline.fuse && passes::fuse(*graph, {.strict = m_config.strict})) {
    passes::renumber(*graph);
    ir::verify(*graph);
    save_stage(*graph, "fuse");
  }
  if (m_pipeline.schedule && passes::schedule(*graph)) {
    passes::renumber(*graph);
    ir::verify(*graph);
    save_stage(*graph, "schedule");
  }
  auto program = std::make_shared<const backend::Program>(
      graph, backend::ProgramOptions{.plan_memory = m_pipeline.plan_memory,
                                     .poison_freed_buffers = m_config.poison_freed_buffers});
  if (const backend::MemoryPlan* plan = program->memory_plan())
    save_stage(*graph, "plan_memory", [plan](const ir::Node& node) { return plan->note(node); });
  auto entry = std::make_shared<Entry>();
  entry->signature = std::move(signature);
  entry->program = std::move(program);
  entry->captures = tracer.captures();
  entry->output_statics = std::move(result.statics);
  for (const auto& e : graph->effects) entry->written.push_back(e.input);
  entry->from_arguments = reached_from_arguments(*graph);
  entry->from_captures = std::move(from_captures);
  entry->vjps.resize(result.outputs.size());
  std::unique_lock lock(m_mutex);
  // Another thread may have compiled the same signature meanwhile: keep one.
  for (const auto& e : m_entries)
    if (e->signature.matches(flat)) return e;
  m_entries.push_back(entry);
  return entry;
}

XGRAD_API void Cache::check_call_aliases(const Entry& entry, const std::vector<TensorBase>& args,
                                         Relabel relabel) const {
  const std::size_t n = args.size();
  const auto& caps = entry.captures;
  for (std::size_t p : entry.written)
    for (std::size_t q = p < n ? n : 0; q < (p < n ? n + caps.size() : n); ++q) {
      const TensorBase& a = p < n ? args[p] : caps[p - n];
      const TensorBase& b = q < n ? args[q] : caps[q - n];
      if (a.impl()->storage != b.impl()->storage) continue;
      std::vector<std::string> labels;
      relabel(labels);
      throw aliasing_error(where(), input_label(p, labels, caps), input_label(q, labels, caps),
                           a.dtype() == b.dtype() && a.shape() == b.shape());
    }
}

XGRAD_API void Cache::check_written_aliases(const ir::Graph& g, const Flat& flat,
                                            const std::vector<TensorBase>& captures, Relabel relabel,
                                            bool aliases_merged) const {
  const std::size_t n = flat.tensors.size();
  if (g.effects.empty() || g.num_args != n) return;
  auto input = [&](std::size_t q) -> const TensorBase& { return q < n ? flat.tensors[q] : captures[q - n]; };
  auto merged = [&](std::size_t p, std::size_t q) {
    if (p >= n || q >= n || flat.aliases.empty()) return false;
    return flat.aliases[q] == static_cast<std::int32_t>(p) || flat.aliases[p] == static_cast<std::int32_t>(q) ||
           (flat.aliases[p] >= 0 && flat.aliases[p] == flat.aliases[q]);
  };
  for (const auto& e : g.effects)
    for (std::size_t q = 0; q < n + captures.size(); ++q) {
      const std::size_t p = e.input;
      if (q == p || input(q).impl()->storage != input(p).impl()->storage) continue;
      if (merged(p, q)) {
        if (aliases_merged) continue;
        throw NeedsMergedAliases{};
      }
      std::vector<std::string> labels;
      relabel(labels);
      labels.resize(n);
      throw aliasing_error(where(), input_label(p, labels, captures), input_label(q, labels, captures),
                           input(p).dtype() == input(q).dtype() && input(p).shape() == input(q).shape());
    }
}

XGRAD_API void Cache::check_retrace(const Signature& signature, Relabel relabel) {
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
  const std::string where = this->where();
  if (expect_cache_hit::depth() > 0) throw RetraceError(where + " traced inside an xg::expect_cache_hit scope: " + why);
  if (m_config.max_retraces >= 0 && traces > m_config.max_retraces)
    throw RetraceError(xgrad::detail::concat(
        where, " would trace a signature beyond the ", traces, " compiled but JitConfig::max_retraces is ",
        m_config.max_retraces, ": ", why, ". Keep shapes fixed (pad or bucket the inputs) or raise max_retraces"));
  if (traces > 0) log(xgrad::detail::concat("xgrad: ", where, " traces again: ", why));
}

XGRAD_API std::vector<TensorBase> values_before_writes(const Cache& cache, const Entry& entry,
                                                       const std::vector<TensorBase>& inputs, std::size_t num_args,
                                                       Relabel relabel) {
  std::vector<TensorBase> before;
  for (std::size_t i : entry.written) {
    if (i < num_args && inputs[i].requires_grad()) {
      std::vector<std::string> labels;
      relabel(labels);
      throw AutogradError(xgrad::detail::concat(
          cache.where(), ": the function writes in place into ", labels[i],
          ", which requires grad; autodiff does not record in-place writes. Return the new value instead, or "
          "pass a tensor that does not require grad"));
    }
    before.push_back(xgrad::detail::copy_to(inputs[i], inputs[i].device()));
  }
  return before;
}

XGRAD_API autograd::Grads jitted_vjp(const Cache& cache, const Entry& entry, std::size_t k,
                                     const std::vector<TensorBase>& inputs, std::size_t num_args,
                                     const std::vector<TensorBase>& before, const TensorBase& g, FlatFnRef fn) {
  if (!before.empty() && (tracing::Tracer::active() || is_grad_enabled()))
    throw AutogradError(xgrad::detail::concat(
        cache.where(),
        ": the function writes into its inputs in place, so its gradient runs it again as a compiled "
        "graph that leaves them alone; that gradient cannot itself be differentiated (grad of grad, "
        "create_graph) or traced inside another jit. Move the in-place update out of the function"));
  // Gradients go to float arguments and to captures that require grad, in that order. The
  // inputs the call wrote into are read at their values before the call.
  std::vector<std::size_t> wrt;
  std::vector<TensorBase> targets, values = inputs, replaced, replacements;
  std::vector<bool> held(num_args, false);
  for (std::size_t w = 0; w < before.size(); ++w) {
    const std::size_t i = entry.written[w];
    values[i] = before[w];
    if (i < num_args)
      held[i] = true;
    else
      replaced.push_back(inputs[i]), replacements.push_back(before[w]);
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (i < num_args ? is_float(inputs[i]) : inputs[i].requires_grad()) wrt.push_back(i);
    if (i >= num_args && inputs[i].requires_grad()) targets.push_back(inputs[i]);
  }
  const std::size_t num_outputs = entry.program->graph().outputs.size();
  FlatFn pullback = [&](std::span<const TensorBase> args_and_g) {
    std::vector<TensorBase> cots(num_outputs);
    cots[k] = args_and_g.back();
    return vjp_of(fn, args_and_g.first(num_args), cots, targets, held);
  };

  std::vector<TensorBase> args_and_g(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(num_args));
  args_and_g.push_back(g);
  std::vector<TensorBase> grads;
  if (tracing::Tracer::active() || is_grad_enabled()) {
    grads = pullback(args_and_g);
  } else {
    std::shared_ptr<Cache> vjp_cache;
    {
      std::lock_guard lock(entry.vjp_mutex);
      auto& slot = entry.vjps[k];
      if (!slot) {
        JitConfig config = cache.config();
        config.name += "_vjp" + std::to_string(k);
        config.max_retraces = -1;
        slot = std::make_shared<Cache>(config, cache.loc(), /*keep_effects=*/false);
      }
      vjp_cache = slot;
    }
    grads = vjp_cache->run(pullback, args_and_g, replaced, replacements);
  }
  autograd::Grads result(inputs.size());
  for (std::size_t j = 0; j < wrt.size(); ++j) result[wrt[j]] = grads[j];
  return result;
}

}  // namespace tracing::detail
}  // namespace xgrad
