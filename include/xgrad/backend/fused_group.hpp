// The kernel of a Fused node, built by the backend from the group the fuse pass made
// (passes/fuse.hpp partitions the graph; this decides how a group runs on each device): on the
// cpu the block kernel (backend/cpu/fused.hpp), and with XGRAD_WITH_THRUST on Device::thrust
// one functor over the group (backend/thrust/fused.hpp) after its anchor, or the body node by
// node where the functor cannot hold the group's values (a row group's reductions).
#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "xgrad/backend/cpu/fused.hpp"
#if defined(XGRAD_WITH_THRUST)
#include "xgrad/backend/thrust/fused.hpp"
#endif
#include "xgrad/ir/graph.hpp"

namespace xgrad::backend {

/// One fused group as the pass hands it over.
struct FusedGroupSpec {
  Shape shape;                                       // every member's output shape
  std::vector<std::pair<DType, Shape>> input_types;  // the group's input slots (an anchor's result last)
  std::vector<cpu::FusedKernel::Step> steps;         // the members in order, before merging
  std::vector<int> device_ops;                       // each step's place in the op list; -1: a gathered broadcast
  std::int64_t row_length = 0;                       // a row group's last axis (its steps then are not the members)
  std::vector<int> output_slots;                     // the slots the node writes out
  ir::Kernel anchor_kernel;                          // the op the group runs as the epilogue of, if any
  cpu::FusedKernel::Anchor epilogue_of{};            // its epilogue form and input count
  std::shared_ptr<const ir::Graph> body;             // the members as a subgraph
};

namespace detail {
/// Runs a fused node's body node by node, each through its own kernel.
inline void run_body(const ir::Graph& body, std::span<const TensorBase> in, std::span<TensorBase> out) {
  std::vector<TensorBase> env(body.values.size()), node_in, node_out;
  for (std::size_t i = 0; i < body.inputs.size(); ++i) env[static_cast<std::size_t>(body.inputs[i]->id)] = in[i];
  for (const auto& node : body.nodes) {
    node_in.clear();
    for (const ir::Value* v : node->inputs) node_in.push_back(env[static_cast<std::size_t>(v->id)]);
    node_out.assign(1, TensorBase());
    node->kernel(node_in, node_out);
    env[static_cast<std::size_t>(node->outputs[0]->id)] = std::move(node_out[0]);
  }
  for (std::size_t j = 0; j < body.outputs.size(); ++j) out[j] = env[static_cast<std::size_t>(body.outputs[j]->id)];
}
}  // namespace detail

/// Merges cheap neighbours into unary steps (cpu::FusedKernel::merge_neighbours, returning the
/// pairs as "Mul+Tanh") and returns the node's kernel; `spec.steps` are left merged, as the
/// cpu kernel runs them. Ops: the tuple of op structs `spec.device_ops` counts in (op::Fusible;
/// a parameter, so that the backend needs nothing of ops/).
template <class Ops> ir::Kernel fused_kernel(FusedGroupSpec& spec, std::vector<std::string>& merged_pairs) {
#if defined(XGRAD_WITH_THRUST)
  using DeviceGroup = thrust_backend::FusedGroup<Ops>;
  std::optional<DeviceGroup> made;
  if (spec.row_length == 0) {
    std::vector<typename DeviceGroup::Step> device_steps;
    for (std::size_t k = 0; k < spec.steps.size(); ++k)
      device_steps.push_back({spec.device_ops[k], spec.steps[k].args, spec.steps[k].dtype, spec.steps[k].result});
    made = DeviceGroup::make(spec.shape, spec.input_types, device_steps, spec.output_slots);
  }
  auto device_group = std::make_shared<const std::optional<DeviceGroup>>(std::move(made));
#endif
  merged_pairs = cpu::FusedKernel::merge_neighbours(spec.steps, spec.output_slots);
  auto kernel = std::make_shared<const cpu::FusedKernel>(spec.shape, spec.input_types, spec.steps, spec.output_slots,
                                                         spec.epilogue_of, spec.row_length);
  ir::Kernel on_cpu = [kernel](std::span<const TensorBase> in, std::span<TensorBase> out) { (*kernel)(in, out); };
#if defined(XGRAD_WITH_THRUST)
  // Device::thrust: the anchor (as its own node), then the group as one functor.
  return [on_cpu, device_group, anchor_kernel = spec.anchor_kernel, anchor_inputs = spec.epilogue_of.num_inputs,
          into = spec.epilogue_of.into, body = spec.body](std::span<const TensorBase> in, std::span<TensorBase> out) {
    if (std::none_of(in.begin(), in.end(), [](const TensorBase& t) { return t.device() != Device::cpu; }))
      return on_cpu(in, out);
    if (!*device_group) return detail::run_body(*body, in, out);
    if (!anchor_kernel) return (**device_group)(in, out);
    std::vector<TensorBase> group_in(in.begin(), in.end());
    // The anchor's result: its own last output, or the group output it is written into (the
    // group's functor reads and writes each element in one place).
    const auto result = into >= 0 ? out.subspan(static_cast<std::size_t>(into), 1) : out.last(1);
    anchor_kernel(in.first(static_cast<std::size_t>(anchor_inputs)), result);
    group_in.push_back(result.front());
    (**device_group)(group_in, into >= 0 ? out : out.first(out.size() - 1));
  };
#else
  return on_cpu;
#endif
}

}  // namespace xgrad::backend
