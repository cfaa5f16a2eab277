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

/// A tensor of the given type whose values are never read: an argument to trace a body on, or
/// a stack of no rows.
inline TensorBase uninitialized(DType dtype, const Shape& shape) {
  return visit_element(dtype, [&]<class T>() { return TensorBase(Tensor<T>::empty(shape)); });
}

/// x's shape without its leading axis: the type of a scan's x_t.
inline Shape row_shape(const TensorBase& x) { return Shape(x.shape().begin() + 1, x.shape().end()); }

/// Row i of x along its leading axis (a scan's x_t), the slice vmap takes for one value.
inline TensorBase row(const TensorBase& x, std::int64_t i, SourceLoc loc) {
  return visit_element(x.dtype(),
                       [&]<class T>() { return TensorBase(xgrad::detail::value_of_batch(Tensor<T>(x), i, loc)); });
}

/// The body's arguments at index i: (i, carry..., row i of each of xs...).
inline std::vector<TensorBase> body_args(std::int64_t i, std::span<const TensorBase> carry,
                                         std::span<const TensorBase> xs, SourceLoc loc) {
  std::vector<TensorBase> args{scalar<std::int32_t>(static_cast<std::int32_t>(i))};
  args.insert(args.end(), carry.begin(), carry.end());
  for (const auto& x : xs) args.push_back(row(x, i, loc));
  return args;
}

/// Arguments typed as the body's, to trace it on: xs may have no row to take.
inline std::vector<TensorBase> body_arg_types(std::span<const TensorBase> carry, std::span<const TensorBase> xs) {
  std::vector<TensorBase> args{scalar<std::int32_t>(0)};
  args.insert(args.end(), carry.begin(), carry.end());
  for (const auto& x : xs) args.push_back(uninitialized(x.dtype(), row_shape(x)));
  return args;
}

/// A scan's ys from what each step returned past the carry (in the order the steps ran): each
/// y_t stacked at its row t. `types` are one step's, for a scan of no steps.
inline std::vector<TensorBase> stack_rows(const LoopSpec& spec, const std::vector<std::vector<TensorBase>>& steps,
                                          const Types& types) {
  std::vector<TensorBase> ys;
  for (std::size_t j = 0; j < types.size(); ++j) {
    if (steps.empty()) {
      ys.push_back(uninitialized(types[j].first, xgrad::detail::with_batch(0, types[j].second)));
      continue;
    }
    ys.push_back(visit_element(types[j].first, [&]<class T>() {
      std::vector<Tensor<T>> rows(steps.size());
      for (std::size_t it = 0; it < steps.size(); ++it)
        rows[static_cast<std::size_t>(spec.index(static_cast<std::int64_t>(it)))] = Tensor<T>(steps[it][j]);
      return TensorBase(stack(rows, 0, spec.loc));
    }));
  }
  return ys;
}

/// Throws unless the carry a body returns has the initial carry's types: its outputs, or a
/// scan's first ones (y_t follow; xg::scan checks that its body returns as many carry tensors).
inline void check_carry(const LoopSpec& spec, std::span<const TensorBase> outs, std::span<const TensorBase> init) {
  const auto carry = spec.kind == LoopKind::scan ? outs.first(init.size()) : outs;
  if (types_of(carry) != types_of(init))
    throw_shape_error(spec.op(), spec.loc, "the body returns ", types_text(types_of(carry)), " for a carry of ",
                      types_text(types_of(init)), "; it must return the carry's types");
}

inline std::shared_ptr<const ir::Primitive> loop_primitive(const LoopSpec& spec) {
  if (spec.kind == LoopKind::fori) return ir::make_primitive(op::ForiLoop{spec.lo, spec.max_iters});
  if (spec.kind == LoopKind::scan) return ir::make_primitive(op::Scan{spec.max_iters, spec.reverse});
  return ir::make_primitive(op::While{spec.max_iters});
}

