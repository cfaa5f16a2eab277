// Definitions of autograd/engine.hpp: included by it when header-only, compiled once into the
// library (src/autograd.cpp) otherwise.
#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "xgrad/autograd/engine.hpp"
#include "xgrad/ir/tracer.hpp"
#include "xgrad/ops/elementwise.hpp"
#include "xgrad/ops/reduce.hpp"

namespace xgrad::autograd {

namespace detail {

/// The gradient summed back to `shape` when the op broadcast its input.
template <class T> TensorBase fit_to(const TensorBase& g, const Shape& shape) {
  return g.shape() == shape ? g : TensorBase(sum_to(Tensor<T>(g), shape));
}

XGRAD_API TensorBase add_grads(const TensorBase& a, const TensorBase& b) {
  if (a.dtype() == DType::float64) return Tensor<double>(a) + Tensor<double>(b);
  return Tensor<float>(a) + Tensor<float>(b);
}

inline TensorBase fit_grad(const TensorBase& g, const Shape& shape) {
  return g.dtype() == DType::float64 ? fit_to<double>(g, shape) : fit_to<float>(g, shape);
}

inline void check_saved(const Node& node) {
  auto fail = [&](std::uint64_t saved, std::uint64_t now) {
    throw AutogradError(xgrad::detail::concat("backward: a tensor that ", node.op, " (at ", node.loc.str(),
                                              ") saved for its gradient was modified in place "
                                              "afterwards (version ",
                                              saved, " when saved, ", now,
                                              " now); compute the gradient before changing it, or change a copy"));
  };
  for (const auto& s : node.saved) {
    if (s.storage && s.storage->version() != s.version) fail(s.version, s.storage->version());
    if (auto impl = s.traced.lock(); impl && impl->rebinds != s.rebinds) fail(s.rebinds, impl->rebinds);
  }
  if (node.out_storage && node.out_storage->version() != node.out_version)
    fail(node.out_version, node.out_storage->version());
}

/// Scope guard: no grad transform counts as evaluating its function inside it (a backward
/// pass that records nothing).
class FirstOrderScope {
 public:
  FirstOrderScope() : m_previous(xgrad::detail::context().transform_depth) {
    xgrad::detail::context().transform_depth = 0;
  }
  ~FirstOrderScope() { xgrad::detail::context().transform_depth = m_previous; }
  FirstOrderScope(const FirstOrderScope&) = delete;
  FirstOrderScope& operator=(const FirstOrderScope&) = delete;

