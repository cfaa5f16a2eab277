// Definitions of passes/fuse.hpp: included by it when header-only, compiled once into the
// library (src/passes.cpp) otherwise.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <queue>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "xgrad/backend/fused_group.hpp"
#include "xgrad/ops/elementwise-inl.hpp"
#include "xgrad/ops/manipulation-inl.hpp"
#include "xgrad/ops/nn-inl.hpp"
#include "xgrad/ops/reduce-inl.hpp"
#include "xgrad/passes/fuse.hpp"
#include "xgrad/passes/rewrite.hpp"

namespace xgrad::passes {

namespace detail {

/// The place of node's op in the type list Ops (a std::tuple), or -1.
template <class Ops> int index_in(const ir::Node& node) {
  return [&]<class... Op>(std::tuple<Op...>*) {
    int i = 0, found = -1;
    (void)((node.is<Op>() ? (found = i, true) : (++i, false)) || ...);
    return found;
  }(static_cast<Ops*>(nullptr));
}

inline bool fusible(const ir::Node& node) {
  return node.traits.block && !node.has_effect && node.subgraphs.empty() && node.outputs.size() == 1;
}

/// A copy of `node` for a fused node's body, reading `inputs`.
inline std::unique_ptr<ir::Node> body_copy(const ir::Node& node, std::vector<ir::Value*> inputs) {
  auto copy = std::make_unique<ir::Node>();
  copy->primitive = node.primitive;
  copy->loc = node.loc;
  copy->scope = node.scope;
  copy->traits = node.traits;
  copy->kernel = node.kernel;
  copy->inputs = std::move(inputs);
  return copy;
}

/// `shape` with its last axis 1: the shape of one value per row.
inline Shape rows_of(const Shape& shape) {
  Shape rows = shape;
  if (rows.ndim() > 0) rows[rows.ndim() - 1] = 1;
  return rows;
}

/// The longest rows a row group takes: a block is at least one row, and its values stay in
/// cache.
inline constexpr std::int64_t k_max_row_length = 8192;

/// True when a group over `shape` may run as a row group (passes/fuse.hpp).
inline bool row_group_shape(const Shape& shape) {
  return shape.ndim() > 0 && shape[shape.ndim() - 1] >= 2 && shape[shape.ndim() - 1] <= k_max_row_length;
}

/// Reducer's reduction of each row: the eager kernel itself (a block's few rows run inline).
template <class Reducer, class T> void reduce_rows(const void* in, void* out, std::int64_t rows, std::int64_t length) {
  cpu::reduce<Reducer>(static_cast<const T*>(in), static_cast<T*>(out), rows, length, 1);
}

/// The row kernel of `node` when it is a sum, max or min of a float tensor over its last axis
/// alone, in rows a row group takes; null otherwise.
inline RowsKernel row_reduction(const ir::Node& node) {
  if (node.has_effect || node.inputs.size() != 1 || node.outputs.size() != 1) return nullptr;
  const ir::Value& x = *node.inputs[0];
  const ir::Value& y = *node.outputs[0];
  if (!row_group_shape(x.shape) || !(y.shape == rows_of(x.shape)) || x.dtype != y.dtype) return nullptr;
  auto of = [&]<class Reducer>(std::type_identity<Reducer>) -> RowsKernel {
    if (x.dtype == DType::float32) return &reduce_rows<Reducer, float>;
    if (x.dtype == DType::float64) return &reduce_rows<Reducer, double>;
    return nullptr;
  };
  if (node.is<op::SumTo>()) return of(std::type_identity<op::SumTo::reducer>{});
  if (node.is<op::ReduceMax>()) return of(std::type_identity<op::ReduceMax::reducer>{});
  if (node.is<op::ReduceMin>()) return of(std::type_identity<op::ReduceMin::reducer>{});
  return nullptr;
}

/// The Fused node standing for `members` (indices into g.nodes, in order) and, when given,
/// the `anchor` node whose output only they read: the group then runs as the anchor's
/// epilogue. `read_outside` holds the values read by other nodes, returned or written by an
/// effect; the group writes those it makes, but not those of `recomputed`, members another
/// group makes and writes (recompute_in_readers). The group runs over `shape`: a row group
/// when some members reduce its rows or hold values per row.
inline std::unique_ptr<ir::Node> make_fused(const ir::Graph& g, const std::vector<std::size_t>& members,
                                            const Shape& shape, const ir::Node* anchor,
                                            const std::unordered_set<const ir::Value*>& read_outside,
                                            const std::unordered_set<std::size_t>& recomputed, int number) {
  auto body = std::make_shared<ir::Graph>();
  body->name = g.name + ".fused" + std::to_string(number);
  std::unordered_set<const ir::Value*> made;
  for (std::size_t i : members) made.insert(g.nodes[i]->outputs[0]);
  if (anchor) made.insert(anchor->outputs[0]);
  std::unordered_map<const ir::Value*, ir::Value*> inner;
  auto fused = std::make_unique<ir::Node>();
  std::vector<std::pair<DType, Shape>> input_types;
  auto add_input = [&](ir::Value* v) {
    if (made.count(v) || inner.count(v)) return;
    inner[v] = body->new_value(v->dtype, v->shape, nullptr);
    body->inputs.push_back(inner[v]);
    fused->inputs.push_back(v);
    input_types.emplace_back(v->dtype, v->shape);
  };
  // An anchor's inputs come first, then the group's; the anchor's result is the last slot.
  if (anchor)
    for (ir::Value* v : anchor->inputs) add_input(v);
  const int anchor_inputs = static_cast<int>(body->inputs.size());
  for (std::size_t i : members)
    for (ir::Value* v : g.nodes[i]->inputs) add_input(v);
  body->num_args = body->inputs.size();
  std::string ops;
  if (anchor) {
    std::vector<ir::Value*> reads;
    for (ir::Value* v : anchor->inputs) reads.push_back(inner.at(v));
    auto copy = body_copy(*anchor, std::move(reads));
    ir::Value* result = anchor->outputs[0];
    inner[result] = body->new_value(result->dtype, result->shape, copy.get());
    copy->outputs.push_back(inner[result]);
    input_types.emplace_back(result->dtype, result->shape);
    ops = anchor->op();
    body->append(std::move(copy));
  }
  backend::FusedGroupSpec spec;
  spec.shape = shape;
  const Shape rows = rows_of(shape);
  const bool row_group = std::any_of(members.begin(), members.end(),
                                     [&](std::size_t i) { return !(g.nodes[i]->outputs[0]->shape == shape); });
  if (row_group) spec.row_length = shape[shape.ndim() - 1];
  std::vector<cpu::FusedKernel::Step>& steps = spec.steps;
  std::vector<int>& output_slots = spec.output_slots;
  // In a row group, an op on every element reads a value per row repeated along the row: one
  // step per such value, numbered after the body's values once they are all made.
  std::unordered_map<int, int> repeated;  // value per row -> its repetition's placeholder (-2, -3, ...)
  for (std::size_t i : members) {
    const ir::Node& node = *g.nodes[i];
    auto copy = body_copy(node, {});
    const RowsKernel reduce = row_group ? row_reduction(node) : nullptr;
    cpu::FusedKernel::Step step{reduce ? nullptr : node.traits.block,
                                {},
                                node.outputs[0]->dtype,
                                -1,
                                node.op(),
                                reduce ? nullptr : node.traits.merged,
                                reduce ? -1 : index_in<op::MergeFeeders>(node),
                                reduce ? -1 : index_in<op::MergeConsumers>(node),
                                reduce,
                                false,
                                !(node.outputs[0]->shape == shape)};
    for (ir::Value* v : node.inputs) {
      copy->inputs.push_back(inner.at(v));
      int arg = inner.at(v)->id;
      if (row_group && !step.per_row && !reduce && v->shape == rows) {
        auto [it, fresh] = repeated.try_emplace(arg, -2 - static_cast<int>(repeated.size()));
        if (fresh) {
          steps.push_back({nullptr, {arg}, v->dtype, it->second, "Repeat"});
          steps.back().repeat_rows = true;
        }
        arg = it->second;
      }
      step.args.push_back(arg);
    }
    ir::Value* out = body->new_value(node.outputs[0]->dtype, node.outputs[0]->shape, copy.get());
    copy->outputs.push_back(out);
    step.result = out->id;
    inner[node.outputs[0]] = out;
    if (!recomputed.count(i) && read_outside.count(node.outputs[0])) {
      fused->outputs.push_back(node.outputs[0]);
      body->outputs.push_back(out);
      output_slots.push_back(out->id);
    }
    ops += (ops.empty() ? "" : ", ") + std::string(node.op());
    // A broadcast input is gathered per block; every other member is an op of op::Fusible
    // (with_block's static_assert).
    spec.device_ops.push_back(node.is<op::BroadcastTo>() ? -1 : index_in<op::Fusible>(node));
    steps.push_back(std::move(step));
    body->append(std::move(copy));
  }
  const int first_repeat = static_cast<int>(body->values.size());
  for (auto& step : steps) {
    for (int& a : step.args)
      if (a <= -2) a = first_repeat - 2 - a;
    if (step.result <= -2) step.result = first_repeat - 2 - step.result;
  }
  if (anchor) {
    spec.anchor_kernel = anchor->kernel;
    // Only the group reads the anchor's result (fuse takes in no other anchor), so it may be
    // written into one of the group's outputs: no buffer of its own (a convolution's or a
    // product's whole result, written and read back). Not into an effect's value: the memory
    // plan may write that straight into the tensor it updates, which the group reads first (an
    // optimizer's update of a weight from its gradient).
    std::unordered_set<const ir::Value*> effect_values;
    for (const auto& e : g.effects) effect_values.insert(e.value);
    std::vector<int> may_take;
    for (std::size_t j = 0; j < output_slots.size(); ++j)
      if (!effect_values.count(fused->outputs[j])) may_take.push_back(output_slots[j]);
    // Another group recomputing from the product reads it: then it keeps its own buffer.
    const int pick = read_outside.count(anchor->outputs[0])
                         ? -1
                         : cpu::FusedKernel::anchor_output_in_place(steps, may_take, inner.at(anchor->outputs[0])->id,
                                                                    dtype_size(anchor->outputs[0]->dtype));
    const int into = pick < 0 ? -1
                              : static_cast<int>(std::find(output_slots.begin(), output_slots.end(),
                                                           may_take[static_cast<std::size_t>(pick)]) -
                                                 output_slots.begin());
    spec.epilogue_of = {anchor->epilogue_kernel, anchor_inputs, into};
  }
  spec.input_types = input_types;
  spec.body = body;
  std::vector<std::string> merged_pairs;
  fused->kernel = backend::fused_kernel<op::Fusible>(spec, merged_pairs);
  // In place: output j may take input i's buffer when i has the output's shape and element
  // size and no step after the one writing j reads i. Not an anchor's input: the anchor may
  // still be reading it while the group writes its first parts.
  // Decided on the steps as they run, after merging (a merged step reads its pair's inputs).
  const int num_inputs = static_cast<int>(input_types.size());
  const int num_node_inputs = static_cast<int>(body->inputs.size());
  std::vector<int> last_read(static_cast<std::size_t>(num_inputs), -1);
  for (std::size_t k = 0; k < steps.size(); ++k)
    for (int a : steps[k].args)
      if (a < num_inputs) last_read[static_cast<std::size_t>(a)] = static_cast<int>(k);
  for (std::size_t j = 0; j < output_slots.size(); ++j) {
    const int slot = output_slots[j];
    const auto written = static_cast<std::size_t>(
        std::find_if(steps.begin(), steps.end(), [&](const auto& step) { return step.result == slot; }) -
        steps.begin());
    std::vector<int> candidates;
    for (int i = anchor_inputs; i < num_node_inputs; ++i) {
      const ir::Value& in = *body->inputs[static_cast<std::size_t>(i)];
      if (in.shape == fused->outputs[j]->shape && dtype_size(in.dtype) == dtype_size(steps[written].dtype) &&
          last_read[static_cast<std::size_t>(i)] <= static_cast<int>(written))
        candidates.push_back(i);
    }
    fused->in_place.push_back(std::move(candidates));
  }
  // The anchor writes the output it is written into before the group reads its inputs.
  if (anchor && spec.epilogue_of.into >= 0) fused->in_place[static_cast<std::size_t>(spec.epilogue_of.into)].clear();
  if (anchor && spec.epilogue_of.into < 0) {
    // The anchor's result is the node's last output: the buffer the anchor writes into.
    fused->outputs.push_back(anchor->outputs[0]);
    body->outputs.push_back(inner.at(anchor->outputs[0]));
    fused->in_place.emplace_back();
  }
  const ir::Node& last = *g.nodes[members.back()];
  fused->loc = last.loc;
  fused->scope = last.scope;
  fused->traits.elementwise = !anchor && !row_group;
  std::string pairs;
  for (const std::string& pair : merged_pairs) pairs += (pairs.empty() ? "" : ", ") + pair;
  fused->primitive = ir::make_primitive(op::Fused{body->name, ops, pairs});
  fused->subgraphs.push_back(std::move(body));
  for (ir::Value* v : fused->outputs) v->producer = fused.get();
  return fused;
}

/// run(std::type_identity<T>{}) for T the floating-point type of `dtype` (double or float): the
/// kernels of the nodes this pass makes.
template <class Run> void with_float_type(DType dtype, Run&& run) {
  if (dtype == DType::float64)
    run(std::type_identity<double>{});
  else
    run(std::type_identity<float>{});
}

/// The kernel of a node making max pooling's values and argmax (MaxPoolWithArgmax,
/// Conv2DReLUMaxPool): `def` run on the node's float inputs, each output into its planned buffer.
template <class Def> ir::Kernel max_pool_with_argmax_kernel(const Def& def, const Shape& shape) {
  return [def, shape](std::span<const TensorBase> in, std::span<TensorBase> out) {
    const Device device = in[0].device();
    auto run = [&]<class T>(std::type_identity<T>) {
      Tensor<T> values = xgrad::detail::output<T>(out[0], shape, device);
      Tensor<std::int32_t> idx = xgrad::detail::output<std::int32_t>(out[1], shape, device);
      if constexpr (std::is_same_v<Def, op::Conv2DReLUMaxPool>)
        def.run(device, Tensor<T>(in[0]), Tensor<T>(in[1]), in.size() > 2 ? Tensor<T>(in[2]).data() : nullptr, values,
                idx);
      else
        def.run(device, Tensor<T>(in[0]), values, idx);
      out[0] = values;
      out[1] = idx;
    };
    with_float_type(in[0].dtype(), run);
  };
}

/// When every reader of the argmax of `pool` (a MaxPoolWithArgmax) is a MaxPoolPut(argmax, s)
/// with s = where(values > 0, u, 0) read only there (ReLU's gradient moved through the pooling,
/// passes/simplify.hpp): the argmax drops the windows whose maximum is not above 0 and each put
/// reads u itself. Exact: such a window's put added only +0s. The Selects, and the Greaters no
/// one else reads, are erased. True when it rewrote.
inline bool mask_in_argmax(ir::Graph& g, ir::Node& pool) {
  ir::Value* values = pool.outputs[0];
  ir::Value* argmax = pool.outputs[1];
  if (std::count(g.outputs.begin(), g.outputs.end(), argmax)) return false;
  std::vector<std::pair<ir::Node*, ir::Node*>> puts;  // (put, its Select)
  for (const auto& node : g.nodes) {
    if (std::find(node->inputs.begin(), node->inputs.end(), argmax) == node->inputs.end()) continue;
    if (!node->is<op::MaxPoolPut>() || node->inputs[0] != argmax) return false;
    ir::Node* select = node->inputs[1]->producer;
    // The gradient itself of the put's shape (not a broadcast the Select stretched).
    if (!select || !select->is<op::Where>() || !is_positive_zero(select->inputs[2]) ||
        readers(g, select->outputs[0]) != 1 || !(select->inputs[1]->shape == select->outputs[0]->shape) ||
        select->inputs[1]->dtype != select->outputs[0]->dtype)
      return false;
    const ir::Node* greater = select->inputs[0]->producer;
    if (!greater || !greater->is<op::Greater>() || greater->inputs[0] != values ||
        !is_positive_zero(greater->inputs[1]))
      return false;
    puts.emplace_back(node.get(), select);
  }
  if (puts.empty()) return false;
  op::MaxPoolWithArgmax def = pool.params<op::MaxPoolWithArgmax>();
  def.drop_nonpositive = true;
  pool.primitive = ir::make_primitive(def);
  pool.kernel = max_pool_with_argmax_kernel(def, values->shape);
  std::unordered_set<const ir::Node*> dead;
  for (auto [put, select] : puts) {
    put->inputs[1] = select->inputs[1];
    dead.insert(select);
  }
  for (auto [put, select] : puts) {
    const ir::Value* mask = select->inputs[0];
    std::size_t live_readers = 0;
    for (const auto& node : g.nodes)
      if (!dead.count(node.get())) live_readers += std::count(node->inputs.begin(), node->inputs.end(), mask);
    if (live_readers == 0 && !std::count(g.outputs.begin(), g.outputs.end(), mask)) dead.insert(mask->producer);
  }
  erase_nodes(g, dead);
  return true;
}

/// MaxPoolTake(x, a) with a = MaxPoolArgmax(x) -> one MaxPoolWithArgmax(x) making both, in
/// the argmax's place: the take's gather of the maxima is dropped, as the argmax pass has them
/// in registers. True when it paired any.
inline bool pair_max_pool(ir::Graph& g) {
  bool changed = false;
  for (std::size_t k = 0; k < g.nodes.size(); ++k) {
    const ir::Node& take = *g.nodes[k];
    if (!take.is<op::MaxPoolTake>()) continue;
    ir::Node* argmax = take.inputs[1]->producer;
    if (!argmax || !argmax->is<op::MaxPoolArgmax>() || argmax->inputs[0] != take.inputs[0] ||
        !(argmax->params<op::MaxPoolArgmax>().geometry == take.params<op::MaxPoolTake>().geometry))
      continue;
    const op::MaxPoolWithArgmax def{argmax->params<op::MaxPoolArgmax>().geometry};
    const Shape shape = take.outputs[0]->shape;
    auto paired = std::make_unique<ir::Node>();
    paired->primitive = ir::make_primitive(def);
    paired->loc = take.loc;
    paired->scope = take.scope;
    paired->inputs = {take.inputs[0]};
    paired->outputs = {take.outputs[0], argmax->outputs[0]};
    paired->kernel = max_pool_with_argmax_kernel(def, shape);
    for (ir::Value* v : paired->outputs) v->producer = paired.get();
    const auto at =
        std::find_if(g.nodes.begin(), g.nodes.end(), [&](const auto& node) { return node.get() == argmax; });
    ir::Node& node = *paired;
    g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(k));  // the take, after the argmax
    *at = std::move(paired);
    mask_in_argmax(g, node);
    k = position_of(g, &node);
    changed = true;
  }
  return changed;
}

/// AttentionGrad(q, k, v, out, g) with out = Attention(q, k, v) of the same geometry ->
/// AttentionGradWithLse(q, k, v, out, g, lse), the attention becoming AttentionWithLse, which
/// makes out and lse: the gradient reads each query's log-denominator instead of working it
/// out again (a product of each query block with every key block it sees, and their
/// exponentials). Exact: the forward makes those values with the same loop. True when it
/// paired any.
inline bool pair_attention(ir::Graph& g) {
  bool changed = false;
  std::unordered_map<const ir::Node*, ir::Value*> lse_of;
  for (auto& node : g.nodes) {
    if (!node->is<op::AttentionGrad>()) continue;
    ir::Node* forward = node->inputs[3]->producer;
    const cpu::AttentionGeometry geometry = node->params<op::AttentionGrad>().geometry;
    if (!forward ||
        !std::equal(node->inputs.begin(), node->inputs.begin() + 3, forward->inputs.begin(), forward->inputs.end()))
      continue;
    ir::Value*& lse = lse_of[forward];
    if (!lse) {
      if (!forward->is<op::Attention>() || !(forward->params<op::Attention>().geometry == geometry)) continue;
      const ir::Value& out = *forward->outputs[0];
      const Shape lse_shape{geometry.batch, geometry.tq};
      lse = g.new_value(out.dtype, lse_shape, forward);
      forward->outputs.push_back(lse);
      const op::AttentionWithLse def{geometry};
      forward->primitive = ir::make_primitive(def);
      forward->kernel = [def, out_shape = out.shape, lse_shape](std::span<const TensorBase> in,
                                                                std::span<TensorBase> outs) {
        const Device device = in[0].device();
        auto run = [&]<class T>(std::type_identity<T>) {
          Tensor<T> y = xgrad::detail::output<T>(outs[0], out_shape, device);
          Tensor<T> l = xgrad::detail::output<T>(outs[1], lse_shape, device);
          def.run(device, Tensor<T>(in[0]), Tensor<T>(in[1]), Tensor<T>(in[2]), y, l);
          outs[0] = y;
          outs[1] = l;
        };
        with_float_type(in[0].dtype(), run);
      };
    } else if (!(forward->params<op::AttentionWithLse>().geometry == geometry)) {
      continue;
    }
    const op::AttentionGradWithLse def{geometry};
    node->inputs.push_back(lse);
    node->primitive = ir::make_primitive(def);
    node->kernel = [def, shape = node->outputs[0]->shape](std::span<const TensorBase> in, std::span<TensorBase> out) {
      const Device device = in[0].device();
      auto run = [&]<class T>(std::type_identity<T>) {
        Tensor<T> grads = xgrad::detail::output<T>(out[0], shape, device);
        def.run(device, Tensor<T>(in[0]), Tensor<T>(in[1]), Tensor<T>(in[2]), Tensor<T>(in[3]), Tensor<T>(in[4]),
                Tensor<T>(in[5]), grads);
        out[0] = grads;
      };
      with_float_type(in[0].dtype(), run);
    };
    changed = true;
  }
  return changed;
}

/// A pooled convolution gradient's kernel: `def` run on the node's inputs into its planned buffer.
template <class Def> ir::Kernel through_max_pool_kernel(const Def& def, const Shape& shape) {
  return [def, shape](std::span<const TensorBase> in, std::span<TensorBase> out) {
    const Device device = in[0].device();
    auto run = [&]<class T>(std::type_identity<T>) {
      Tensor<T> result = xgrad::detail::output<T>(out[0], shape, device);
      if constexpr (std::is_same_v<Def, op::Conv2DInputGradPooled>)
        def.run(device, Tensor<std::int32_t>(in[0]), Tensor<T>(in[1]), Tensor<T>(in[2]), result);
      else
        def.run(device, Tensor<T>(in[0]), Tensor<std::int32_t>(in[1]), Tensor<T>(in[2]), result);
      out[0] = result;
    };
    with_float_type(in[2].dtype(), run);
  };
}

/// Conv2DInputGrad(MaxPoolPut(idx, gp), w) -> Conv2DInputGradPooled(idx, gp, w) and
/// Conv2DWeightGrad(x, MaxPoolPut(idx, gp)) -> Conv2DWeightGradPooled(x, idx, gp), for the
/// geometries the sparse kernels serve: a max pool's gradient is zero but at each window's
/// argmax, so a convolution's gradients through it sum over the pooled elements only (a quarter
/// of the work for 2 x 2 windows, and no put). A put left without readers goes. Not exact (the
/// sums run in another order), so not under strict. True when it rewrote.
inline bool conv_gradients_through_max_pool(ir::Graph& g) {
  std::unordered_set<const ir::Node*> puts;
  for (auto& node : g.nodes) {
    const bool input = node->is<op::Conv2DInputGrad>();
    if (!input && !node->is<op::Conv2DWeightGrad>()) continue;
    const cpu::Conv2dGeometry conv =
        input ? node->params<op::Conv2DInputGrad>().geometry : node->params<op::Conv2DWeightGrad>().geometry;
    const ir::Node* put = node->inputs[input ? 0 : 1]->producer;
    if (!put || !put->is<op::MaxPoolPut>() || !cpu::detail::conv_pooled_suits(conv)) continue;
    const cpu::Pool2dGeometry pool = put->params<op::MaxPoolPut>().geometry;
    ir::Value* idx = put->inputs[0];
    ir::Value* gp = put->inputs[1];
    const Shape& shape = node->outputs[0]->shape;
    node->traits = {};
    if (input) {
      const op::Conv2DInputGradPooled def{{conv, pool}};
      node->inputs = {idx, gp, node->inputs[1]};
      node->primitive = ir::make_primitive(def);
      node->kernel = through_max_pool_kernel(def, shape);
    } else {
      const op::Conv2DWeightGradPooled def{{conv, pool}};
      node->inputs = {node->inputs[0], idx, gp};
      node->primitive = ir::make_primitive(def);
      node->kernel = through_max_pool_kernel(def, shape);
    }
    puts.insert(put);
  }
  std::unordered_set<const ir::Node*> dead;
  for (const ir::Node* put : puts)
    if (readers(g, put->outputs[0]) == 0) dead.insert(put);
  erase_nodes(g, dead);
  return !puts.empty();
}

/// MaxPoolWithArgmax(ReLU(Conv2D(x, w) [+ b])) -> Conv2DReLUMaxPool(x, w [, b]), making the
/// pool's two outputs, with b a bias of the convolution's channels ([c, 1, 1], as bias_add adds
/// it), where the argmax carries the ReLU's mask (drop_nonpositive: a train step) or no one reads
/// it (inference), no one else reads the convolution's, the add's or the ReLU's output, and the
/// CPU kernel pools each image in cache (cpu::detail::conv_relu_max_pool_suits): the full-size
/// output is neither written nor read again, and the ReLU runs on the maxima. Exact (the same
/// bits). True when it rewrote.
inline bool conv_relu_max_pool(ir::Graph& g) {
  std::unordered_set<const ir::Node*> dead;
  // The producer of v when one node alone reads v.
  auto only_reader = [&](const ir::Value* v) { return readers(g, v) == 1 ? v->producer : nullptr; };
  for (auto& node : g.nodes) {
    if (!node->is<op::MaxPoolWithArgmax>() ||
        !(node->params<op::MaxPoolWithArgmax>().drop_nonpositive || readers(g, node->outputs[1]) == 0))
      continue;
    const ir::Node* relu = only_reader(node->inputs[0]);
    if (!relu || !relu->is<op::Relu>()) continue;
    const ir::Node* add = nullptr;
    const ir::Node* conv = only_reader(relu->inputs[0]);
    ir::Value* bias = nullptr;
    if (conv && conv->is<op::Add>()) {
      add = conv;
      for (int side : {0, 1}) {
        const ir::Node* c = only_reader(add->inputs[static_cast<std::size_t>(side)]);
        ir::Value* b = add->inputs[static_cast<std::size_t>(1 - side)];
        if (c && c->is<op::Conv2D>() && b->dtype == c->outputs[0]->dtype &&
            b->shape == Shape{c->outputs[0]->shape[1], 1, 1}) {
          conv = c;
          bias = b;
          break;
        }
      }
      if (!bias) continue;
    }
    if (!conv || !conv->is<op::Conv2D>()) continue;
    const op::Conv2DReLUMaxPool def{
        {conv->params<op::Conv2D>().geometry, node->params<op::MaxPoolWithArgmax>().geometry}};
    if (!cpu::detail::conv_relu_max_pool_suits(def.conv, def.pool)) continue;
    node->inputs = conv->inputs;
    if (bias) node->inputs.push_back(bias);
    node->primitive = ir::make_primitive(def);
    node->kernel = max_pool_with_argmax_kernel(def, node->outputs[0]->shape);
    dead.insert({relu, conv});
    if (add) dead.insert(add);
  }
  erase_nodes(g, dead);
  return !dead.empty();
}

/// Ops of another group a group recomputes, at most for one value it reads: a few cheap steps
/// cost less than the writes and reads they save.
inline constexpr std::size_t k_max_recomputed_ops = 8;

/// Rematerialization: when a fused group B reads values that another group F makes of B's
/// shape from one value d through a few of F's ops (GELU's backward reads x / 2,
/// erf(x / sqrt 2) and exp(-x^2 / 2), all made from x), B recomputes them from d where that
/// moves fewer bytes: F writes d instead of the values only B read, and B reads d instead of
/// them. Exact: each op runs the same block kernel in B as it ran in F.
///
/// `home`: each node's fused group, or -1; `members`: each group's nodes, to which the ops a
/// group recomputes are added (and listed in its `recomputed`); a node no one reads any more
/// leaves its group (home -2). `written`, the values read outside the group making them (and
/// those returned or written by an effect), is brought up to date.
inline void recompute_in_readers(const ir::Graph& g, const std::unordered_map<const ir::Node*, std::size_t>& index,
                                 std::vector<int>& home, std::vector<std::vector<std::size_t>>& members,
                                 const std::vector<Shape>& over, const std::vector<const ir::Node*>& anchor,
                                 const std::vector<std::size_t>& slots,
                                 std::vector<std::unordered_set<std::size_t>>& recomputed,
                                 std::unordered_set<const ir::Value*>& written) {
  const std::size_t n = g.nodes.size();
  std::unordered_set<const ir::Value*> kept(g.outputs.begin(), g.outputs.end());
  for (const auto& e : g.effects) kept.insert(e.value);
  std::unordered_map<const ir::Value*, std::vector<std::size_t>> readers;
  for (std::size_t i = 0; i < n; ++i)
    for (const ir::Value* v : g.nodes[i]->inputs) readers[v].push_back(i);
  std::vector<bool> is_anchor(n, false);
  for (const ir::Node* a : anchor)
    if (a) is_anchor[index.at(a)] = true;
  auto holds = [&](std::size_t G, std::size_t p) {  // group G's node makes what node p makes
    return home[p] == static_cast<int>(G) || recomputed[G].count(p) > 0 || anchor[G] == g.nodes[p].get();
  };
  auto update_written = [&] {
    written = kept;
    for (std::size_t i = 0; i < n; ++i) {
      if (home[i] == -2) continue;
      for (const ir::Value* v : g.nodes[i]->inputs)
        if (v->producer && (home[i] < 0 || !holds(static_cast<std::size_t>(home[i]), index.at(v->producer))))
          written.insert(v);
    }
    for (std::size_t G = 0; G < members.size(); ++G)
      for (std::size_t c : recomputed[G])
        for (const ir::Value* v : g.nodes[c]->inputs)
          if (v->producer && !holds(G, index.at(v->producer))) written.insert(v);
  };
  update_written();
  // An argument, a plain node's result, or one a group writes (an anchor's product only then).
  auto in_memory = [&](const ir::Value* v) {
    if (!v->producer) return true;
    const std::size_t p = index.at(v->producer);
    return (home[p] < 0 && !is_anchor[p]) || written.count(v) > 0;
  };
  auto bytes = [](const ir::Value* v) { return static_cast<std::int64_t>(dtype_size(v->dtype)); };
  for (std::size_t B = 0; B < members.size(); ++B) {
    if (members[B].empty() || home[members[B].front()] != static_cast<int>(B)) continue;
    const Shape& shape = over[B];
    std::unordered_set<const ir::Value*> reads;
    if (anchor[B]) reads.insert(anchor[B]->inputs.begin(), anchor[B]->inputs.end());
    std::vector<std::pair<int, std::vector<const ir::Value*>>> wanted;  // per other group, what B reads of it
    for (std::size_t m : members[B])
      for (const ir::Value* v : g.nodes[m]->inputs) {
        if (!reads.insert(v).second || !v->producer || !(v->shape == shape)) continue;
        const int F = home[index.at(v->producer)];
        if (F < 0 || F == static_cast<int>(B)) continue;
        auto it = std::find_if(wanted.begin(), wanted.end(), [&](const auto& w) { return w.first == F; });
        if (it == wanted.end()) it = wanted.insert(wanted.end(), {F, {}});
        it->second.push_back(v);
      }
    std::size_t budget = slots[B] + (anchor[B] ? anchor[B]->inputs.size() + 1 : 0);
    for (const auto& entry : wanted) {
      const int F = entry.first;  // not a structured binding: clang 14's lambdas cannot capture one
      const std::vector<const ir::Value*>& wants = entry.second;
      // Each of F's results of B's shape, and each such value F reads, is tried as d.
      std::vector<const ir::Value*> cuts;
      for (std::size_t m : members[static_cast<std::size_t>(F)]) {
        if (g.nodes[m]->outputs[0]->shape == shape) cuts.push_back(g.nodes[m]->outputs[0]);
        for (const ir::Value* v : g.nodes[m]->inputs)
          if (v->shape == shape && (!v->producer || home[index.at(v->producer)] != F)) cuts.push_back(v);
      }
      std::int64_t best_saving = 0;
      std::vector<std::size_t> best_ops;
      std::vector<const ir::Value*> best_leaves;
      for (const ir::Value* d : cuts) {
        std::vector<std::size_t> ops;
        std::vector<const ir::Value*> leaves, stack(wants.begin(), wants.end());
        std::unordered_set<const ir::Value*> seen;
        std::size_t op_slots = 0;
        bool ok = true;
        while (ok && !stack.empty()) {
          const ir::Value* v = stack.back();
          stack.pop_back();
          if (!seen.insert(v).second) continue;
          const ir::Node* p = v->producer;
          if (!(v->shape == shape)) {  // a broadcast operand, or a value per row: small
            ok = in_memory(v);
            continue;
          }
          if (v != d && p && home[index.at(p)] == F && fusible(*p)) {
            ops.push_back(index.at(p));
            op_slots += 1 + p->inputs.size();
            stack.insert(stack.end(), p->inputs.begin(), p->inputs.end());
            ok = ops.size() <= k_max_recomputed_ops && budget + op_slots <= cpu::FusedKernel::kMaxSlots;
          } else {
            leaves.push_back(v);
            ok = v == d || in_memory(v);
          }
        }
        if (!ok) continue;
        // Bytes per element saved: F's writes of what only B read, and B's reads of what it
        // wanted. F must write less: recomputing only to spare B a read is not worth it.
        std::int64_t writes = in_memory(d) ? 0 : -bytes(d), saving = 0;
        for (const ir::Value* v : wants) {
          if (v == d) continue;
          saving += bytes(v);
          const auto& r = readers[v];
          if (!kept.count(v) && std::all_of(r.begin(), r.end(), [&](std::size_t k) {
                return home[k] == F || home[k] == static_cast<int>(B);
              }))
            writes += bytes(v);
        }
        for (const ir::Value* v : leaves)
          if (!reads.count(v)) saving -= bytes(v);
        saving += writes;
        if (writes > 0 &&
            (saving > best_saving || (saving == best_saving && !best_ops.empty() && ops.size() < best_ops.size()))) {
          best_saving = saving;
          best_ops = std::move(ops);
          best_leaves = std::move(leaves);
        }
      }
      if (best_ops.empty()) continue;
      for (std::size_t k : best_ops)
        if (recomputed[B].insert(k).second) {
          members[B].push_back(k);
          budget += 1 + g.nodes[k]->inputs.size();
        }
      for (const ir::Value* v : best_leaves) {
        reads.insert(v);
        written.insert(v);
      }
    }
    std::sort(members[B].begin(), members[B].end());
  }
  // What each group now writes, and members no one reads any more, until neither changes.
  for (bool dropped = true; dropped;) {
    update_written();
    dropped = false;
    for (std::size_t G = 0; G < members.size(); ++G) {
      std::unordered_set<const ir::Value*> live_reads;
      std::vector<std::size_t> live;
      for (auto it = members[G].rbegin(); it != members[G].rend(); ++it) {
        const ir::Node& node = *g.nodes[*it];
        const bool mine = home[*it] == static_cast<int>(G);
        if ((mine && written.count(node.outputs[0])) || live_reads.count(node.outputs[0])) {
          live.push_back(*it);
          live_reads.insert(node.inputs.begin(), node.inputs.end());
          continue;
        }
        dropped = true;
        if (mine)
          home[*it] = -2;
        else
          recomputed[G].erase(*it);
      }
      members[G].assign(live.rbegin(), live.rend());
    }
  }
}

}  // namespace detail