inline std::shared_ptr<const ir::Primitive> loop_gradient_primitive(const LoopSpec& spec) {
  if (spec.kind == LoopKind::fori) return ir::make_primitive(op::ForiLoopGrad{});
  if (spec.kind == LoopKind::scan) return ir::make_primitive(op::ScanGrad{});
  return ir::make_primitive(op::WhileGrad{});
}

XGRAD_API std::int64_t scan_length(std::span<const TensorBase> xs, SourceLoc loc) {
  if (xs.empty())
    throw_shape_error(op::Scan::name, loc, "xs holds no tensor: the steps are the rows of its leading axis");
  for (std::size_t j = 0; j < xs.size(); ++j) {
    if (xs[j].ndim() == 0)
      throw_shape_error(op::Scan::name, loc, "xs must have a leading axis to scan over, got a scalar ",
                        ir::type_str(xs[j].dtype(), xs[j].shape()),
                        xs.size() > 1 ? xgrad::detail::concat(" (tensor ", j, " of xs)") : std::string());
    if (xs[j].shape()[0] != xs[0].shape()[0])
      throw_shape_error(op::Scan::name, loc,
                        "the tensors of xs must have one leading axis (the number of steps): tensor 0 is ",
                        ir::type_str(xs[0].dtype(), xs[0].shape()), ", tensor ", j, " is ",
                        ir::type_str(xs[j].dtype(), xs[j].shape()));
  }
  return xs[0].shape()[0];
}

/// The loop's subgraphs, traced once.
struct TracedLoop {
  Subgraph body;
  std::optional<Subgraph> keep_going;

  /// Runs the loop on concrete carries and xs, returning the last carry, then a scan's ys;
  /// `states` (when given) receives the carry before every iteration, which is what the
  /// backward pass needs.
  std::vector<TensorBase> run(const LoopSpec& spec, std::vector<TensorBase> carry, std::span<const TensorBase> xs,
                              std::span<const TensorBase> caps,
                              std::vector<std::vector<TensorBase>>* states = nullptr) const {
    auto body_caps = caps.first(body.captures.size());
    auto cond_caps = caps.subspan(body.captures.size());
    const auto n = static_cast<std::ptrdiff_t>(carry.size());
    std::vector<std::vector<TensorBase>> steps;  // a scan's y_t, step by step
    for (std::int64_t it = 0; spec.max_iters < 0 || it < spec.max_iters; ++it) {
      if (keep_going && !scalar_bool(keep_going->run(carry, cond_caps)[0])) break;
      if (states) states->push_back(carry);
      auto out = body.run(body_args(spec.index(it), carry, xs, spec.loc), body_caps);
      if (spec.kind == LoopKind::scan) steps.emplace_back(out.begin() + n, out.end());
      out.erase(out.begin() + n, out.end());
      carry = std::move(out);
    }
    auto ys = stack_rows(spec, steps, types_of(std::span(body.outputs).subspan(carry.size())));
    carry.insert(carry.end(), ys.begin(), ys.end());
    return carry;
  }
};

inline TracedLoop trace_loop(const LoopSpec& spec, std::span<const TensorBase> init, std::span<const TensorBase> xs) {
  TracedLoop loop{trace_subgraph(xgrad::detail::concat(spec.op(), "_body"), spec.body, body_arg_types(init, xs)),
                  std::nullopt};
  check_carry(spec, loop.body.outputs, init);
  if (spec.keep_going) {
    loop.keep_going = trace_subgraph(xgrad::detail::concat(spec.op(), "_cond"), spec.keep_going, init);
    if (loop.keep_going->outputs.size() != 1)
      throw_shape_error(spec.op(), spec.loc, "the condition must return one tensor");
    check_predicate(spec.op(), loop.keep_going->outputs[0], spec.loc);
  }
  return loop;
}

inline std::vector<TensorBase> loop_gradient(const LoopSpec& spec, const std::vector<TensorBase>& operands,
                                             std::size_t n, const std::vector<TensorBase>& captures,
                                             std::size_t num_outputs, std::size_t k, const TensorBase& g);

