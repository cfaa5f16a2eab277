// Definitions of backend/memory_plan.hpp: included by it when header-only, compiled once into
// the library (src/backend.cpp) otherwise.
#pragma once

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <string>
#include <vector>

#include "xgrad/backend/memory_plan.hpp"
#include "xgrad/backend/schedule.hpp"

namespace xgrad::backend {

namespace detail {

inline std::size_t value_bytes(const ir::Value& v) {
  const std::size_t raw = static_cast<std::size_t>(v.shape.numel()) * dtype_size(v.dtype);
  return (std::max<std::size_t>(raw, 1) + MemoryPlan::kAlignment - 1) / MemoryPlan::kAlignment * MemoryPlan::kAlignment;
}

/// The inputs whose buffer output `j` of `node` may take when they die there.
inline std::vector<int> in_place_candidates(const ir::Node& node, std::size_t j) {
  if (!node.in_place.empty()) return node.in_place[j];
  std::vector<int> out;
  if (!node.traits.elementwise || !node.subgraphs.empty()) return out;
  const ir::Value& result = *node.outputs[j];
  for (std::size_t i = 0; i < node.inputs.size(); ++i)
    if (node.inputs[i]->shape == result.shape && dtype_size(node.inputs[i]->dtype) == dtype_size(result.dtype))
      out.push_back(static_cast<int>(i));
  return out;
}

/// Free parts of the arena, by offset; takes the smallest part that fits.
class FreeList {
 public:
  /// An offset for `bytes`, and whether it reuses freed space (else it grows the arena).
  std::pair<std::size_t, bool> take(std::size_t bytes) {
    auto best = m_free.end();
    for (auto it = m_free.begin(); it != m_free.end(); ++it)
      if (it->bytes >= bytes && (best == m_free.end() || it->bytes < best->bytes)) best = it;
    if (best == m_free.end()) {
      // The last free part may end at the top: grow from there.
      if (!m_free.empty() && m_free.back().offset + m_free.back().bytes == m_top) {
        const std::size_t offset = m_free.back().offset;
        m_top = offset + bytes;
        m_free.pop_back();
        m_peak = std::max(m_peak, m_top);
        return {offset, true};
      }
      const std::size_t offset = m_top;
      m_top += bytes;
      m_peak = std::max(m_peak, m_top);
      return {offset, false};
    }
    const std::size_t offset = best->offset;
    if (best->bytes == bytes)
      m_free.erase(best);
    else {
      best->offset += bytes;
      best->bytes -= bytes;
    }
    return {offset, true};
  }

  void give(std::size_t offset, std::size_t bytes) {
    auto it = std::lower_bound(m_free.begin(), m_free.end(), offset,
                               [](const MemoryPlan::Region& r, std::size_t o) { return r.offset < o; });
    it = m_free.insert(it, {offset, bytes});
    if (auto next = it + 1; next != m_free.end() && it->offset + it->bytes == next->offset) {
      it->bytes += next->bytes;
      m_free.erase(next);
    }
    if (it != m_free.begin())
      if (auto prev = it - 1; prev->offset + prev->bytes == it->offset) {
        prev->bytes += it->bytes;
        m_free.erase(it);
      }
  }

  std::size_t peak() const { return m_peak; }