 private:
  int m_previous;
};

}  // namespace detail
XGRAD_API std::vector<TensorBase> run_backward(const std::vector<TensorBase>& roots,
                                               const std::vector<TensorBase>& seeds,
                                               const std::vector<std::shared_ptr<AutogradMeta>>& targets,
                                               bool create_graph, const GradientReady& ready) {
  std::unordered_map<const AutogradMeta*, std::size_t> target_index;
  for (std::size_t i = 0; i < targets.size(); ++i) target_index.emplace(targets[i].get(), i);

  // Post-order DFS; a meta is kept only if it leads to a target (or to a leaf, when accumulating).
  // Several roots: one DFS from each over a shared visited set still lists a topological order.
  std::vector<std::shared_ptr<AutogradMeta>> order;
  std::unordered_map<const AutogradMeta*, bool> useful;
  std::vector<std::pair<std::shared_ptr<AutogradMeta>, std::size_t>> stack;
  for (const auto& root : roots) {
    const auto& root_meta = root.impl()->autograd;
    if (root_meta && root_meta->requires_grad && useful.emplace(root_meta.get(), false).second)
      stack.push_back({root_meta, 0});
    while (!stack.empty()) {
      auto& [meta, next] = stack.back();
      const Node* node = meta->grad_fn.get();
      if (node && next < node->inputs.size()) {
        const auto& child = node->inputs[next++].meta;
        if (child && useful.emplace(child.get(), false).second) stack.push_back({child, 0});
        continue;
      }
      bool is_useful = targets.empty() ? !node : target_index.count(meta.get()) > 0;
      if (node)
        for (const auto& in : node->inputs) is_useful = is_useful || (in.meta && useful[in.meta.get()]);
      useful[meta.get()] = is_useful;
      if (is_useful) order.push_back(meta);
      stack.pop_back();
    }
  }

  std::vector<TensorBase> results(targets.size());
  std::unordered_map<const AutogradMeta*, TensorBase> grads;
  // For `ready`: the contributions each target still waits for (one per edge from a node the
  // pass runs), and whether it has been told.
  std::unordered_map<const AutogradMeta*, std::size_t> pending;
  std::vector<bool> told(targets.size(), false);
  if (ready) {
    for (const auto& meta : order)
      if (const Node* node = meta->grad_fn.get())
        for (const auto& in : node->inputs)
          if (in.meta && useful[in.meta.get()] && target_index.count(in.meta.get())) ++pending[in.meta.get()];
  }
  auto tell = [&](const AutogradMeta* meta) {
    const std::size_t t = target_index.at(meta);
    if (told[t]) return;
    told[t] = true;
    const auto found = grads.find(meta);
    ready(t, found == grads.end() ? TensorBase() : found->second);
  };
  for (std::size_t i = 0; i < roots.size(); ++i) {
    const auto& meta = roots[i].impl()->autograd;
    if (!meta || !meta->requires_grad) continue;
    auto [slot, fresh] = grads.try_emplace(meta.get(), seeds[i]);
    if (!fresh) slot->second = detail::add_grads(slot->second, seeds[i]);
  }
  std::optional<no_grad> off;
  std::optional<enable_grad> on;
  std::optional<detail::FirstOrderScope> first_order;
  if (create_graph) {
    on.emplace();
  } else {
    off.emplace();
    // A backward pass nobody differentiates is first order even inside a grad transform
    // (grad(jit(f)) runs jit's gradient here): rules that differentiate a function again
    // (a jitted call's, a traced loop's) must not record for a second order.
    first_order.emplace();
  }

  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const auto& meta = *it;
    auto found = grads.find(meta.get());
    if (found == grads.end()) continue;
    TensorBase g = std::move(found->second);
    grads.erase(found);
    if (auto t = target_index.find(meta.get()); t != target_index.end()) results[t->second] = g;
    const Node* node = meta->grad_fn.get();
    if (!node) {
      if (targets.empty()) meta->grad = meta->grad ? detail::add_grads(TensorBase(meta->grad), g).impl() : g.impl();
      continue;
    }
    detail::check_saved(*node);
    TensorBase out;
    if (node->out_storage || node->out_value || node->out_physical) {
      auto impl = std::make_shared<TensorImpl>(node->out_shape, node->out_dtype, node->out_storage);
      impl->value = node->out_value;
      impl->physical = node->out_physical;
      impl->batch_level = node->out_batch_level;
      impl->tangents = node->out_tangents;
      impl->autograd = meta;
      out = TensorBase(impl);
    }
    // While tracing, the nodes of this step point at the forward op's line.
    std::optional<tracing::GradientScope> at_forward;
    if (tracing::Tracer::active()) at_forward.emplace(node->loc);
    Grads input_grads = node->rule(out, g);
    for (std::size_t i = 0; i < node->inputs.size(); ++i) {
      const auto& in = node->inputs[i];
      if (!in.meta || !useful[in.meta.get()]) continue;
      if (i < input_grads.size() && input_grads[i].defined()) {
        TensorBase gi = detail::fit_grad(input_grads[i], in.shape);
        auto [slot, fresh] = grads.try_emplace(in.meta.get(), gi);
        if (!fresh) slot->second = detail::add_grads(slot->second, gi);
      }
      if (ready) {
        const auto left = pending.find(in.meta.get());
        if (left != pending.end() && --left->second == 0) tell(in.meta.get());
      }
    }
  }
  // Targets no node's rule reached (a root, or behind a node no gradient reached), last.
  if (ready)
    for (std::size_t t = 0; t < targets.size(); ++t)
      if (!told[t]) {
        told[t] = true;
        ready(t, results[t]);
      }
  return results;
}

XGRAD_API std::vector<TensorBase> run_backward(const TensorBase& root, const TensorBase& seed,
                                               const std::vector<std::shared_ptr<AutogradMeta>>& targets,
                                               bool create_graph, SourceLoc loc, const GradientReady& ready) {
  if (!root.requires_grad())
    throw AutogradError(xgrad::detail::concat("backward: the output (", dtype_name(root.dtype()), root.shape(), ", at ",
                                              loc.str(),
                                              ") does not depend on any tensor that requires grad; call "
                                              "set_requires_grad(true) on an input or use a Parameter"));
  return run_backward(std::vector<TensorBase>{root}, std::vector<TensorBase>{seed}, targets, create_graph, ready);
}

}  // namespace xgrad::autograd
