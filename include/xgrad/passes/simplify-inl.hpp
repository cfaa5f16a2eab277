// Definitions of passes/simplify.hpp: included by it when header-only, compiled once into the
// library (src/passes.cpp) otherwise.
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

#include "xgrad/ops/elementwise-inl.hpp"
#include "xgrad/ops/manipulation-inl.hpp"
#include "xgrad/ops/nn-inl.hpp"
#include "xgrad/ops/reduce-inl.hpp"
#include "xgrad/passes/rewrite.hpp"
#include "xgrad/passes/simplify.hpp"
#include "xgrad/passes/splice.hpp"

namespace xgrad::passes {

namespace detail {

inline bool same_type(const ir::Value* a, const ir::Value* b) { return a->dtype == b->dtype && a->shape == b->shape; }

/// The axis along which a slice (begin, its output `part` of `whole`) takes a range, every
/// other axis whole; -1 when there is none such.
inline int sliced_axis(const std::vector<std::int64_t>& begin, const Shape& part, const Shape& whole) {
  int axis = -1;
  for (int a = 0; a < whole.ndim(); ++a)
    if (begin[static_cast<std::size_t>(a)] != 0 || part[a] != whole[a]) {
      if (axis >= 0) return -1;
      axis = a;
    }
  return axis < 0 ? whole.ndim() - 1 : axis;
}

/// slice(concat(x0, x1, ...)) taking exactly one xi: xi. Null otherwise.
inline ir::Value* concat_part(const ir::Node& slice, const ir::Node& concat) {
  const int axis = concat.params<op::Concat>().axis;
  const auto& begin = slice.params<op::Slice>().begin;
  if (sliced_axis(begin, slice.outputs[0]->shape, concat.outputs[0]->shape) != axis) return nullptr;
  std::int64_t at = 0;
  for (ir::Value* part : concat.inputs) {
    if (at == begin[static_cast<std::size_t>(axis)] && same_type(part, slice.outputs[0])) return part;
    at += part->shape[axis];
  }
  return nullptr;
}

/// The value `node` can be replaced by, or null.
inline ir::Value* simpler(const ir::Node& node, const PassContext& ctx) {
  const auto& in = node.inputs;
  if (node.outputs.size() != 1) return nullptr;
  const ir::Value* out = node.outputs[0];
  auto operand_if = [&](ir::Value* x) { return same_type(x, out) ? x : nullptr; };
  if (node.is<op::Mul>() && is_constant(in[1], 1)) return operand_if(in[0]);  // x * 1
  if (node.is<op::Mul>() && is_constant(in[0], 1)) return operand_if(in[1]);
  if (node.is<op::Div>() && is_constant(in[1], 1)) return operand_if(in[0]);  // x / 1
  if (node.is<op::Sub>() && is_constant(in[1], 0)) return operand_if(in[0]);  // x - 0 (exact, -0 stays -0)
  if (!ctx.strict) {
    if (node.is<op::Add>() && is_constant(in[1], 0)) return operand_if(in[0]);  // x + 0
    if (node.is<op::Add>() && is_constant(in[0], 0)) return operand_if(in[1]);
  }
  auto producer_op = [&](std::size_t i) -> const ir::Node* {
    const ir::Node* p = in.empty() ? nullptr : in[i]->producer;
    return p && p->outputs.size() == 1 ? p : nullptr;
  };
  const ir::Node* p = producer_op(0);
  if (node.is<op::Neg>() && p && p->is<op::Neg>()) return operand_if(p->inputs[0]);  // --x
  if (!ctx.strict && p && ((node.is<op::Exp>() && p->is<op::Log>()) || (node.is<op::Log>() && p->is<op::Exp>())))
    return operand_if(p->inputs[0]);                                  // exp(log x), log(exp x)
  if (node.is<op::Reshape>() && same_type(in[0], out)) return in[0];  // reshape to its own shape
  if ((node.is<op::Slice>() || node.is<op::SliceGrad>()) && same_type(in[0], out)) return in[0];  // the whole
  if (node.is<op::Slice>() && p && p->is<op::Concat>()) return concat_part(node, *p);
  if (node.is<op::Reshape>() && p && p->is<op::Reshape>() && same_type(p->inputs[0], out)) return p->inputs[0];
  if (node.is<op::Transpose>() && p && p->is<op::Transpose>() && same_type(p->inputs[0], out)) {
    // transpose(transpose(x, p1), p2) is x when p1[p2[i]] == i for every axis.
    const auto &outer = node.params<op::Transpose>().perm, &inner = p->params<op::Transpose>().perm;
    bool identity = outer.size() == inner.size();
    for (std::size_t i = 0; identity && i < outer.size(); ++i)
      identity = inner[static_cast<std::size_t>(outer[i])] == static_cast<std::int64_t>(i);
    if (identity) return p->inputs[0];
  }
  return nullptr;
}

/// An elementwise op reading broadcast_to(x) can read x itself when its own broadcasting
/// still gives the same output shape: elementwise kernels broadcast whatever inputs they get
/// to their output type. Exact: no value changes.
inline bool absorb_broadcasts(ir::Node& node) {
  if (!node.traits.elementwise || node.inputs.size() < 2) return false;
  bool changed = false;
  for (std::size_t i = 0; i < node.inputs.size(); ++i) {
    const ir::Node* p = node.inputs[i]->producer;
    if (!p || !p->is<op::BroadcastTo>()) continue;
    Shape shape = p->inputs[0]->shape;
    for (std::size_t j = 0; j < node.inputs.size(); ++j) {
      Shape next;
      if (j != i && !try_broadcast(shape, node.inputs[j]->shape, next)) return changed;
      if (j != i) shape = next;
    }
    if (!(shape == node.outputs[0]->shape)) continue;
    node.inputs[i] = p->inputs[0];
    changed = true;
  }
  return changed;
}

/// sum_to(broadcast_to(x, S), T) where every summed axis is one the broadcast made: each sum
/// adds k copies of one element of x, so the result is x, shaped as T, times k. One rounding
/// instead of k additions: not under strict. Null when the pattern does not apply.
inline ir::Value* sum_of_broadcast(ir::Graph& g, std::size_t at, const PassContext& ctx) {
  const ir::Node& node = *g.nodes[at];
  if (ctx.strict || !node.is<op::SumTo>()) return nullptr;
  const ir::Node* p = node.inputs[0]->producer;
  if (!p || !p->is<op::BroadcastTo>()) return nullptr;
  ir::Value* x = p->inputs[0];
  const Shape &from = x->shape, &wide = node.inputs[0]->shape, &to = node.outputs[0]->shape;
  if (x->dtype != DType::float32 && x->dtype != DType::float64) return nullptr;
  // Dimension i of a shape aligned to the right of `wide`; 1 where it has none.
  auto dim = [&](const Shape& s, int i) {
    const int j = i - (wide.ndim() - s.ndim());
    return j < 0 ? std::int64_t{1} : s[j];
  };
  std::int64_t copies = 1;
  for (int i = 0; i < wide.ndim(); ++i) {
    if (dim(to, i) != 1 || wide[i] == 1) continue;  // not summed
    if (dim(from, i) != 1) return nullptr;          // summed, but not made by the broadcast
    copies *= wide[i];
  }
  if (copies == 0) return nullptr;  // a sum of no copies is 0, not x * 0 (NaN for an infinite x)
  // x takes T's shape by a reshape (same size), else by dropping leading 1s and broadcasting.
  const bool same_size = from.numel() == to.numel();
  std::vector<std::int64_t> trimmed = from.to_vector();
  while (static_cast<int>(trimmed.size()) > to.ndim() && trimmed.front() == 1) trimmed.erase(trimmed.begin());
  Shape check;
  if (!same_size && (!try_broadcast(Shape(trimmed), to, check) || !(check == to))) return nullptr;
  auto scaled = [&]<class T>(std::type_identity<T>) {
    return splice(g, at, {x}, node, [&](std::span<const TensorBase> in) {
      Tensor<T> v(in[0]);
      Tensor<T> shaped = same_size ? reshape(v, to.to_vector()) : broadcast_to(reshape(v, trimmed), to);
      return TensorBase(shaped * static_cast<T>(copies));
    });
  };
  return x->dtype == DType::float32 ? scaled(std::type_identity<float>{}) : scaled(std::type_identity<double>{});
}

/// concat(slice(z, r0), slice(z, r1), ...) with the ranges following one another along the
/// concatenated axis: slice(z, r0 + r1 + ...), or z itself (exact: the same elements, copied
/// once or not at all). Null when the pattern does not apply.
inline ir::Value* concat_of_slices(ir::Graph& g, std::size_t at) {
  const ir::Node& node = *g.nodes[at];
  if (!node.is<op::Concat>()) return nullptr;
  const int axis = node.params<op::Concat>().axis;
  ir::Value* whole = nullptr;
  std::vector<std::int64_t> first;
  std::int64_t next = 0;
  for (const ir::Value* part : node.inputs) {
    const ir::Node* p = part->producer;
    if (!p || !p->is<op::Slice>() || (whole && p->inputs[0] != whole)) return nullptr;
    const auto& begin = p->params<op::Slice>().begin;
    if (sliced_axis(begin, part->shape, p->inputs[0]->shape) != axis ||
        (whole && begin[static_cast<std::size_t>(axis)] != next))
      return nullptr;
    if (!whole) first = begin;
    whole = p->inputs[0];
    next = begin[static_cast<std::size_t>(axis)] + part->shape[axis];
  }
  if (same_type(whole, node.outputs[0])) return whole;
  const DType dtype = whole->dtype;
  std::vector<std::int64_t> size = node.outputs[0]->shape.to_vector();
  auto sliced = [&]<class T>(std::type_identity<T>) {
    return splice(g, at, {whole}, node,
                  [&](std::span<const TensorBase> in) { return TensorBase(slice(Tensor<T>(in[0]), first, size)); });
  };
  if (dtype == DType::float32) return sliced(std::type_identity<float>{});
  if (dtype == DType::float64) return sliced(std::type_identity<double>{});
  return nullptr;
}

/// add(SliceGrad(x), SliceGrad(y)) placing x and y side by side along one axis (the gradient of
/// neighbouring slices, as of a split): SliceGrad(concat(x, y)), or the concat itself when it
/// fills the shape: one copy instead of two zero fills, two copies and an add. Not under strict:
/// the add turns a -0 in x or y into +0. Null when the pattern does not apply.
inline ir::Value* add_of_placed(ir::Graph& g, std::size_t at, const PassContext& ctx) {
  const ir::Node& node = *g.nodes[at];
  if (ctx.strict || !node.is<op::Add>()) return nullptr;
  const ir::Node* a = node.inputs[0]->producer;
  const ir::Node* b = node.inputs[1]->producer;
  if (!a || !b || !a->is<op::SliceGrad>() || !b->is<op::SliceGrad>()) return nullptr;
  const auto &pa = a->params<op::SliceGrad>(), &pb = b->params<op::SliceGrad>();
  const Shape& shape = node.outputs[0]->shape;
  if (!(pa.shape == shape) || !(pb.shape == shape)) return nullptr;
  // The axis where they differ; everywhere else the same place and extent.
  int axis = -1;
  for (int d = 0; d < shape.ndim(); ++d) {
    const auto i = static_cast<std::size_t>(d);
    if (pa.begin[i] == pb.begin[i] && pa.block[d] == pb.block[d]) continue;
    if (axis >= 0) return nullptr;
    axis = d;
  }
  if (axis < 0) return nullptr;
  const auto i = static_cast<std::size_t>(axis);
  const bool a_first = pa.begin[i] < pb.begin[i];
  const op::SliceGrad &lo = a_first ? pa : pb, &hi = a_first ? pb : pa;
  if (lo.begin[i] + lo.block[axis] != hi.begin[i]) return nullptr;
  ir::Value* first = a_first ? a->inputs[0] : b->inputs[0];
  ir::Value* second = a_first ? b->inputs[0] : a->inputs[0];
  const DType dtype = node.outputs[0]->dtype;
  auto placed = [&]<class T>(std::type_identity<T>) {
    return splice(g, at, {first, second}, node, [&](std::span<const TensorBase> in) {
      const auto joined = concat<T>({Tensor<T>(in[0]), Tensor<T>(in[1])}, axis);
      return TensorBase(joined.shape() == shape ? joined : slice_backward(joined, shape, lo.begin));
    });
  };
  if (dtype == DType::float32) return placed(std::type_identity<float>{});
  if (dtype == DType::float64) return placed(std::type_identity<double>{});
  return nullptr;
}

/// add(mul(a, b), c), where only the add reads the product: fma(a, b, c), one rounding instead
/// of two (not under strict) and one pass over memory instead of two. Null when it does not apply.
inline ir::Value* multiply_add(ir::Graph& g, std::size_t at, const PassContext& ctx) {
  const ir::Node& node = *g.nodes[at];
  if (ctx.strict || !node.is<op::Add>()) return nullptr;
  const DType dtype = node.outputs[0]->dtype;
  if (dtype != DType::float32 && dtype != DType::float64) return nullptr;
  for (std::size_t k = 0; k < 2; ++k) {
    const ir::Node* p = node.inputs[k]->producer;
    if (!p || !p->is<op::Mul>() || readers(g, node.inputs[k]) != 1) continue;
    std::vector<ir::Value*> args{p->inputs[0], p->inputs[1], node.inputs[1 - k]};
    if (std::any_of(args.begin(), args.end(), [&](const ir::Value* v) { return v->dtype != dtype; })) continue;
    auto fused = [&]<class T>(std::type_identity<T>) {
      return splice(g, at, args, node, [](std::span<const TensorBase> in) {
        return TensorBase(fma(Tensor<T>(in[0]), Tensor<T>(in[1]), Tensor<T>(in[2])));
      });
    };
    return dtype == DType::float32 ? fused(std::type_identity<float>{}) : fused(std::type_identity<double>{});
  }
  return nullptr;
}

/// where(y > 0, MaxPoolPut(a, g), 0) with a = MaxPoolArgmax(y) ->
/// MaxPoolPut(a, where(MaxPoolTake(y, a) > 0, g, 0)): ReLU's gradient before max pooling's,
/// applied to the pooled tensor instead of the full one (the Take is the forward's, which CSE
/// finds). Exact: the put adds g[o] only at its window's argmax i, where y[i] is
/// MaxPoolTake(y, a)[o], so both masks pass the same terms in the same order (a masked element
/// is +0 either way, NaN included). True when it rewrote the Select at `at`.
inline bool mask_through_max_pool_put(ir::Graph& g, std::size_t& at) {
  const ir::Node& select = *g.nodes[at];
  if (!select.is<op::Where>() || !is_positive_zero(select.inputs[2])) return false;
  const ir::Node* greater = select.inputs[0]->producer;
  ir::Node* put = select.inputs[1]->producer;
  if (!greater || !greater->is<op::Greater>() || !is_positive_zero(greater->inputs[1]) || !put ||
      !put->is<op::MaxPoolPut>() || readers(g, select.inputs[1]) != 1 ||
      !same_type(select.inputs[1], select.outputs[0]))
    return false;
  const ir::Node* argmax = put->inputs[0]->producer;
  ir::Value* y = greater->inputs[0];
  const cpu::Pool2dGeometry geo = put->params<op::MaxPoolPut>().geometry;
  if (!argmax || !argmax->is<op::MaxPoolArgmax>() || argmax->inputs[0] != y ||
      !(argmax->params<op::MaxPoolArgmax>().geometry == geo))
    return false;
  const DType dtype = y->dtype;
  if (dtype != DType::float32 && dtype != DType::float64) return false;
  const std::size_t put_at = position_of(g, put);
  const std::size_t size_before = g.nodes.size();
  auto masked = [&]<class T>(std::type_identity<T>) {
    return splice(g, put_at, {y, put->inputs[0], put->inputs[1]}, *put, [&](std::span<const TensorBase> in) {
      const Tensor<T> pooled =
          xgrad::detail::max_pool_take(Tensor<T>(in[0]), Tensor<std::int32_t>(in[1]), geo, put->loc);
      return TensorBase(where(pooled > T(0), Tensor<T>(in[2]), T(0)));
    });
  };
  put->inputs[1] = dtype == DType::float32 ? masked(std::type_identity<float>{}) : masked(std::type_identity<double>{});
  at += g.nodes.size() - size_before;  // the Select moved back by the nodes spliced in before it
  replace_uses(g, g.nodes[at]->outputs[0], put->outputs[0]);
  return true;
}

}  // namespace detail

XGRAD_API bool simplify(ir::Graph& g, const PassContext& ctx) {
  bool changed = false;
  std::unordered_set<const ir::Value*> outputs(g.outputs.begin(), g.outputs.end());
  for (std::size_t k = 0; k < g.nodes.size(); ++k) {
    // Rewrites that replace the node with new ones, spliced in before it.
    const std::size_t size_before = g.nodes.size();
    ir::Value* old_out = g.nodes[k]->outputs.empty() ? nullptr : g.nodes[k]->outputs[0];
    if (detail::mask_through_max_pool_put(g, k)) {
      changed = true;
      continue;
    }
    ir::Value* rewritten = detail::sum_of_broadcast(g, k, ctx);
    if (!rewritten) rewritten = detail::multiply_add(g, k, ctx);
    if (!rewritten) rewritten = detail::add_of_placed(g, k, ctx);
    if (!rewritten) rewritten = detail::concat_of_slices(g, k);
    // An output must not become an argument: the caller would get its own tensor back.
    if (rewritten && outputs.count(old_out) && !rewritten->producer) rewritten = nullptr;
    if (rewritten) {
      replace_uses(g, old_out, rewritten);
      // Past the new nodes and the old one, which DCE removes.
      k += g.nodes.size() - size_before;
      changed = true;
      continue;
    }
    auto& node = g.nodes[k];
    changed = detail::absorb_broadcasts(*node) || changed;
    // reshape(reshape(x)): the outer one reads x directly (a reshape's kernel depends only on
    // its output shape).
    if (node->is<op::Reshape>() && node->inputs[0]->producer && node->inputs[0]->producer->is<op::Reshape>()) {
      node->inputs[0] = node->inputs[0]->producer->inputs[0];
      changed = true;
    }
    ir::Value* replacement = detail::simpler(*node, ctx);
    // An output must not become an argument: the caller would get its own tensor back.
    if (replacement && !(outputs.count(node->outputs[0]) && !replacement->producer)) {
      replace_uses(g, node->outputs[0], replacement);
      changed = true;
    }
  }
  return changed;
}

}  // namespace xgrad::passes