/// The loop as ops, one iteration after another: eagerly, and in a graph traced inside vmap or
/// jvp (see transforms_active). A batched condition (vmap) keeps the loop going while it holds
/// for some value of the batch, and a value whose condition failed keeps its carry. Traced, the
/// condition's value is unknown, so a while_loop runs its max_iters iterations, each carry kept
/// from the iteration its condition fails on.
inline std::vector<TensorBase> loop_as_ops(const LoopSpec& spec, const std::vector<TensorBase>& init,
                                           std::span<const TensorBase> xs) {
  const bool traced = Tracer::active() != nullptr;
  if (traced && spec.keep_going && spec.max_iters < 0)
    throw ValueError(xgrad::detail::op_message(
        op::While::name, spec.loc,
        "inside vmap or jvp under jit a while_loop runs as ops, iteration by iteration up to a bound, and this "
        "one has none: pass {.max_iters = N}"));
  const auto n = static_cast<std::ptrdiff_t>(init.size());
  std::vector<TensorBase> carry = init;
  std::vector<std::vector<TensorBase>> steps;  // a scan's y_t, step by step
  for (std::int64_t it = 0; spec.max_iters < 0 || it < spec.max_iters; ++it) {
    std::optional<Tensor<bool>> holds;  // where the body's result replaces the carry
    if (spec.keep_going) {
      auto c = spec.keep_going(carry);
      check_predicate(spec.op(), c.at(0), spec.loc);
      if (!traced && !scalar_bool(holds_anywhere(c[0]))) break;
      if (traced || c[0].impl()->physical) holds = reshape(Tensor<bool>(c[0]), std::vector<std::int64_t>{}, spec.loc);
    }
    auto next = spec.body(body_args(spec.index(it), carry, xs, spec.loc));
    check_carry(spec, next, init);
    if (holds)
      for (std::size_t k = 0; k < carry.size(); ++k) next[k] = select(*holds, next[k], carry[k], spec.loc);
    if (spec.kind == LoopKind::scan) {
      steps.emplace_back(next.begin() + n, next.end());
      next.erase(next.begin() + n, next.end());
      if (types_of(steps.back()) != types_of(steps.front()))
        throw_shape_error(spec.op(), spec.loc, "the body returns y_t of types ", types_text(types_of(steps.back())),
                          " at step ", it, " but ", types_text(types_of(steps.front())), " at step 0");
    }
    carry = std::move(next);
  }
  if (spec.kind != LoopKind::scan) return carry;
  Types y_types;
  if (steps.empty()) {
    // A scan of no steps learns the types of y_t from a trace of its body (not differentiated).
    no_grad off;
    const Subgraph body = trace_loop(spec, init, xs).body;
    y_types = types_of(std::span(body.outputs).subspan(init.size()));
  } else {
    y_types = types_of(steps.front());
  }
  auto ys = stack_rows(spec, steps, y_types);
  carry.insert(carry.end(), ys.begin(), ys.end());
  return carry;
}

