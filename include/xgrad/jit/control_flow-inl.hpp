// Definitions of jit/control_flow.hpp: included by it when header-only, compiled once into the
// library (src/jit.cpp) otherwise.
#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "xgrad/jit/control_flow.hpp"
#include "xgrad/ops/manipulation.hpp"
#include "xgrad/ops/record.hpp"
#include "xgrad/ops/reduce.hpp"

namespace xgrad::tracing::detail {

using Types = std::vector<std::pair<DType, Shape>>;

inline Types types_of(std::span<const TensorBase> ts) {
  Types out;
  for (const auto& t : ts) out.emplace_back(t.dtype(), t.shape());
  return out;
}

inline std::string types_text(const Types& types) {
  std::string out;
  for (const auto& [d, s] : types) out += (out.empty() ? "" : ", ") + ir::type_str(d, s);
  return "(" + out + ")";
}

inline bool scalar_bool(const TensorBase& t) {
  bool value = false;
  xgrad::detail::copy_bytes(&value, Device::cpu, t.impl()->storage->data(), t.device(), sizeof value);
  return value;
}

inline void check_predicate(std::string_view op, const TensorBase& pred, SourceLoc loc) {
  if (pred.dtype() != DType::boolean || pred.numel() != 1)
    throw_shape_error(op, loc, "the predicate must be a bool tensor with one element, got ", dtype_name(pred.dtype()),
                      pred.shape());
}

/// True while a vmap or a jvp pass is in progress. Traced control flow then runs as ops of the
/// enclosing graph instead of a node with subgraphs: every transform already carries the ops
/// (batches, tangents, gradients), including those on tensors a branch or body reads from outside.
inline bool transforms_active() {
  const auto& ctx = xgrad::detail::context();
  return ctx.vmaps > 0 || ctx.forward_passes > 0;
}

/// where(pick, a, b) on tensors of any dtype.
inline TensorBase select(const Tensor<bool>& pick, const TensorBase& a, const TensorBase& b, SourceLoc loc) {
  return visit_element(a.dtype(), [&]<class T>() { return TensorBase(where(pick, Tensor<T>(a), Tensor<T>(b), loc)); });
}

/// A bool tensor of one element that is true where it is true for some value of its batches
/// (reduced level by level for nested vmaps): whether a batched loop condition still holds
/// anywhere.
inline TensorBase holds_anywhere(TensorBase c) {
  while (c.impl()->physical) c = xgrad::max(cast<std::int32_t>(Tensor<bool>(TensorBase(c.impl()->physical)))) > 0;
  return c;
}

/// Sums b into a (gradients of loop-invariant tensors, one per iteration).
inline void accumulate(TensorBase& a, const TensorBase& b) { a = autograd::detail::add_grads(a, b); }

/// Links each float output of a traced control-flow node to `inputs` on the tape;
/// rule(k, g) returns the gradient of output k's cotangent g for each input.
template <class Rule> void record_outputs(std::string_view op, SourceLoc loc, const std::vector<TensorBase>& inputs,
                                          std::vector<TensorBase>& outputs, Rule rule) {
  if (!is_grad_enabled()) return;
  bool any = false;
  for (const auto& in : inputs) any = any || in.requires_grad();
  if (!any) return;
  std::vector<std::reference_wrapper<const TensorBase>> refs(inputs.begin(), inputs.end());
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    if (!is_float(outputs[k])) continue;
    xgrad::detail::record_range(outputs[k], op, loc, refs.begin(), refs.end(), {}, false,
                                [rule, k](const TensorBase&, const TensorBase& g) { return rule(k, g); });
  }
}

/// The tensors among `inputs` that require grad, as vjp_of targets.
inline std::vector<TensorBase> requiring_grad(std::span<const TensorBase> inputs) {
  std::vector<TensorBase> out;
  for (const auto& t : inputs)
    if (t.requires_grad()) out.push_back(t);
  return out;
}

