// Definitions of backend/executor.hpp: included by it when header-only, compiled once into the
// library (src/backend.cpp) otherwise.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include "xgrad/backend/cpu/thread_pool.hpp"
#include "xgrad/backend/executor.hpp"
#include "xgrad/backend/kernels.hpp"
#include "xgrad/core/host_memory.hpp"
#include "xgrad/ir/printer.hpp"

namespace xgrad::backend {

struct Program::Workspace::Background {
  Operands ops;
  cpu::detail::BackgroundTask task;
  const ir::Node* node = nullptr;
  std::size_t index = 0;  // the node's in the graph
  bool started = false;   // by this call, its results not yet kept
};

XGRAD_API Program::Workspace::~Workspace() = default;

XGRAD_API Program::Program(std::shared_ptr<const ir::Graph> graph, ProgramOptions options)
    : m_graph(std::move(graph)), m_options(options), m_pools(std::make_unique<Pools>()) {
  const auto& nodes = m_graph->nodes;
  std::vector<std::ptrdiff_t> last_use(m_graph->values.size(), -1);
  for (std::size_t k = 0; k < nodes.size(); ++k)
    for (const ir::Value* v : nodes[k]->inputs)
      last_use[static_cast<std::size_t>(v->id)] = static_cast<std::ptrdiff_t>(k);
  for (const ir::Value* v : m_graph->outputs) last_use[static_cast<std::size_t>(v->id)] = -1;
  for (const auto& e : m_graph->effects) last_use[static_cast<std::size_t>(e.value->id)] = -1;
  m_release.resize(nodes.size());
  for (std::size_t id = 0; id < last_use.size(); ++id)
    if (last_use[id] >= 0) m_release[static_cast<std::size_t>(last_use[id])].push_back(static_cast<int>(id));
  m_stages = backend::stages(*m_graph);
  const std::vector<bool> background = backend::background_nodes(*m_graph);
  m_background_index.assign(nodes.size(), -1);
  for (std::size_t k = 0; k < nodes.size(); ++k)
    if (background[k]) {
      m_background_index[k] = static_cast<std::ptrdiff_t>(m_background.size());
      m_background.push_back(k);
    }
  if (m_options.plan_memory) {
    m_plan = plan_memory(*m_graph);
    for (const auto& e : m_graph->effects)
      if (m_plan->written_into[static_cast<std::size_t>(e.value->id)] >= 0)
        m_written_into.emplace_back(static_cast<std::size_t>(e.value->id), e.input);
  }
}

XGRAD_API std::vector<TensorBase> Program::run(std::span<const TensorBase> inputs) const {
  std::vector<TensorBase> results;
  run(inputs, results);
  return results;
}

XGRAD_API void Program::run(std::span<const TensorBase> inputs, std::vector<TensorBase>& results) const {
  const ir::Graph& g = *m_graph;
  const Device device = device_of_inputs(inputs);
  Lease lease(m_pools->of(device), [&] { return make_workspace(device); });
  Workspace& ws = lease.workspace();
  auto& env = ws.env;
  for (std::size_t i = 0; i < g.inputs.size(); ++i) env[static_cast<std::size_t>(g.inputs[i]->id)] = inputs[i];
  bind_written_into(inputs, ws);
  // Whatever happens, no node is left running in the background on this workspace.
  struct WaitForBackground {
    Workspace& ws;
    ~WaitForBackground() {
      for (auto& b : ws.background) {
        cpu::detail::wait_for(b.task);
        b.started = false;
        b.ops.in.clear();
        b.ops.out.clear();
      }
    }
  } wait_for_background{ws};
  // On the cpu a node in the background starts on a worker and the caller goes on without it.
  auto in_background = [&](std::size_t k) { return device == Device::cpu && m_background_index[k] >= 0; };
  for (const Stage& stage : m_stages) {
    std::size_t in_front = stage.size();
    for (std::size_t k = stage.begin; k < stage.end; ++k) {
      if (!in_background(k)) continue;
      auto& b = ws.background[static_cast<std::size_t>(m_background_index[k])];
      gather_operands(ws, b.ops, k);
      b.started = true;
      cpu::detail::run_in_background(b.task);
      --in_front;
    }
    if (in_front <= 1) {
      for (std::size_t k = stage.begin; k < stage.end; ++k)
        if (!in_background(k)) run_node(ws, ws.operands[0], k);
    } else {
      cpu::parallel_for(static_cast<std::int64_t>(stage.begin), static_cast<std::int64_t>(stage.end), 1,
                        [&](std::int64_t lo, std::int64_t hi) {
                          for (auto k = static_cast<std::size_t>(lo); k < static_cast<std::size_t>(hi); ++k)
                            if (!in_background(k)) run_node(ws, ws.operands[k - stage.begin], k);
                        });
    }
    for (std::size_t k = stage.begin; k < stage.end; ++k) {
      for (int id : m_release[k]) env[static_cast<std::size_t>(id)] = TensorBase();
      if (m_plan && m_options.poison_freed_buffers)
        for (const auto& region : m_plan->freed_after[k])
          kernels::fill(device, ws.arena->data() + region.offset, static_cast<std::int64_t>(region.bytes),
                        std::byte{0xFF});
    }
  }
  for (auto& b : ws.background) {
    if (!std::exchange(b.started, false)) continue;
    cpu::detail::wait_for(b.task);
    if (b.task.m_error) std::rethrow_exception(std::exchange(b.task.m_error, nullptr));
    keep_results(ws, b.ops, b.index);
  }
  apply_effects(inputs, ws);
  for (TensorBase& t : ws.into_input) t.impl()->storage.reset();  // the caller's, not ours to keep
  results.clear();
  results.reserve(g.outputs.size());
  for (const ir::Value* v : g.outputs) {
    const TensorBase& t = env[static_cast<std::size_t>(v->id)];
    // A constant belongs to the graph, an arena buffer to the next call (a kernel may pass
    // one through, as a reduction over size-1 axes does): the caller gets a copy.
    const bool shared = (v->producer && v->producer->is<op::Const>()) || t.impl()->storage->borrowed();
    results.push_back(shared ? xgrad::detail::copy_to(t, t.device()) : t);
  }
  for (auto& t : env) t = TensorBase();
}

XGRAD_API void Program::run_node(Workspace& ws, Workspace::Operands& ops, std::size_t k) const {
  const ir::Node& node = *m_graph->nodes[k];
  gather_operands(ws, ops, k);
  if (node.is<op::Const>() && ws.device != Device::cpu && ws.constants[k].defined())
    ops.out[0] = ws.constants[k];
  else
    node.kernel(ops.in, ops.out);
  keep_results(ws, ops, k);
}

XGRAD_API void Program::gather_operands(Workspace& ws, Workspace::Operands& ops, std::size_t k) const {
  const ir::Node& node = *m_graph->nodes[k];
  const Device device = ws.device;
  ops.in.clear();
  for (const ir::Value* v : node.inputs) ops.in.push_back(ws.env[static_cast<std::size_t>(v->id)]);
  // On a device, a node whose inputs are all on the cpu (a constant, a factory, scalars)
  // runs there and its result moves to the device; its planned buffer is not for cpu kernels.
  const bool moved = device != Device::cpu && std::none_of(ops.in.begin(), ops.in.end(), [](const TensorBase& t) {
                       return t.device() != Device::cpu;
                     });
  ops.out.clear();  // each output's planned buffer, or undefined: the kernel makes its own
  for (const ir::Value* v : node.outputs)
    ops.out.push_back(moved ? TensorBase() : ws.planned[static_cast<std::size_t>(v->id)]);
}

XGRAD_API void Program::keep_results(Workspace& ws, Workspace::Operands& ops, std::size_t k) const {
  const ir::Node& node = *m_graph->nodes[k];
  const Device device = ws.device;
  for (std::size_t j = 0; j < ops.out.size(); ++j) {
    const ir::Value& v = *node.outputs[j];
    check_output(node, v, ops.out[j]);
    if (device != Device::cpu) move_to_device(ws, ops, node, j);
    keep_in_plan(ws, v, ops.out[j]);
    ws.env[static_cast<std::size_t>(v.id)] = std::move(ops.out[j]);
  }
  ops.in.clear();
}

XGRAD_API Program::Arena::Arena(std::size_t bytes, Device device) : m_device(device) {
  if (device == Device::cpu) {
    m_data = static_cast<std::byte*>(xgrad::detail::host_allocate(xgrad::detail::host_capacity(bytes)));
    if (!m_data)
      throw AllocationError(xgrad::detail::concat("jit: cannot allocate a compiled function's ", bytes,
                                                  "-byte arena on cpu: out of memory"));
  } else {
    m_storage = std::make_unique<Storage>(bytes, device);
    m_data = static_cast<std::byte*>(m_storage->data());
  }
}

XGRAD_API Program::Arena::~Arena() {
  if (m_device == Device::cpu) std::free(m_data);
}

XGRAD_API Device Program::device_of_inputs(std::span<const TensorBase> inputs) const {
  const TensorBase* first = nullptr;
  std::size_t first_index = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const TensorBase& t = inputs[i];
    if (t.device() == Device::cpu && t.numel() == 1) continue;
    if (!first) {
      first = &t;
      first_index = i;
    } else if (t.device() != first->device()) {
      throw ValueError(xgrad::detail::concat(
          "jit: ", m_graph->name, ": input ", first_index, " (", describe_input(first_index), ") is on ",
          device_name(first->device()), " but input ", i, " (", describe_input(i), ") is on ", device_name(t.device()),
          "; a compiled graph runs on one device: move them with .to(device)"));
    }
  }
  return first ? first->device() : Device::cpu;
}

