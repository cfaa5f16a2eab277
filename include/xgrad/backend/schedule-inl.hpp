// Definitions of backend/schedule.hpp: included by it when header-only, compiled once into the
// library (src/backend.cpp) otherwise.
#pragma once

#include <algorithm>
#include <cmath>

#include "xgrad/backend/cpu/elementwise.hpp"
#include "xgrad/backend/cpu/gemm.hpp"
#include "xgrad/backend/schedule.hpp"

namespace xgrad::backend {

namespace detail {

/// The most multiply-adds a matrix product may do to run beside others: four times the GEMM's
/// own threshold for splitting, as two threads split products up to that size for little gain
/// (LeNet5's 32 x 84 x 120 products: as long on two threads as on one), while two such
/// products at once take one's time.
inline constexpr std::int64_t kBesideWork = 4 * cpu::kGemmParallelWork;

/// A node's work, in elements read and written (multiply-adds for a contraction), or -1 when
/// its kernel may split it among threads, or it has effects or control flow.
inline std::int64_t one_thread_work(const ir::Node& node) {
  if (node.has_effect) return -1;
  if (node.is<op::Fused>()) {
    std::int64_t sum = 0;
    for (const auto& n : node.subgraphs[0]->nodes) {
      const std::int64_t w = one_thread_work(*n);
      if (w < 0) return -1;
      sum += w;
    }
    return sum;
  }
  if (!node.subgraphs.empty()) return -1;
  if (node.traits.view || node.is<op::Const>()) return 0;
  if (node.traits.contraction && node.inputs.size() >= 2) {
    const double work = std::sqrt(static_cast<double>(node.inputs[0]->shape.numel()) *
                                  static_cast<double>(node.inputs[1]->shape.numel()) *
                                  static_cast<double>(node.outputs[0]->shape.numel()));
    return work <= static_cast<double>(kBesideWork) ? static_cast<std::int64_t>(work) : -1;
  }
  std::int64_t sum = 0;
  for (const auto* values : {&node.inputs, &node.outputs})
    for (const ir::Value* v : *values) {
      if (v->shape.numel() > 2 * cpu::kElementwiseGrain) return -1;
      sum += v->shape.numel();
    }
  return sum;
}

}  // namespace detail

XGRAD_API bool runs_beside_others(const ir::Node& node) {
  // Below a grain of work, a node takes about as long as starting a parallel region.
  return detail::one_thread_work(node) >= cpu::kElementwiseGrain;
}

XGRAD_API std::vector<Stage> stages(const ir::Graph& g) {
  std::vector<Stage> out;
  bool last_side_by_side = false;
  for (std::size_t k = 0; k < g.nodes.size(); ++k) {
    const ir::Node& node = *g.nodes[k];
    const bool side_by_side = runs_beside_others(node);
    const bool joins = side_by_side && last_side_by_side &&
                       std::none_of(node.inputs.begin(), node.inputs.end(), [&](const ir::Value* v) {
                         for (std::size_t j = out.back().begin; j < k; ++j)
                           if (v->producer == g.nodes[j].get()) return true;
                         return false;
                       });
    if (joins)
      out.back().end = k + 1;
    else
      out.push_back({k, k + 1});
    last_side_by_side = side_by_side;
  }
  return out;
}

XGRAD_API std::vector<bool> background_nodes(const ir::Graph& g) {
  std::vector<bool> read(g.values.size(), false);
  for (const auto& node : g.nodes)
    for (const ir::Value* v : node->inputs) read[static_cast<std::size_t>(v->id)] = true;
  std::vector<bool> out(g.nodes.size(), false);
  // Only where a node that splits its work among the threads comes after: the one a worker
  // busy in the background joins late. Without one, the call would only wait for it.
  bool splits_after = false;
  for (std::size_t k = g.nodes.size(); k-- > 0;) {
    const ir::Node& node = *g.nodes[k];
    out[k] = splits_after && !node.outputs.empty() && runs_beside_others(node) &&
             std::none_of(node.outputs.begin(), node.outputs.end(),
                          [&](const ir::Value* v) { return read[static_cast<std::size_t>(v->id)]; });
    splits_after = splits_after || detail::one_thread_work(node) < 0;
  }
  return out;
}

}  // namespace xgrad::backend
