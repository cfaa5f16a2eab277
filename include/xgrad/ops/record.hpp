// What an op does besides its kernel, with no backend: naming itself in a failed trace's report
// (OpScope), describing its inputs in errors, recording its gradient rule on the tape, giving
// its output a tangent in forward mode, and telling batched (vmap) inputs apart. The
// op drivers (ops/dispatch.hpp) use these, and so do the layers above ops that record or check
// like an op: custom_vjp (autograd/functional.hpp), jit's and control flow's tape records, the
// nn layers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "xgrad/core/tape.hpp"
#include "xgrad/core/tensor.hpp"
#include "xgrad/ir/tracer.hpp"

namespace xgrad::detail {

/// Scope guard at the top of an op that checks shapes: when tracing and the op throws, it
/// tells the tracer which op failed on which inputs, for the failure report.
class OpScope {
 public:
  OpScope(std::string_view op, SourceLoc loc, std::initializer_list<std::reference_wrapper<const TensorBase>> inputs) {
    if (auto* tracer = tracing::Tracer::active()) [[unlikely]] {
      m_tracer = tracer;
      m_op = op;
      m_loc = loc;
      m_inputs.assign(inputs.begin(), inputs.end());
      m_exceptions = std::uncaught_exceptions();
    }
  }
  ~OpScope() {
    if (m_tracer && std::uncaught_exceptions() > m_exceptions) m_tracer->note_failure(m_op, m_loc, std::move(m_inputs));
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  tracing::Tracer* m_tracer = nullptr;
  std::string_view m_op;
  SourceLoc m_loc;
  std::vector<TensorBase> m_inputs;
  int m_exceptions = 0;
};

/// "x: Float32[3, 32], y: Float32[4]": what every shape error lists.
inline std::string describe_inputs(std::initializer_list<std::pair<std::string_view, const TensorBase*>> inputs) {
  std::string out;
  for (auto& [label, t] : inputs) {
    if (!out.empty()) out += ", ";
    out += detail::concat(label, ": ", dtype_name(t->dtype()), t->shape());
  }
  return out;
}

/// True when an op on these inputs must be recorded for autodiff.
template <class... Ts> bool should_record(const Ts&... inputs) {
  return is_grad_enabled() && (inputs.impl()->requires_grad() || ...);
}

using TensorRefs = std::initializer_list<std::reference_wrapper<const TensorBase>>;

/// Links `out` to the inputs in [first, last) on the tape. `saved` are the tensors the rule
/// reads (their versions are checked at backward); `reads_output` keeps out's buffer for it.
template <class It> void record_range(const TensorBase& out, std::string_view op, SourceLoc loc, It first, It last,
                                      TensorRefs saved, bool reads_output,
                                      std::function<autograd::Grads(const TensorBase&, const TensorBase&)> rule) {
  auto node = std::make_shared<autograd::Node>();
  node->op = op;
  node->loc = loc;
  node->inputs.reserve(static_cast<std::size_t>(std::distance(first, last)));
  for (; first != last; ++first) {
    const TensorBase& in = *first;
    node->inputs.push_back({in.impl()->requires_grad() ? in.impl()->autograd : nullptr, in.shape()});
  }
  node->saved.reserve(saved.size());
  for (const TensorBase& s : saved)
    if (s.defined()) node->saved.push_back(autograd::Node::Saved::of(s));
  if (reads_output) {
    node->out_storage = out.impl()->storage;
    node->out_value = out.impl()->value;
    node->out_physical = out.impl()->physical;
    node->out_batch_level = out.impl()->batch_level;
    node->out_version = out.version();
  }
  node->out_shape = out.shape();
  node->out_dtype = out.dtype();
  node->rule = std::move(rule);
  auto meta = std::make_shared<AutogradMeta>();
  meta->requires_grad = true;
  meta->grad_fn = std::move(node);
  out.impl()->autograd = std::move(meta);
}

/// The tangent `t` carries in forward-mode pass `level` (undefined when none).
inline TensorBase tangent_at(const TensorBase& t, std::uint64_t level) {
  for (const Tangent& tangent : t.impl()->tangents)
    if (tangent.level == level) return TensorBase(tangent.value);
  return {};
}

/// `t`'s value, off the tape: its batch and its own tangents too (any of them on the tape could
/// lead back to the node that keeps it).
inline std::shared_ptr<TensorImpl> off_tape(const std::shared_ptr<TensorImpl>& t) {
  auto copy = std::make_shared<TensorImpl>(*t);
  copy->autograd.reset();
  if (copy->physical) copy->physical = off_tape(copy->physical);
  for (Tangent& tangent : copy->tangents) tangent.value = off_tape(tangent.value);
  return copy;
}

/// Forward mode (called right after the op, so its rule may take what it reads by reference):
/// for each jvp pass in progress at which an input in [first, last) carries a
/// tangent, gives `out` its tangent there, `rule(tangents)` (the inputs' tangents in order,
/// undefined where one has none; an undefined result is a zero tangent), or `rule(tangents,
/// output)` for a rule that reads the output. The rule runs with its own pass paused, so that
/// its ops carry the other passes' tangents (nested jvp needs them) but not a second-order term
/// of this one. `output` is out on a handle of its own (same data and autodiff state, the
/// tangents out has so far): the rule's ops may keep it on the tape, and out itself would there
/// hold the very tangent computed from it, a cycle that is never freed.
template <class It, class Rule> void push_tangents_range(const TensorBase& out, It first, It last, Rule rule) {
  if (context().forward_passes == 0) [[likely]]
    return;
  for (std::size_t i = 0; i < transform_levels().forward.size(); ++i) {
    const TransformLevels::Forward level = transform_levels().forward[i];
    if (level.paused || tangent_at(out, level.id).defined()) continue;  // out is an input: it has its tangent
    std::vector<TensorBase> tangents;
    bool any = false;
    for (It it = first; it != last; ++it) {
      tangents.push_back(tangent_at(*it, level.id));
      any = any || tangents.back().defined();
    }
    if (!any) continue;
    transform_levels().forward[i].paused = true;
    TensorBase result;
    try {
      if constexpr (std::is_invocable_v<Rule, std::span<const TensorBase>, const TensorBase&>)
        result = rule(std::span<const TensorBase>(tangents), TensorBase(std::make_shared<TensorImpl>(*out.impl())));
      else
        result = rule(std::span<const TensorBase>(tangents));
    } catch (...) {
      transform_levels().forward[i].paused = false;
      throw;
    }
    transform_levels().forward[i].paused = false;
    if (!result.defined()) continue;
    out.impl()->tangents.push_back({level.id, result.impl()});
    if (const auto& meta = out.impl()->autograd;
        meta && meta->grad_fn &&
        (meta->grad_fn->out_storage || meta->grad_fn->out_value || meta->grad_fn->out_physical)) {
      meta->grad_fn->out_tangents.push_back({level.id, off_tape(result.impl())});
    }
  }
}

/// push_tangents_range over a braced list of inputs.
template <class Rule> void push_tangents(const TensorBase& out, TensorRefs inputs, Rule rule) {
  push_tangents_range(out, inputs.begin(), inputs.end(), std::move(rule));
}

/// Scope guard: no jvp pass gives tangents inside it (a custom_vjp's forward function, whose
/// own ops must not stand in for the rule it lacks).
class TangentsPaused {
 public:
  TangentsPaused() {
    for (auto& level : transform_levels().forward) {
      m_paused.push_back(level.paused);
      level.paused = true;
    }
  }
  ~TangentsPaused() {
    for (std::size_t i = 0; i < m_paused.size(); ++i) transform_levels().forward[i].paused = m_paused[i];
  }
  TangentsPaused(const TangentsPaused&) = delete;
  TangentsPaused& operator=(const TangentsPaused&) = delete;