XGRAD_API std::string Program::describe_input(std::size_t i) const {
  const ir::Value& v = *m_graph->inputs[i];
  return v.name.empty() ? ir::type_str(v.dtype, v.shape)
                        : xgrad::detail::concat(v.name, ": ", ir::type_str(v.dtype, v.shape));
}

XGRAD_API std::unique_ptr<Program::Workspace> Program::make_workspace(Device device) const {
  auto ws = std::make_unique<Workspace>();
  ws->device = device;
  const ir::Graph& g = *m_graph;
  ws->env.resize(g.values.size());
  ws->planned.resize(g.values.size());
  std::size_t longest_stage = 1;
  for (const Stage& stage : m_stages) longest_stage = std::max(longest_stage, stage.size());
  ws->operands.resize(longest_stage);
  ws->background = std::vector<Workspace::Background>(m_background.size());
  for (std::size_t i = 0; i < m_background.size(); ++i) {
    Workspace::Background& b = ws->background[i];
    b.index = m_background[i];
    b.node = g.nodes[b.index].get();
    b.task.m_ctx = &b;
    b.task.m_invoke = [](void* ctx) {
      auto& self = *static_cast<Workspace::Background*>(ctx);
      self.node->kernel(self.ops.in, self.ops.out);
    };
  }
  if (device != Device::cpu) {
    ws->constants.resize(g.nodes.size());
    for (std::size_t k = 0; k < g.nodes.size(); ++k) {
      if (!g.nodes[k]->is<op::Const>()) continue;
      const TensorBase& c = g.nodes[k]->params<op::Const>().value;
      if (c.numel() > 1) ws->constants[k] = xgrad::detail::copy_to(c, device);
    }
  }
  if (!m_plan) return ws;
  const std::size_t bytes = std::max<std::size_t>(m_plan->arena_bytes, MemoryPlan::kAlignment);
  ws->arena = std::make_unique<Arena>(bytes, device);
  if (m_options.poison_freed_buffers)
    kernels::fill(device, ws->arena->data(), static_cast<std::int64_t>(bytes), std::byte{0xFF});
  for (const auto& v : g.values) {
    const std::ptrdiff_t offset = m_plan->offset[static_cast<std::size_t>(v->id)];
    if (offset == MemoryPlan::kNotPlanned) continue;
    auto storage = std::make_shared<Storage>(Storage::Borrowed{}, ws->arena->data() + offset,
                                             static_cast<std::size_t>(v->shape.numel()) * dtype_size(v->dtype), device);
    ws->planned[static_cast<std::size_t>(v->id)] =
        TensorBase(std::make_shared<TensorImpl>(v->shape, v->dtype, std::move(storage)));
  }
  for (const auto& [value, input] : m_written_into) {
    const ir::Value& v = *g.values[value];
    ws->in_arena.push_back(ws->planned[value]);
    ws->into_input.emplace_back(std::make_shared<TensorImpl>(v.shape, v.dtype, std::shared_ptr<Storage>()));
  }
  // A view of a planned buffer gets its handle now too, so that a warm call makes none.
  for (const auto& node : g.nodes) {
    if (!node->traits.view) continue;
    const TensorBase& base = ws->planned[static_cast<std::size_t>(node->inputs[0]->id)];
    const ir::Value& v = *node->outputs[0];
    if (base.defined())
      ws->planned[static_cast<std::size_t>(v.id)] =
          TensorBase(std::make_shared<TensorImpl>(v.shape, v.dtype, base.impl()->storage));
  }
  return ws;
}