/// Places gradients for [float operands..., targets...] at their positions among
/// [operands..., captures...] (undefined elsewhere).
inline autograd::Grads place_grads(std::span<const TensorBase> grads, std::span<const TensorBase> operands,
                                   std::span<const TensorBase> captures) {
  autograd::Grads out(operands.size() + captures.size());
  std::size_t next = 0;
  for (std::size_t i = 0; i < operands.size(); ++i)
    if (is_float(operands[i])) out[i] = grads[next++];
  for (std::size_t i = 0; i < captures.size(); ++i)
    if (captures[i].requires_grad()) out[operands.size() + i] = grads[next++];
  return out;
}

/// cond as ops: both branches run and each output is taken from the one pred picks. This is
/// cond's batching rule (a batched predicate picks value by value, as JAX's select) and its form
/// in a graph traced inside vmap or jvp (see transforms_active); the branches must therefore be
/// free of side effects.
inline std::vector<TensorBase> select_branches(const TensorBase& pred, const FlatFn& then_fn, const FlatFn& else_fn,
                                               const std::vector<TensorBase>& operands, SourceLoc loc) {
  auto outs = then_fn(operands);
  const auto others = else_fn(operands);
  if (types_of(outs) != types_of(others))
    throw_shape_error(op::Cond::name, loc, "the branches return different types: then ", types_text(types_of(outs)),
                      ", else ", types_text(types_of(others)));
  const Tensor<bool> pick = reshape(Tensor<bool>(pred), std::vector<std::int64_t>{}, loc);
  for (std::size_t k = 0; k < outs.size(); ++k) outs[k] = select(pick, outs[k], others[k], loc);
  return outs;
}

XGRAD_API std::vector<TensorBase> cond_flat(const TensorBase& pred, const FlatFn& then_fn, const FlatFn& else_fn,
                                            const std::vector<TensorBase>& operands, SourceLoc loc) {
  auto* tracer = Tracer::active();
  if (!tracer || transforms_active()) {
    check_predicate(op::Cond::name, pred, loc);
    if (tracer || pred.impl()->physical) return select_branches(pred, then_fn, else_fn, operands, loc);
    return scalar_bool(pred) ? then_fn(operands) : else_fn(operands);
  }
  xgrad::detail::OpScope scope(op::Cond::name, loc, {pred});
  check_predicate(op::Cond::name, pred, loc);
  Subgraph then_g = trace_subgraph("cond_then", then_fn, operands);
  Subgraph else_g = trace_subgraph("cond_else", else_fn, operands);
  Types types = types_of(then_g.outputs);
  if (types != types_of(else_g.outputs))
    throw_shape_error(op::Cond::name, loc, "the branches return different types: then ", types_text(types), ", else ",
                      types_text(types_of(else_g.outputs)));
  std::vector<TensorBase> inputs{pred};
  inputs.insert(inputs.end(), operands.begin(), operands.end());
  inputs.insert(inputs.end(), then_g.captures.begin(), then_g.captures.end());
  inputs.insert(inputs.end(), else_g.captures.begin(), else_g.captures.end());
  const std::size_t n = operands.size(), n_then = then_g.captures.size();
  auto kernel = [then_g, else_g, n, n_then](std::span<const TensorBase> in, std::span<TensorBase> out) {
    const bool take_then = scalar_bool(in[0]);
    std::vector<TensorBase> args(in.begin() + 1, in.begin() + 1 + static_cast<std::ptrdiff_t>(n));
    auto caps = in.subspan(1 + n);
    auto results = take_then ? then_g.run(args, caps.first(n_then)) : else_g.run(args, caps.subspan(n_then));
    std::copy(results.begin(), results.end(), out.begin());
  };
  auto outs =
      tracer->emit(ir::make_primitive(op::Cond{}), loc, inputs, types, kernel, {}, {then_g.graph, else_g.graph});

  std::vector<TensorBase> diff_inputs(inputs.begin() + 1, inputs.end());
  std::vector<TensorBase> captures(diff_inputs.begin() + static_cast<std::ptrdiff_t>(n), diff_inputs.end());
  const std::size_t num_outputs = outs.size();
  record_outputs(op::Cond::name, loc, diff_inputs, outs,
                 [pred, then_fn, else_fn, operands, captures, num_outputs, loc](std::size_t k, const TensorBase& g) {
                   auto targets = requiring_grad(captures);
                   auto pullback = [&](const FlatFn& branch) -> FlatFn {
                     return [branch, targets, num_outputs, k](std::span<const TensorBase> args_and_g) {
                       std::vector<TensorBase> cots(num_outputs);
                       cots[k] = args_and_g.back();
                       return vjp_of(branch, args_and_g.first(args_and_g.size() - 1), cots, targets);
                     };
                   };
                   std::vector<TensorBase> args_and_g = operands;
                   args_and_g.push_back(g);
                   auto grads = cond_flat(pred, pullback(then_fn), pullback(else_fn), args_and_g, loc);
                   return place_grads(grads, operands, captures);
                 });
  return outs;
}