XGRAD_API std::vector<TensorBase> loop_flat(const LoopSpec& spec, const std::vector<TensorBase>& init,
                                            const std::vector<TensorBase>& xs) {
  auto* tracer = Tracer::active();
  if (!tracer || transforms_active()) return loop_as_ops(spec, init, xs);
  xgrad::detail::OpScope scope(spec.op(), spec.loc, {});
  TracedLoop loop = trace_loop(spec, init, xs);
  std::vector<TensorBase> operands = init;  // what the loop differentiates: the carry, then xs
  operands.insert(operands.end(), xs.begin(), xs.end());
  std::vector<TensorBase> inputs = operands;
  inputs.insert(inputs.end(), loop.body.captures.begin(), loop.body.captures.end());
  if (loop.keep_going) inputs.insert(inputs.end(), loop.keep_going->captures.begin(), loop.keep_going->captures.end());
  const std::size_t n = init.size(), m = operands.size();
  auto kernel = [spec, loop, n, m](std::span<const TensorBase> in, std::span<TensorBase> out) {
    auto result = loop.run(spec, std::vector<TensorBase>(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(n)),
                           in.subspan(n, m - n), in.subspan(m));
    std::copy(result.begin(), result.end(), out.begin());
  };
  Types types = types_of(loop.body.outputs);  // the carry, then a scan's y_t, which ys stacks
  for (std::size_t j = n; j < types.size(); ++j)
    types[j].second = xgrad::detail::with_batch(spec.max_iters, types[j].second);
  std::vector<std::shared_ptr<const ir::Graph>> subgraphs{loop.body.graph};
  if (loop.keep_going) subgraphs.push_back(loop.keep_going->graph);
  auto outs = tracer->emit(loop_primitive(spec), spec.loc, inputs, types, kernel, {}, subgraphs);
  std::vector<TensorBase> captures(inputs.begin() + static_cast<std::ptrdiff_t>(m), inputs.end());
  const std::size_t num_outputs = outs.size();
  record_outputs(spec.op(), spec.loc, inputs, outs,
                 [spec, operands, n, captures, num_outputs](std::size_t k, const TensorBase& g) {
                   auto grads = loop_gradient(spec, operands, n, captures, num_outputs, k, g);
                   return place_grads(grads, operands, captures);
                 });
  return outs;
}