XGRAD_API bool fuse(ir::Graph& g, const PassContext& ctx) {
  const bool paired = detail::pair_max_pool(g) | detail::pair_attention(g);
  const bool pooled = !ctx.strict && detail::conv_gradients_through_max_pool(g);
  const bool blocks = detail::conv_relu_max_pool(g);
  const std::size_t n = g.nodes.size();
  std::unordered_map<const ir::Node*, std::size_t> index;
  for (std::size_t i = 0; i < n; ++i) index[g.nodes[i].get()] = i;

  // Bitsets over nodes; ancestors(i): every node that node i depends on.
  const std::size_t words = (n + 63) / 64;
  std::vector<std::uint64_t> ancestor_bits(n * words, 0);
  auto ancestors = [&](std::size_t i) { return ancestor_bits.data() + i * words; };
  auto bit = [](const std::uint64_t* set, std::size_t j) { return ((set[j / 64] >> (j % 64)) & 1) != 0; };

  // A set of nodes can run as one kernel when no node outside it lies on a path between two
  // of its nodes; such a node comes after the set's first node and depends on one of it.
  auto convex = [&](const std::vector<std::size_t>& set) {
    std::vector<std::uint64_t> inside(words, 0), above(words, 0);
    for (std::size_t m : set) {
      inside[m / 64] |= std::uint64_t{1} << (m % 64);
      for (std::size_t w = 0; w < words; ++w) above[w] |= ancestors(m)[w];
    }
    const std::size_t first = *std::min_element(set.begin(), set.end());
    for (std::size_t x = first + 1; x < n; ++x) {
      if (!bit(above.data(), x) || bit(inside.data(), x)) continue;
      for (std::size_t w = 0; w < words; ++w)
        if (ancestors(x)[w] & inside[w]) return false;
    }
    return true;
  };

  // A group runs over one shape: its members are ops of that shape or, in a row group,
  // reductions of its rows (over the last axis) and ops on values per row ([..., 1]) that
  // read only such values and scalars.
  auto fits = [&](std::size_t m, const Shape& shape) {
    const ir::Node& node = *g.nodes[m];
    if (detail::row_reduction(node)) return node.inputs[0]->shape == shape;
    const Shape& out = node.outputs[0]->shape;
    if (out == shape) return true;
    return detail::row_group_shape(shape) && out == detail::rows_of(shape) && !node.is<op::BroadcastTo>() &&
           std::all_of(node.inputs.begin(), node.inputs.end(),
                       [&](const ir::Value* v) { return v->shape == out || v->shape.numel() == 1; });
  };
  // The shape two groups' union runs over: theirs, or the one whose rows the other's is.
  auto joint = [](const Shape& a, const Shape& b) -> std::optional<Shape> {
    if (a == b) return a;
    if (detail::row_group_shape(a) && detail::rows_of(a) == b) return a;
    if (detail::row_group_shape(b) && detail::rows_of(b) == a) return b;
    return std::nullopt;
  };

  // Groups in program order: a fusible node joins (and so merges) the groups of the
  // producers of its inputs that run over its shape (or whose shape it holds per row, or that
  // hold its shape per row), as far as the union stays convex.
  std::vector<int> group(n, -1);
  std::vector<std::vector<std::size_t>> members;
  std::vector<Shape> over;         // per group, the shape it runs over
  std::vector<std::size_t> slots;  // per group, an upper bound on its FusedKernel slots
  for (std::size_t i = 0; i < n; ++i) {
    const ir::Node& node = *g.nodes[i];
    for (const ir::Value* v : node.inputs)
      if (v->producer) {
        const std::size_t p = index.at(v->producer);
        for (std::size_t w = 0; w < words; ++w) ancestors(i)[w] |= ancestors(p)[w];
        ancestors(i)[p / 64] |= std::uint64_t{1} << (p % 64);
      }
    const bool reduction = detail::row_reduction(node) != nullptr;
    if (!detail::fusible(node) && !reduction) continue;
    std::vector<std::size_t> set{i};
    Shape set_over = reduction ? node.inputs[0]->shape : node.outputs[0]->shape;
    // A value per row that an op on every element reads takes a slot more, repeated.
    std::size_t set_slots = 1 + node.inputs.size();
    if (!reduction && detail::row_group_shape(set_over))
      for (const ir::Value* v : node.inputs) set_slots += v->shape == detail::rows_of(set_over);
    int chosen = -1;
    for (const ir::Value* v : node.inputs) {
      if (!v->producer) continue;
      const int G = group[index.at(v->producer)];
      if (G < 0 || G == chosen) continue;
      const auto union_over = joint(set_over, over[static_cast<std::size_t>(G)]);
      if (!union_over) continue;
      const auto& more = members[static_cast<std::size_t>(G)];
      if (set_slots + slots[static_cast<std::size_t>(G)] > cpu::FusedKernel::kMaxSlots) continue;
      std::vector<std::size_t> trial = set;
      trial.insert(trial.end(), more.begin(), more.end());
      if (!std::all_of(trial.begin(), trial.end(), [&](std::size_t m) { return fits(m, *union_over); }) ||
          !convex(trial))
        continue;
      set = std::move(trial);
      set_over = *union_over;
      set_slots += slots[static_cast<std::size_t>(G)];
      if (chosen < 0) {
        chosen = G;
        continue;
      }
      for (std::size_t m : more) group[m] = chosen;  // G merges into the chosen group
      auto& into = members[static_cast<std::size_t>(chosen)];
      into.insert(into.end(), more.begin(), more.end());
      members[static_cast<std::size_t>(G)].clear();
      slots[static_cast<std::size_t>(G)] = 0;
    }
    if (chosen < 0) {
      chosen = static_cast<int>(members.size());
      members.emplace_back();
      over.emplace_back();
      slots.push_back(0);
    }
    group[i] = chosen;
    auto& mine = members[static_cast<std::size_t>(chosen)];
    mine.push_back(i);
    std::sort(mine.begin(), mine.end());
    over[static_cast<std::size_t>(chosen)] = set_over;
    slots[static_cast<std::size_t>(chosen)] = set_slots;
  }
  // A row group: some member holds values per row.
  auto row_group = [&](std::size_t G) {
    return std::any_of(members[G].begin(), members[G].end(),
                       [&](std::size_t m) { return !(g.nodes[m]->outputs[0]->shape == over[G]); });
  };

  std::unordered_set<const ir::Value*> read_outside(g.outputs.begin(), g.outputs.end());
  for (const auto& e : g.effects) read_outside.insert(e.value);
  for (std::size_t i = 0; i < n; ++i)
    for (const ir::Value* v : g.nodes[i]->inputs)
      if (v->producer && group[index.at(v->producer)] != group[i]) read_outside.insert(v);

  // A group takes in the op making one of its inputs (MatMul, Conv2D: ops with an epilogue
  // kernel) when only the group reads that value and the union stays convex: the group then
  // runs on each block of the op's output as the op finishes it, while it is in cache.
  std::unordered_map<const ir::Value*, int> reader_group;  // the one group reading a value; -2: others too
  for (std::size_t i = 0; i < n; ++i)
    for (const ir::Value* v : g.nodes[i]->inputs) {
      auto [it, fresh] = reader_group.try_emplace(v, group[i]);
      if (group[i] < 0 || (!fresh && it->second != group[i])) it->second = -2;
    }
  for (const ir::Value* v : g.outputs) reader_group[v] = -2;
  for (const auto& e : g.effects) reader_group[e.value] = -2;
  std::vector<const ir::Node*> anchor(members.size(), nullptr);
  std::vector<bool> anchored(n, false);
  for (std::size_t G = 0; G < members.size(); ++G) {
    if (members[G].empty() || row_group(G)) continue;  // a GEMM finishes blocks, not whole rows
    const Shape& shape = over[G];
    for (std::size_t m : members[G])
      for (const ir::Value* v : g.nodes[m]->inputs) {
        const ir::Node* p = v->producer;
        if (anchor[G] || !p || !p->epilogue_kernel || p->outputs.size() != 1 || !(v->shape == shape)) continue;
        const std::size_t pi = index.at(p);
        if (anchored[pi] || reader_group.at(v) != static_cast<int>(G) ||
            slots[G] + p->inputs.size() + 1 > cpu::FusedKernel::kMaxSlots)
          continue;
        // No member may feed the anchor: the fused node would read its own output.
        if (std::any_of(members[G].begin(), members[G].end(), [&](std::size_t k) { return bit(ancestors(pi), k); }))
          continue;
        std::vector<std::size_t> trial = members[G];
        trial.push_back(pi);
        if (!convex(trial)) continue;
        anchor[G] = p;
        anchored[pi] = true;
      }
  }

  // The new graph's items: one per fused group (two or more nodes, or one with an anchor), one
  // per other node; key: where an item goes when nothing forces it later (its first node's
  // position). Each group is convex, but two groups can still need each other (a1 -> b2 and
  // b1 -> a2): then a group in the way first gives up its anchor, else is dissolved, until an
  // order exists (with no group at all, the original order is one).
  std::vector<bool> dissolved(members.size(), false);
  std::vector<int> anchor_group(n, -1);
  for (std::size_t G = 0; G < members.size(); ++G)
    if (anchor[G]) anchor_group[index.at(anchor[G])] = static_cast<int>(G);
  auto fused = [&](std::size_t G) { return !dissolved[G] && (members[G].size() >= 2 || anchor[G]); };
  std::vector<int> group_of_item;  // per item: its group, or -1 for a plain node
  std::vector<std::size_t> node_of_item, key, order;
  for (;;) {
    group_of_item.clear();
    node_of_item.clear();
    key.clear();
    std::vector<std::size_t> item_of_group(members.size()), item_of_node(n);
    for (std::size_t G = 0; G < members.size(); ++G)
      if (fused(G)) {
        item_of_group[G] = group_of_item.size();
        group_of_item.push_back(static_cast<int>(G));
        node_of_item.push_back(0);
        key.push_back(anchor[G] ? std::min(index.at(anchor[G]), members[G].front()) : members[G].front());
      }
    for (std::size_t i = 0; i < n; ++i) {
      const int G = anchored[i] ? anchor_group[i] : group[i];
      if (G >= 0 && fused(static_cast<std::size_t>(G))) {
        item_of_node[i] = item_of_group[static_cast<std::size_t>(G)];
        continue;
      }
      item_of_node[i] = group_of_item.size();
      group_of_item.push_back(-1);
      node_of_item.push_back(i);
      key.push_back(i);
    }
    // Kahn's algorithm, taking the ready item that came first.
    const std::size_t items = group_of_item.size();
    std::vector<std::vector<std::size_t>> readers(items);
    std::vector<std::size_t> waiting(items, 0);
    std::vector<std::unordered_set<std::size_t>> from(items);
    for (std::size_t i = 0; i < n; ++i)
      for (const ir::Value* v : g.nodes[i]->inputs)
        if (v->producer) {
          const std::size_t a = item_of_node[index.at(v->producer)], b = item_of_node[i];
          if (a != b && from[b].insert(a).second) {
            readers[a].push_back(b);
            ++waiting[b];
          }
        }
    using Ready = std::pair<std::size_t, std::size_t>;  // (key, item)
    std::priority_queue<Ready, std::vector<Ready>, std::greater<>> ready;
    for (std::size_t k = 0; k < items; ++k)
      if (waiting[k] == 0) ready.emplace(key[k], k);
    order.clear();
    while (!ready.empty()) {
      const std::size_t k = ready.top().second;
      ready.pop();
      for (std::size_t r : readers[k])
        if (--waiting[r] == 0) ready.emplace(key[r], r);
      order.push_back(k);
    }
    if (order.size() == items) break;
    // The first group left waiting loses its anchor, or its fusion.
    std::size_t stuck = items;
    for (std::size_t k = 0; k < items; ++k)
      if (waiting[k] > 0 && group_of_item[k] >= 0 && (stuck == items || key[k] < key[stuck])) stuck = k;
    if (stuck == items) throw std::logic_error("xgrad internal error: fusion made a cycle");
    const auto G = static_cast<std::size_t>(group_of_item[stuck]);
    if (anchor[G]) {
      anchored[index.at(anchor[G])] = false;
      anchor_group[index.at(anchor[G])] = -1;
      anchor[G] = nullptr;
    } else {
      dissolved[G] = true;
    }
  }

  if (std::none_of(group_of_item.begin(), group_of_item.end(), [](int G) { return G >= 0; }))
    return paired || pooled || blocks;
  std::vector<int> home(n, -1);
  for (std::size_t i = 0; i < n; ++i)
    if (group[i] >= 0 && fused(static_cast<std::size_t>(group[i]))) home[i] = group[i];
  std::vector<std::unordered_set<std::size_t>> recomputed(members.size());
  detail::recompute_in_readers(g, index, home, members, over, anchor, slots, recomputed, read_outside);
  int fused_count = 0;
  std::vector<std::unique_ptr<ir::Node>> ordered;
  for (std::size_t k : order) {
    if (group_of_item[k] < 0) {
      ordered.push_back(std::move(g.nodes[node_of_item[k]]));
      continue;
    }
    const auto G = static_cast<std::size_t>(group_of_item[k]);
    if (members[G].empty()) {  // every value it made is recomputed where it is read
      if (anchor[G]) throw std::logic_error("xgrad internal error: fusion left a product without readers");
      continue;
    }
    ordered.push_back(
        detail::make_fused(g, members[G], over[G], anchor[G], read_outside, recomputed[G], fused_count++));
  }
  g.nodes = std::move(ordered);
  return true;
}

}  // namespace xgrad::passes