/// The loop's subgraphs, traced once.
struct TracedLoop {
  Subgraph body;
  std::optional<Subgraph> keep_going;

  /// Runs the loop on concrete carries; `states` (when given) receives the carry before
  /// every iteration, which is what the backward pass needs.
  std::vector<TensorBase> run(const LoopSpec& spec, std::vector<TensorBase> carry, std::span<const TensorBase> caps,
                              std::vector<std::vector<TensorBase>>* states = nullptr) const {
    auto body_caps = caps.first(body.captures.size());
    auto cond_caps = caps.subspan(body.captures.size());
    for (std::int64_t it = 0; spec.max_iters < 0 || it < spec.max_iters; ++it) {
      if (keep_going && !scalar_bool(keep_going->run(carry, cond_caps)[0])) break;
      if (states) states->push_back(carry);
      std::vector<TensorBase> args{scalar<std::int32_t>(static_cast<std::int32_t>(spec.lo + it))};
      args.insert(args.end(), carry.begin(), carry.end());
      carry = body.run(std::move(args), body_caps);
    }
    return carry;
  }
};

inline TracedLoop trace_loop(const LoopSpec& spec, const std::vector<TensorBase>& init) {
  std::vector<TensorBase> body_args{scalar<std::int32_t>(0)};
  body_args.insert(body_args.end(), init.begin(), init.end());
  TracedLoop loop{trace_subgraph(xgrad::detail::concat(spec.op(), "_body"), spec.body, body_args), std::nullopt};
  if (types_of(loop.body.outputs) != types_of(init))
    throw_shape_error(spec.op(), spec.loc, "the body returns ", types_text(types_of(loop.body.outputs)),
                      " for a carry of ", types_text(types_of(init)), "; it must return the carry's types");
  if (spec.keep_going) {
    loop.keep_going = trace_subgraph(xgrad::detail::concat(spec.op(), "_cond"), spec.keep_going, init);
    if (loop.keep_going->outputs.size() != 1)
      throw_shape_error(spec.op(), spec.loc, "the condition must return one tensor");
    check_predicate(spec.op(), loop.keep_going->outputs[0], spec.loc);
  }
  return loop;
}

inline std::vector<TensorBase> loop_gradient(const LoopSpec& spec, const std::vector<TensorBase>& init,
                                             const std::vector<TensorBase>& captures, std::size_t k,
                                             const TensorBase& g);