XGRAD_API void Program::move_to_device(const Workspace& ws, Workspace::Operands& ops, const ir::Node& node,
                                       std::size_t j) {
  const Device device = ws.device;
  TensorBase& t = ops.out[j];
  if (t.device() == device || t.numel() == 1) return;
  const TensorBase& planned = ws.planned[static_cast<std::size_t>(node.outputs[j]->id)];
  if (!planned.defined()) {
    t = xgrad::detail::copy_to(t, device);
    return;
  }
  xgrad::detail::copy_bytes(planned.impl()->storage->data(), device, t.impl()->storage->data(), Device::cpu,
                            planned.impl()->storage->bytes());
  t = planned;
}

XGRAD_API void Program::check_output(const ir::Node& node, const ir::Value& v, const TensorBase& t) {
  if (!t.defined() || t.dtype() != v.dtype || !(t.shape() == v.shape))
    throw std::logic_error(xgrad::detail::concat("xgrad internal error: ", node.op(), " (", node.loc.str(), ") made ",
                                                 t.defined() ? ir::type_str(t.dtype(), t.shape()) : "nothing",
                                                 " where the graph expects ", ir::type_str(v.dtype, v.shape)));
}

XGRAD_API void Program::keep_in_plan(const Workspace& ws, const ir::Value& v, TensorBase& t) {
  const TensorBase& planned = ws.planned[static_cast<std::size_t>(v.id)];
  if (!planned.defined() || t.impl()->storage == planned.impl()->storage || !t.impl()->storage->borrowed()) return;
  xgrad::detail::copy_bytes(planned.impl()->storage->data(), ws.device, t.impl()->storage->data(), t.device(),
                            planned.impl()->storage->bytes());
  t = planned;
}

