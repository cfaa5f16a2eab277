// Definitions of passes/layout.hpp: included by it when header-only, compiled once into the
// library (src/passes.cpp) otherwise.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "xgrad/ops/manipulation-inl.hpp"
#include "xgrad/ops/nn-inl.hpp"
#include "xgrad/passes/layout.hpp"
#include "xgrad/passes/rewrite.hpp"
#include "xgrad/passes/splice.hpp"

namespace xgrad::passes {

namespace detail {

/// An attention operand [batch * heads, t, size] that is a copy of `size`-wide heads laid side
/// by side in columns [column, column + heads * size) of a buffer read as [batch, t, width].
struct HeadsView {
  ir::Value* buffer;
  std::int64_t batch, t, width, column, heads, size;
};

/// v = reshape(transpose(reshape(c, [b, t, h, s]), [0, 2, 1, 3]), [b * h, t, s]), with c a
/// buffer or a slice of one along its last axis: what splitting a projection into heads makes.
inline std::optional<HeadsView> heads_view(const ir::Value* v) {
  const ir::Node* merge = v->producer;
  if (v->shape.ndim() != 3 || !merge || !merge->is<op::Reshape>()) return std::nullopt;
  const ir::Node* transpose = merge->inputs[0]->producer;
  if (!transpose || !transpose->is<op::Transpose>() ||
      transpose->params<op::Transpose>().perm != std::vector<std::int64_t>{0, 2, 1, 3})
    return std::nullopt;
  const ir::Value* split = transpose->inputs[0];
  const ir::Node* reshape = split->producer;
  if (!reshape || !reshape->is<op::Reshape>()) return std::nullopt;
  const std::int64_t b = split->shape[0], t = split->shape[1], h = split->shape[2], s = split->shape[3];
  if (!(v->shape == Shape{b * h, t, s})) return std::nullopt;
  ir::Value* columns = reshape->inputs[0];
  const ir::Node* slice = columns->producer;
  if (!slice || !slice->is<op::Slice>()) return HeadsView{columns, b, t, h * s, 0, h, s};
  // A slice along the last axis only, whose rows the reshape keeps whole.
  ir::Value* buffer = slice->inputs[0];
  const int last = buffer->shape.ndim() - 1;
  if (columns->shape[last] != h * s) return std::nullopt;
  const auto& begin = slice->params<op::Slice>().begin;
  for (int a = 0; a < last; ++a)
    if (begin[static_cast<std::size_t>(a)] != 0 || columns->shape[a] != buffer->shape[a]) return std::nullopt;
  return HeadsView{buffer, b, t, buffer->shape[last], begin[static_cast<std::size_t>(last)], h, s};
}

/// The heads layout of an attention's geometry whose q, k and v are views of one buffer, with
/// `views` their heads views; nullopt when they are not (AttentionGeometry says what is needed).
inline std::optional<cpu::AttentionGeometry> heads_layout(cpu::AttentionGeometry g,
                                                          const std::vector<std::optional<HeadsView>>& views) {
  if (g.heads || g.tq != g.tk) return std::nullopt;
  for (const auto& view : views)
    if (!view || view->buffer != views[0]->buffer || view->heads != views[0]->heads ||
        view->batch * view->heads != g.batch || view->t != g.tq)
      return std::nullopt;
  const HeadsView &q = *views[0], &k = *views[1], &v = *views[2];
  if (q.size != g.d || k.size != g.d || v.size != g.dv) return std::nullopt;
  g.heads = q.heads;
  g.width = q.width;
  g.q_column = q.column;
  g.k_column = k.column;
  g.v_column = v.column;
  return g;
}

/// Whether `view` is the whole of a [batch, t, heads * dv] buffer in g's heads layout: where
/// the output and its gradient are.
inline bool whole_output(const std::optional<HeadsView>& view, const cpu::AttentionGeometry& g, std::int64_t batch) {
  return view && view->batch == batch && view->t == g.tq && view->heads == g.heads && view->size == g.dv &&
         view->column == 0 && view->width == g.heads * g.dv;
}

template <class T>
ir::Value* fold_attention(ir::Graph& g, std::size_t at, const cpu::AttentionGeometry& heads, const HeadsView& qkv) {
  const ir::Node& node = *g.nodes[at];
  return splice(g, at, {qkv.buffer}, node, [&](std::span<const TensorBase> in) {
    const auto x = reshape(Tensor<T>(in[0]), {qkv.batch, qkv.t, qkv.width});
    const auto out = xgrad::detail::apply<T>(op::Attention{heads}, node.loc, x, x, x);
    return TensorBase(xgrad::detail::heads_as_items(out, heads.heads, 0, heads.dv, node.loc));
  });
}

template <class T> ir::Value* fold_attention_grad(ir::Graph& g, std::size_t at, const cpu::AttentionGeometry& heads,
                                                  const HeadsView& qkv, ir::Value* out, ir::Value* gy) {
  const ir::Node& node = *g.nodes[at];
  return splice(g, at, {qkv.buffer, out, gy}, node, [&](std::span<const TensorBase> in) {
    const std::vector<std::int64_t> rows{qkv.batch, qkv.t, qkv.width}, outs{qkv.batch, qkv.t, heads.heads * heads.dv};
    const auto x = reshape(Tensor<T>(in[0]), rows);
    const auto grads = xgrad::detail::apply<T>(op::AttentionGrad{heads}, node.loc, x, x, x,
                                               reshape(Tensor<T>(in[1]), outs), reshape(Tensor<T>(in[2]), outs));
    // The standard layout's packing, which simplify then cancels against its readers' slices.
    auto part = [&](std::int64_t column, std::int64_t size) {
      return reshape(xgrad::detail::heads_as_items(grads, heads.heads, column, size, node.loc),
                     {heads.batch, heads.tq * size});
    };
    return TensorBase(
        concat<T>({part(heads.q_column, heads.d), part(heads.k_column, heads.d), part(heads.v_column, heads.dv)}, 1));
  });
}

}  // namespace detail

XGRAD_API bool layout(ir::Graph& g, const PassContext&) {
  bool changed = false;
  for (std::size_t k = 0; k < g.nodes.size(); ++k) {
    const ir::Node& node = *g.nodes[k];
    const bool forward = node.is<op::Attention>(), backward = node.is<op::AttentionGrad>();
    if (!forward && !backward) continue;
    const auto& geometry = forward ? node.params<op::Attention>().geometry : node.params<op::AttentionGrad>().geometry;
    std::vector<std::optional<detail::HeadsView>> views;
    for (std::size_t i = 0; i < 3; ++i) views.push_back(detail::heads_view(node.inputs[i]));
    const auto heads = detail::heads_layout(geometry, views);
    if (!heads) continue;
    const DType dtype = node.outputs[0]->dtype;
    ir::Value* replacement = nullptr;
    const std::size_t size_before = g.nodes.size();
    if (forward) {
      replacement = dtype == DType::float32 ? detail::fold_attention<float>(g, k, *heads, *views[0])
                                            : detail::fold_attention<double>(g, k, *heads, *views[0]);
    } else {
      const auto out = detail::heads_view(node.inputs[3]), gy = detail::heads_view(node.inputs[4]);
      const std::int64_t batch = views[0]->batch;
      if (!detail::whole_output(out, *heads, batch) || !detail::whole_output(gy, *heads, batch)) continue;
      replacement = dtype == DType::float32
                        ? detail::fold_attention_grad<float>(g, k, *heads, *views[0], out->buffer, gy->buffer)
                        : detail::fold_attention_grad<double>(g, k, *heads, *views[0], out->buffer, gy->buffer);
    }
    k += g.nodes.size() - size_before;
    replace_uses(g, g.nodes[k]->outputs[0], replacement);
    changed = true;
  }
  return changed;
}

}  // namespace xgrad::passes