 private:
  std::vector<MemoryPlan::Region> m_free;
  std::size_t m_top = 0, m_peak = 0;
};

}  // namespace detail

XGRAD_API std::string MemoryPlan::summary() const {
  std::string out = xgrad::detail::concat("arena ", bytes_text(arena_bytes), " for ", num_planned, " buffers (",
                                          bytes_text(unplanned_bytes), " without reuse); ", num_in_place, " in place, ",
                                          num_reused, " reuse a dead buffer");
  if (num_written_into > 0)
    out += xgrad::detail::concat("; ", num_written_into, " written into the inputs they update");
  return out;
}

XGRAD_API std::string MemoryPlan::note(const ir::Node& node) const {
  std::string out;
  for (const ir::Value* v : node.outputs) {
    const auto id = static_cast<std::size_t>(v->id);
    if (offset[id] == kNotPlanned) continue;
    out += xgrad::detail::concat(out.empty() ? "  [" : "; [", "%", v->id, " arena @", offset[id]);
    if (in_place_of[id] >= 0) out += xgrad::detail::concat(", in place of %", in_place_of[id]);
    if (reused[id]) out += ", reused";
    if (written_into[id] >= 0) out += xgrad::detail::concat(", written into %", written_into[id]);
    out += "]";
  }
  return out;
}

XGRAD_API std::string MemoryPlan::bytes_text(std::size_t bytes) {
  if (bytes >= (std::size_t{1} << 20)) return xgrad::detail::concat(static_cast<double>(bytes) / (1 << 20), " MiB");
  if (bytes >= (std::size_t{1} << 10)) return xgrad::detail::concat(static_cast<double>(bytes) / (1 << 10), " KiB");
  return xgrad::detail::concat(bytes, " B");
}

XGRAD_API MemoryPlan plan_memory(const ir::Graph& g) {
  const std::size_t num_values = g.values.size(), num_nodes = g.nodes.size();
  MemoryPlan plan;
  plan.offset.assign(num_values, MemoryPlan::kNotPlanned);
  plan.in_place_of.assign(num_values, -1);
  plan.reused.assign(num_values, false);
  plan.written_into.assign(num_values, -1);
  plan.freed_after.resize(num_nodes);

  // A view shares its input's buffer: each buffer is a class of values with one root.
  std::vector<std::size_t> root(num_values);
  std::iota(root.begin(), root.end(), std::size_t{0});
  auto id = [](const ir::Value* v) { return static_cast<std::size_t>(v->id); };
  for (const auto& node : g.nodes)
    if (node->traits.view) root[id(node->outputs[0])] = root[id(node->inputs[0])];

  // Which roots the arena may hold, and the last node that reads each buffer.
  std::vector<bool> plannable(num_values, true);
  std::vector<std::ptrdiff_t> last_use(num_values, -1);
  for (const ir::Value* v : g.inputs) plannable[root[id(v)]] = false;
  for (const ir::Value* v : g.outputs) plannable[root[id(v)]] = false;
  for (std::size_t k = 0; k < num_nodes; ++k) {
    const ir::Node& node = *g.nodes[k];
    // Consts own their value; control-flow nodes return their body's results.
    const bool own_buffers = node.is<op::Const>() || (!node.subgraphs.empty() && !node.is<op::Fused>());
    for (const ir::Value* v : node.outputs) {
      if (own_buffers) plannable[root[id(v)]] = false;
      last_use[root[id(v)]] = std::max<std::ptrdiff_t>(last_use[root[id(v)]], static_cast<std::ptrdiff_t>(k));
    }
    for (const ir::Value* v : node.inputs) last_use[root[id(v)]] = static_cast<std::ptrdiff_t>(k);
  }
  // Effects are applied when the call ends, and a node in the background may run until then.
  for (const auto& e : g.effects) last_use[root[id(e.value)]] = static_cast<std::ptrdiff_t>(num_nodes);
  const std::vector<bool> background = background_nodes(g);
  for (std::size_t k = 0; k < num_nodes; ++k)
    if (background[k])
      for (const auto* values : {&g.nodes[k]->inputs, &g.nodes[k]->outputs})
        for (const ir::Value* v : *values)
          if (plannable[root[id(v)]]) last_use[root[id(v)]] = static_cast<std::ptrdiff_t>(num_nodes);

  detail::FreeList arena;
  // The stage of each node: a stage's nodes run at once.
  const std::vector<Stage> cut = stages(g);
  std::vector<Stage> stage_of(num_nodes);
  for (const Stage& stage : cut)
    for (std::size_t k = stage.begin; k < stage.end; ++k) stage_of[k] = stage;
  // Whether output j of node k may be written over the buffer of `in`, one of its inputs: the
  // node reads it last, through `in` alone (a fused group may read another view of it after the
  // step that writes the output), element by element before writing (an in-place candidate),
  // and no node running beside it reads it.
  auto may_overwrite = [&](std::size_t k, std::size_t j, const ir::Value* in) {
    const ir::Node& node = *g.nodes[k];
    const std::size_t r = root[id(in)];
    const auto candidates = detail::in_place_candidates(node, j);
    const auto reads_as_candidate = [&](int i) { return node.inputs[static_cast<std::size_t>(i)] == in; };
    const auto readers =
        std::count_if(node.inputs.begin(), node.inputs.end(), [&](const ir::Value* u) { return root[id(u)] == r; });
    if (last_use[r] != static_cast<std::ptrdiff_t>(k) ||
        readers != std::count(node.inputs.begin(), node.inputs.end(), in) ||
        std::none_of(candidates.begin(), candidates.end(), reads_as_candidate))
      return false;
    const Stage& stage = stage_of[k];
    for (std::size_t other = stage.begin; other < stage.end; ++other)
      if (other != k && std::any_of(g.nodes[other]->inputs.begin(), g.nodes[other]->inputs.end(),
                                    [&](const ir::Value* u) { return root[id(u)] == r; }))
        return false;
    return true;
  };
  for (const Stage& stage : cut) {
    std::vector<std::size_t> taken;  // roots whose buffer an output took in place
    for (std::size_t k = stage.begin; k < stage.end; ++k) {
      const ir::Node& node = *g.nodes[k];
      for (std::size_t j = 0; j < node.outputs.size(); ++j) {
        const ir::Value& v = *node.outputs[j];
        if (node.traits.view || !plannable[id(&v)]) continue;
        const std::size_t bytes = detail::value_bytes(v);
        const ir::Value* donor = nullptr;
        for (int i : detail::in_place_candidates(node, j)) {
          const ir::Value* in = node.inputs[static_cast<std::size_t>(i)];
          const std::size_t r = root[id(in)];
          if (plan.offset[r] != MemoryPlan::kNotPlanned && detail::value_bytes(*g.values[r]) == bytes &&
              std::find(taken.begin(), taken.end(), r) == taken.end() && may_overwrite(k, j, in)) {
            donor = in;
            break;
          }
        }
        if (donor) {
          plan.offset[id(&v)] = plan.offset[root[id(donor)]];
          plan.in_place_of[id(&v)] = donor->id;
          taken.push_back(root[id(donor)]);
          ++plan.num_in_place;
        } else {
          auto [offset, reused] = arena.take(bytes);
          plan.offset[id(&v)] = static_cast<std::ptrdiff_t>(offset);
          plan.reused[id(&v)] = reused;
          if (reused) ++plan.num_reused;
        }
        ++plan.num_planned;
        plan.unplanned_bytes += bytes;
      }
    }
    // Buffers nothing reads after this stage (and not passed on in place) are free again.
    auto release = [&](const ir::Value* v) {
      const std::size_t r = root[id(v)];
      if (plan.offset[r] == MemoryPlan::kNotPlanned || last_use[r] < static_cast<std::ptrdiff_t>(stage.begin) ||
          last_use[r] >= static_cast<std::ptrdiff_t>(stage.end) ||
          std::find(taken.begin(), taken.end(), r) != taken.end())
        return;
      taken.push_back(r);  // once per stage
      const MemoryPlan::Region region{static_cast<std::size_t>(plan.offset[r]), detail::value_bytes(*g.values[r])};
      arena.give(region.offset, region.bytes);
      plan.freed_after[stage.end - 1].push_back(region);
    };
    for (std::size_t k = stage.begin; k < stage.end; ++k) {
      for (const ir::Value* v : g.nodes[k]->inputs) release(v);
      for (const ir::Value* v : g.nodes[k]->outputs) release(v);
    }
  }
  plan.arena_bytes = arena.peak();

  // Effects whose node may write the value straight into the input it updates.
  std::vector<std::size_t> node_index(num_values, num_nodes);  // the node making each value
  std::vector<std::size_t> views(num_values, 0);               // per root: values viewing it
  for (std::size_t k = 0; k < num_nodes; ++k)
    for (const ir::Value* v : g.nodes[k]->outputs) {
      node_index[id(v)] = k;
      if (root[id(v)] != id(v)) ++views[root[id(v)]];
    }
  std::vector<bool> returned(num_values, false);
  for (const ir::Value* v : g.outputs) returned[root[id(v)]] = true;
  for (const auto& e : g.effects) {
    const ir::Value* v = e.value;
    const ir::Value* input = g.inputs[e.input];
    const std::size_t k = node_index[id(v)], r = root[id(input)];
    if (k == num_nodes || plan.offset[id(v)] == MemoryPlan::kNotPlanned || views[id(v)] > 0 || returned[r] ||
        plan.written_into[id(v)] >= 0 || last_use[r] > static_cast<std::ptrdiff_t>(k) ||
        detail::value_bytes(*v) != detail::value_bytes(*input))
      continue;
    // Nothing may take v's buffer in place: it is the caller's tensor.
    bool given_on = false;
    for (std::size_t w = 0; w < num_values; ++w)
      given_on = given_on || (plan.in_place_of[w] >= 0 && root[static_cast<std::size_t>(plan.in_place_of[w])] == id(v));
    if (given_on) continue;
    // Nor while a node in the background, started before it, may still be reading the input.
    const auto reads_input = [&](const ir::Value* u) { return root[id(u)] == r; };
    bool read_in_background = false;
    for (std::size_t b = 0; b < k; ++b)
      read_in_background =
          read_in_background || (background[b] && std::ranges::any_of(g.nodes[b]->inputs, reads_input));
    if (read_in_background) continue;
    // The input is read last before v's stage, or by v's node, which may write over it.
    const ir::Node& node = *g.nodes[k];
    const auto j =
        static_cast<std::size_t>(std::find(node.outputs.begin(), node.outputs.end(), v) - node.outputs.begin());
    if (last_use[r] >= static_cast<std::ptrdiff_t>(stage_of[k].begin) && !may_overwrite(k, j, input)) continue;
    plan.written_into[id(v)] = input->id;
    ++plan.num_written_into;
  }
  return plan;
}

}  // namespace xgrad::backend