XGRAD_API void Program::apply_effects(std::span<const TensorBase> inputs, Workspace& ws) const {
  const auto& effects = m_graph->effects;
  auto& sources = ws.effect_sources;
  sources.clear();
  for (const auto& e : effects) {
    TensorBase src = ws.env[static_cast<std::size_t>(e.value->id)];
    for (const auto& other : effects)
      if (&other != &e && inputs[other.input].impl()->storage == src.impl()->storage) {
        src = xgrad::detail::copy_to(src, src.device());
        break;
      }
    sources.push_back(src);
  }
  for (std::size_t i = 0; i < effects.size(); ++i) write_into(inputs[effects[i].input], sources[i]);
  sources.clear();
}

XGRAD_API void Program::bind_written_into(std::span<const TensorBase> inputs, Workspace& ws) const {
  for (std::size_t d = 0; d < m_written_into.size(); ++d) {
    const auto [value, input] = m_written_into[d];
    const std::shared_ptr<Storage>& target = inputs[input].impl()->storage;
    bool alone = inputs[input].device() == ws.device;
    for (std::size_t i = 0; alone && i < inputs.size(); ++i) alone = i == input || inputs[i].impl()->storage != target;
    if (alone) ws.into_input[d].impl()->storage = target;
    ws.planned[value] = alone ? ws.into_input[d] : ws.in_arena[d];
  }
}

XGRAD_API void Program::write_into(const TensorBase& dst, const TensorBase& src) {
  Storage& to = *dst.impl()->storage;
  const Storage& from = *src.impl()->storage;
  const std::size_t bytes = static_cast<std::size_t>(dst.numel()) * dtype_size(dst.dtype());
  if (&to != &from) {  // else the node wrote the value into the input itself
    if (to.device() == Device::cpu && from.device() == Device::cpu)
      cpu::copy_bytes(to.data(), from.data(), bytes);
    else
      xgrad::detail::copy_bytes(to.data(), to.device(), from.data(), from.device(), bytes);
  }
  to.bump_version();
}

}  // namespace xgrad::backend