/// The loop as ops, one iteration after another: eagerly, and in a graph traced inside vmap or
/// jvp (see transforms_active). A batched condition (vmap) keeps the loop going while it holds
/// for some value of the batch, and a value whose condition failed keeps its carry. Traced, the
/// condition's value is unknown, so a while_loop runs its max_iters iterations, each carry kept
/// from the iteration its condition fails on.
inline std::vector<TensorBase> loop_as_ops(const LoopSpec& spec, const std::vector<TensorBase>& init) {
  const bool traced = Tracer::active() != nullptr;
  if (traced && spec.keep_going && spec.max_iters < 0)
    throw ValueError(xgrad::detail::op_message(
        op::While::name, spec.loc,
        "inside vmap or jvp under jit a while_loop runs as ops, iteration by iteration up to a bound, and this "
        "one has none: pass {.max_iters = N}"));
  std::vector<TensorBase> carry = init;
  for (std::int64_t it = 0; spec.max_iters < 0 || it < spec.max_iters; ++it) {
    std::optional<Tensor<bool>> holds;  // where the body's result replaces the carry
    if (spec.keep_going) {
      auto c = spec.keep_going(carry);
      check_predicate(spec.op(), c.at(0), spec.loc);
      if (!traced && !scalar_bool(holds_anywhere(c[0]))) break;
      if (traced || c[0].impl()->physical) holds = reshape(Tensor<bool>(c[0]), std::vector<std::int64_t>{}, spec.loc);
    }
    std::vector<TensorBase> args{scalar<std::int32_t>(static_cast<std::int32_t>(spec.lo + it))};
    args.insert(args.end(), carry.begin(), carry.end());
    auto next = spec.body(args);
    if (types_of(next) != types_of(init))
      throw_shape_error(spec.op(), spec.loc, "the body returns ", types_text(types_of(next)), " for a carry of ",
                        types_text(types_of(init)), "; it must return the carry's types");
    if (holds)
      for (std::size_t k = 0; k < next.size(); ++k) next[k] = select(*holds, next[k], carry[k], spec.loc);
    carry = std::move(next);
  }
  return carry;
}

XGRAD_API std::vector<TensorBase> loop_flat(const LoopSpec& spec, const std::vector<TensorBase>& init) {
  auto* tracer = Tracer::active();
  if (!tracer || transforms_active()) return loop_as_ops(spec, init);
  xgrad::detail::OpScope scope(spec.op(), spec.loc, {});
  TracedLoop loop = trace_loop(spec, init);
  std::vector<TensorBase> inputs = init;
  inputs.insert(inputs.end(), loop.body.captures.begin(), loop.body.captures.end());
  if (loop.keep_going) inputs.insert(inputs.end(), loop.keep_going->captures.begin(), loop.keep_going->captures.end());
  const std::size_t n = init.size();
  auto kernel = [spec, loop, n](std::span<const TensorBase> in, std::span<TensorBase> out) {
    auto result =
        loop.run(spec, std::vector<TensorBase>(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(n)), in.subspan(n));
    std::copy(result.begin(), result.end(), out.begin());
  };
  auto primitive = spec.fori ? ir::make_primitive(op::ForiLoop{spec.lo, spec.max_iters})
                             : ir::make_primitive(op::While{spec.max_iters});
  std::vector<std::shared_ptr<const ir::Graph>> subgraphs{loop.body.graph};
  if (loop.keep_going) subgraphs.push_back(loop.keep_going->graph);
  auto outs = tracer->emit(std::move(primitive), spec.loc, inputs, types_of(init), kernel, {}, subgraphs);
  std::vector<TensorBase> captures(inputs.begin() + static_cast<std::ptrdiff_t>(n), inputs.end());
  record_outputs(spec.op(), spec.loc, inputs, outs, [spec, init, captures](std::size_t k, const TensorBase& g) {
    auto grads = loop_gradient(spec, init, captures, k, g);
    return place_grads(grads, init, captures);
  });
  return outs;
}