/// The gradient of output k (of cotangent g) of a traced loop over `operands` (the carry, its
/// first n, then a scan's xs): a graph op that runs the loop again keeping the carry of every
/// iteration, then runs the body's pullback from the last iteration back. A scan's step also
/// gets the row of g for its y_t when g is for ys, and gives the row of the gradient of xs.
inline std::vector<TensorBase> loop_gradient(const LoopSpec& spec, const std::vector<TensorBase>& operands,
                                             std::size_t n, const std::vector<TensorBase>& captures,
                                             std::size_t num_outputs, std::size_t k, const TensorBase& g) {
  if (spec.keep_going && spec.max_iters < 0)
    throw AutogradError(
        xgrad::detail::op_message(op::While::name, spec.loc,
                                  "reverse-mode gradients of a traced while_loop need a bound on its iterations; pass "
                                  "{.max_iters = N} (the backward pass keeps the carry of each iteration)"));
  const auto init = std::span(operands).first(n), xs = std::span(operands).subspan(n);
  if (transforms_active()) {  // a batched or tangent-carrying cotangent: differentiate the loop as ops
    std::vector<TensorBase> cots(num_outputs);
    cots[k] = g;
    const FlatFn as_ops = [spec, n](std::span<const TensorBase> in) {
      return loop_as_ops(spec, std::vector<TensorBase>(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(n)),
                         in.subspan(n));
    };
    return vjp_of(as_ops, operands, cots, requiring_grad(captures));
  }
  if (is_grad_enabled())
    throw AutogradError(xgrad::detail::op_message(spec.op(), spec.loc,
                                                  "gradients of gradients through a traced loop are not supported"));
  auto targets = requiring_grad(captures);
  std::vector<std::size_t> float_carries;
  for (std::size_t j = 0; j < n; ++j)
    if (is_float(init[j])) float_carries.push_back(j);
  Types x_types;  // of each float x_t: the rows of the gradient of its xs
  for (const auto& x : xs)
    if (is_float(x)) x_types.emplace_back(x.dtype(), row_shape(x));
  const bool of_ys = k >= n;  // g is a scan's ys: each step gets its row as the cotangent of y_t
  const std::size_t num_args = 1 + operands.size();
  // (i, carry..., x_t..., cotangent of each float carry..., [cotangent of y_t]) ->
  // (cotangents one iteration earlier..., gradients of float x_t..., target grads...)
  FlatFn pullback = [spec, num_args, num_outputs, float_carries, of_ys, k, targets](std::span<const TensorBase> in) {
    std::vector<TensorBase> cots(num_outputs);
    for (std::size_t j = 0; j < float_carries.size(); ++j) cots[float_carries[j]] = in[num_args + j];
    if (of_ys) cots[k] = in.back();
    return vjp_of(spec.body, in.first(num_args), cots, targets);
  };
  std::vector<TensorBase> pullback_args = body_arg_types(init, xs);
  for (std::size_t j : float_carries) pullback_args.push_back(init[j]);
  if (of_ys) pullback_args.push_back(uninitialized(g.dtype(), row_shape(g)));
  Subgraph back = trace_subgraph(xgrad::detail::concat(spec.op(), "_pullback"), pullback, pullback_args);
  TracedLoop loop = trace_loop(spec, init, xs);

  std::vector<TensorBase> inputs = operands;
  inputs.push_back(g);
  inputs.insert(inputs.end(), captures.begin(), captures.end());
  inputs.insert(inputs.end(), back.captures.begin(), back.captures.end());
  const std::size_t m = operands.size(), num_caps = captures.size();
  Types types;
  for (std::size_t j : float_carries) types.emplace_back(init[j].dtype(), init[j].shape());
  for (const auto& x : xs)
    if (is_float(x)) types.emplace_back(x.dtype(), x.shape());
  for (const auto& t : targets) types.emplace_back(t.dtype(), t.shape());
  Types target_types = types_of(targets);
  auto kernel = [spec, loop, back, n, m, k, of_ys, num_caps, float_carries, x_types, target_types](
                    std::span<const TensorBase> in, std::span<TensorBase> out) {
    const auto xs = in.subspan(n, m - n);
    const TensorBase& g = in[m];
    std::vector<std::vector<TensorBase>> states;
    loop.run(spec, std::vector<TensorBase>(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(n)), xs,
             in.subspan(m + 1, num_caps), &states);
    std::vector<TensorBase> cots;
    for (std::size_t j : float_carries) cots.push_back(j == k ? g : zeros_of(in[j]));
    const std::size_t nf = float_carries.size(), nx = x_types.size();
    std::vector<std::vector<TensorBase>> x_grads(states.size());  // each step's, as steps of stack_rows
    std::vector<TensorBase> target_grads;
    for (std::size_t it = states.size(); it-- > 0;) {
      const std::int64_t i = spec.index(static_cast<std::int64_t>(it));
      auto args = body_args(i, states[it], xs, spec.loc);
      args.insert(args.end(), cots.begin(), cots.end());
      if (of_ys) args.push_back(row(g, i, spec.loc));
      const auto res = back.run(std::move(args), in.subspan(m + 1 + num_caps));
      const auto x_part = std::span(res).subspan(nf, nx), target_part = std::span(res).subspan(nf + nx);
      std::copy_n(res.begin(), nf, cots.begin());
      x_grads[it].assign(x_part.begin(), x_part.end());
      if (target_grads.empty())
        target_grads.assign(target_part.begin(), target_part.end());
      else
        for (std::size_t t = 0; t < target_grads.size(); ++t) accumulate(target_grads[t], target_part[t]);
    }
    std::copy(cots.begin(), cots.end(), out.begin());
    const auto stacked = stack_rows(spec, x_grads, x_types);
    std::copy(stacked.begin(), stacked.end(), out.subspan(nf).begin());
    // A loop that ran no iteration passes no gradient to what its body reads.
    for (std::size_t t = 0; t < target_types.size(); ++t)
      out[nf + nx + t] =
          t < target_grads.size() ? target_grads[t] : zeros_of_type(target_types[t].first, target_types[t].second);
  };
  return Tracer::active()->emit(loop_gradient_primitive(spec), spec.loc, inputs, types, kernel, {},
                                {loop.body.graph, back.graph});
}

}  // namespace xgrad::tracing::detail