 private:
  std::vector<bool> m_paused;
};

/// True when a tensor in [first, last) carries a tangent of a jvp pass in progress.
template <class It> bool carries_tangents(It first, It last) {
  if (context().forward_passes == 0) [[likely]]
    return false;
  for (const TransformLevels::Forward& level : transform_levels().forward)
    if (!level.paused)
      for (It it = first; it != last; ++it)
        if (tangent_at(*it, level.id).defined()) return true;
  return false;
}

/// The rule of an op that has no forward-mode rule: an AutogradError naming it, raised only
/// when a tangent reaches it.
inline auto no_tangent_rule(std::string_view op, SourceLoc loc) {
  return [op, loc](std::span<const TensorBase>) -> TensorBase {
    throw AutogradError(concat("jvp: ", op, " (at ", loc.str(), ") has no forward-mode rule yet"));
  };
}

/// The innermost vmap in progress at which an input is batched (its level), or 0 when none is:
/// then the op runs its batching rule on the batches instead of its kernel. A batched tensor
/// kept after its vmap ended is a ValueError naming `op`.
template <class Range> std::uint64_t batch_level_of(std::string_view op, SourceLoc loc, const Range& inputs) {
  if (context().vmaps == 0) [[likely]]
    return 0;
  const auto& levels = transform_levels().vmap;
  std::uint64_t level = 0;
  for (const TensorBase& t : inputs) {
    const TensorImpl& impl = *t.impl();
    if (!impl.physical) continue;
    if (std::find(levels.begin(), levels.end(), impl.batch_level) == levels.end())
      throw_value_error(op, loc, "a batched tensor (", dtype_name(impl.dtype), impl.shape,
                        ") was kept after its vmap returned; return it from the mapped function instead");
    level = std::max(level, impl.batch_level);
  }
  return level;
}
inline std::uint64_t batch_level_of(std::string_view op, SourceLoc loc, TensorRefs inputs) {
  return batch_level_of<TensorRefs>(op, loc, inputs);
}

inline bool batched_at(const TensorBase& t, std::uint64_t level) {
  return t.impl()->physical && t.impl()->batch_level == level;
}

/// t's batch (the batch on axis 0) where t is batched at `level`, else t itself.
template <class T> Tensor<T> batch_of(const Tensor<T>& t, std::uint64_t level) {
  return batched_at(t, level) ? Tensor<T>(t.impl()->physical) : t;
}

/// [size, s...]: a batch of values shaped s.
inline Shape with_batch(std::int64_t size, const Shape& s) {
  Shape out{size};
  for (std::int64_t d : s) out.push_back(d);
  return out;
}

/// Value b of a batch (on axis 0): its slice b without that axis (vmap's loops, a scan's rows).
/// slice and reshape (ops/manipulation.hpp) are found where it is used: this header has no op.
template <class T> Tensor<T> value_of_batch(const Tensor<T>& batch, std::int64_t b, SourceLoc loc) {
  std::vector<std::int64_t> begin(static_cast<std::size_t>(batch.ndim()), 0), size = batch.shape().to_vector();
  begin[0] = b;
  size[0] = 1;
  return reshape(slice(batch, begin, size, loc), std::vector<std::int64_t>(size.begin() + 1, size.end()), loc);
}

/// x with its axis `from` moved to position `to`, the others in order.
template <class T> Tensor<T> move_axis(const Tensor<T>& x, int from, int to, SourceLoc loc = SourceLoc::current()) {
  if (from == to) return x;
  std::vector<std::int64_t> perm;
  for (int i = 0; i < x.ndim(); ++i)
    if (i != from) perm.push_back(i);
  perm.insert(perm.begin() + to, from);
  return transpose(x, perm, loc);
}

/// How often vmap ran each op once per value of a batch, for want of a batched form (by op).
inline std::map<std::string, std::int64_t, std::less<>>& vmap_loops(std::unique_lock<std::mutex>& lock) {
  static std::mutex mutex;
  static std::map<std::string, std::int64_t, std::less<>> loops;
  lock = std::unique_lock<std::mutex>(mutex);
  return loops;
}

/// Counts one loop of vmap over `op`'s batch, and says so on stderr the first time for each op:
/// a fallback is never silent.
inline void count_vmap_loop(std::string_view op) {
  std::unique_lock<std::mutex> lock;
  auto& loops = vmap_loops(lock);
  auto [entry, first] = loops.try_emplace(std::string(op), 0);
  ++entry->second;
  if (first)
    std::fprintf(stderr,
                 "xgrad: vmap runs %.*s once per value of the batch (no batched form for these inputs yet); "
                 "xg::vmap_loop_fallbacks() counts such loops\n",
                 static_cast<int>(op.size()), op.data());
}

/// The tensor standing for each value of the batch `physical` (on its axis 0) at `level`.
inline TensorBase batched(const TensorBase& physical, std::uint64_t level) {
  const Shape& s = physical.shape();
  auto impl = std::make_shared<TensorImpl>(Shape(s.begin() + 1, s.end()), physical.dtype(), std::shared_ptr<Storage>());
  impl->physical = physical.impl();
  impl->batch_level = level;
  return TensorBase(std::move(impl));
}

/// record_range over a braced list of inputs: the common case.
inline void record(const TensorBase& out, std::string_view op, SourceLoc loc, TensorRefs inputs, TensorRefs saved,
                   bool reads_output, std::function<autograd::Grads(const TensorBase&, const TensorBase&)> rule) {
  record_range(out, op, loc, inputs.begin(), inputs.end(), saved, reads_output, std::move(rule));
}

}  // namespace xgrad::detail

namespace xgrad {

/// How often vmap has run each op once per value of a batch instead of on the whole batch (an
/// op whose batching rule cannot take these inputs, such as a convolution with batched weights),
/// by op name, since the program started.
inline std::map<std::string, std::int64_t> vmap_loop_fallbacks() {
  std::unique_lock<std::mutex> lock;
  const auto& loops = detail::vmap_loops(lock);
  return {loops.begin(), loops.end()};
}

}  // namespace xgrad