/// The gradient of output k of a traced loop: a graph op that runs the loop again keeping
/// the carry of every iteration, then runs the body's pullback from the last iteration back.
inline std::vector<TensorBase> loop_gradient(const LoopSpec& spec, const std::vector<TensorBase>& init,
                                             const std::vector<TensorBase>& captures, std::size_t k,
                                             const TensorBase& g) {
  if (spec.keep_going && spec.max_iters < 0)
    throw AutogradError(
        xgrad::detail::op_message(op::While::name, spec.loc,
                                  "reverse-mode gradients of a traced while_loop need a bound on its iterations; pass "
                                  "{.max_iters = N} (the backward pass keeps the carry of each iteration)"));
  const std::size_t n = init.size();
  if (transforms_active()) {  // a batched or tangent-carrying cotangent: differentiate the loop as ops
    std::vector<TensorBase> cots(n);
    cots[k] = g;
    const FlatFn as_ops = [spec](std::span<const TensorBase> in) {
      return loop_as_ops(spec, std::vector<TensorBase>(in.begin(), in.end()));
    };
    return vjp_of(as_ops, init, cots, requiring_grad(captures));
  }
  if (is_grad_enabled())
    throw AutogradError(xgrad::detail::op_message(spec.op(), spec.loc,
                                                  "gradients of gradients through a traced loop are not supported"));
  auto targets = requiring_grad(captures);
  std::vector<std::size_t> float_carries;
  for (std::size_t j = 0; j < n; ++j)
    if (is_float(init[j])) float_carries.push_back(j);
  // (i, carry..., cotangent of each float carry...) -> (cotangents one iteration earlier..., target grads...)
  FlatFn pullback = [spec, n, float_carries, targets](std::span<const TensorBase> in) {
    std::vector<TensorBase> cots(n);
    for (std::size_t j = 0; j < float_carries.size(); ++j) cots[float_carries[j]] = in[1 + n + j];
    return vjp_of(spec.body, in.first(1 + n), cots, targets);
  };
  std::vector<TensorBase> pullback_args{scalar<std::int32_t>(0)};
  pullback_args.insert(pullback_args.end(), init.begin(), init.end());
  for (std::size_t j : float_carries) pullback_args.push_back(init[j]);
  Subgraph back = trace_subgraph(xgrad::detail::concat(spec.op(), "_pullback"), pullback, pullback_args);
  TracedLoop loop = trace_loop(spec, init);

  std::vector<TensorBase> inputs = init;
  inputs.push_back(g);
  inputs.insert(inputs.end(), captures.begin(), captures.end());
  inputs.insert(inputs.end(), back.captures.begin(), back.captures.end());
  const std::size_t num_caps = captures.size();
  Types types;
  for (std::size_t j : float_carries) types.emplace_back(init[j].dtype(), init[j].shape());
  for (const auto& t : targets) types.emplace_back(t.dtype(), t.shape());
  Types target_types = types_of(targets);
  auto kernel = [spec, loop, back, n, k, num_caps, float_carries, target_types](std::span<const TensorBase> in,
                                                                                std::span<TensorBase> out) {
    std::vector<std::vector<TensorBase>> states;
    auto caps = in.subspan(n + 1, num_caps);
    loop.run(spec, std::vector<TensorBase>(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(n)), caps, &states);
    std::vector<TensorBase> cots;
    for (std::size_t j : float_carries) cots.push_back(j == k ? in[n] : zeros_of(in[j]));
    const std::size_t nf = float_carries.size();
    std::vector<TensorBase> target_grads;
    for (std::size_t it = states.size(); it-- > 0;) {
      std::vector<TensorBase> args{
          scalar<std::int32_t>(static_cast<std::int32_t>(spec.lo + static_cast<std::int64_t>(it)))};
      args.insert(args.end(), states[it].begin(), states[it].end());
      args.insert(args.end(), cots.begin(), cots.end());
      auto res = back.run(std::move(args), in.subspan(n + 1 + num_caps));
      std::copy(res.begin(), res.begin() + static_cast<std::ptrdiff_t>(nf), cots.begin());
      if (target_grads.empty())
        target_grads.assign(res.begin() + static_cast<std::ptrdiff_t>(nf), res.end());
      else
        for (std::size_t t = 0; t < target_grads.size(); ++t) accumulate(target_grads[t], res[nf + t]);
    }
    std::copy(cots.begin(), cots.end(), out.begin());
    // A loop that ran no iteration passes no gradient to what its body reads.
    for (std::size_t t = 0; t < target_types.size(); ++t)
      out[nf + t] =
          t < target_grads.size() ? target_grads[t] : zeros_of_type(target_types[t].first, target_types[t].second);
  };
  auto primitive = spec.fori ? ir::make_primitive(op::ForiLoopGrad{}) : ir::make_primitive(op::WhileGrad{});
  return Tracer::active()->emit(std::move(primitive), spec.loc, inputs, types, kernel, {},
                                {loop.body.graph, back.graph});
}

}  // namespace xgrad::tracing::detail
