// Control flow that depends on tensor values: cond, while_loop, fori_loop. Eagerly they are
// plain C++ branches and loops (the tape sees every op). While tracing they are graph ops
// whose branches and bodies are subgraphs, and their gradients are graph ops too.
#pragma once

#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "xgrad/core/config.hpp"
#include "xgrad/jit/function.hpp"
#include "xgrad/jit/tree.hpp"
#include "xgrad/ops/elementwise.hpp"

namespace xgrad {

namespace op {
struct Cond {
  static constexpr std::string_view name = "Cond";
};
struct ForiLoop {
  static constexpr std::string_view name = "ForiLoop";
  std::int64_t lo = 0, trips = 0;
  std::vector<ir::Attr> attrs() const { return {{"lo", std::to_string(lo)}, {"trips", std::to_string(trips)}}; }
  bool operator==(const ForiLoop&) const = default;
};
struct While {
  static constexpr std::string_view name = "While";
  std::int64_t max_iters = -1;  // -1: no bound
  std::vector<ir::Attr> attrs() const {
    if (max_iters < 0) return {};
    return {{"max_iters", std::to_string(max_iters)}};
  }
  bool operator==(const While&) const = default;
};
/// A traced loop's gradient: reruns the loop keeping each carry, then the body's pullback.
struct ForiLoopGrad {
  static constexpr std::string_view name = "ForiLoopGrad";
};
struct WhileGrad {
  static constexpr std::string_view name = "WhileGrad";
};
}  // namespace op

namespace tracing::detail {

/// cond over flat operand lists (see xg::cond).
XGRAD_API std::vector<TensorBase> cond_flat(const TensorBase& pred, const FlatFn& then_fn, const FlatFn& else_fn,
                                            const std::vector<TensorBase>& operands, SourceLoc loc);

/// A loop over flat carries: `body` maps (i, carry...) to carry; `keep_going` (when set)
/// maps carry to a bool scalar; at most `max_iters` iterations when that is not negative.
struct LoopSpec {
  bool fori = false;  // a ForiLoop, else a While
  FlatFn body;
  FlatFn keep_going;
  std::int64_t lo = 0;
  std::int64_t max_iters = -1;
  SourceLoc loc;

  std::string_view op() const { return fori ? xgrad::op::ForiLoop::name : xgrad::op::While::name; }
};

/// A loop over flat carries: eagerly a C++ loop, traced a graph op.
XGRAD_API std::vector<TensorBase> loop_flat(const LoopSpec& spec, const std::vector<TensorBase>& init);

}  // namespace tracing::detail

/// then_fn(operands...) where pred (a bool tensor of one element) is true, else
/// else_fn(operands...). Both must return the same types. Eagerly an if; under jit a Cond
/// node with both branches as subgraphs (differentiable).
template <class Then, class Else, class... Operands>
auto cond(Located<Tensor<bool>> pred, Then then_fn, Else else_fn, const Operands&... operands) {
  using namespace tracing::detail;
  using Out = std::invoke_result_t<Then&, traced_t<Operands>...>;
  static_assert(std::is_same_v<Out, std::invoke_result_t<Else&, traced_t<Operands>...>>,
                "cond: both branches must return the same type");
  Flat flat;
  (flatten(operands, flat, std::string()), ...);
  // The gradient rule may run these after cond returns: they hold copies, not references.
  auto out_statics = std::make_shared<std::vector<std::int64_t>>();
  auto wrap = [statics = flat.statics, out_statics](auto fn) -> FlatFn {
    return [fn, statics, out_statics](std::span<const TensorBase> in) {
      Reader reader{in, statics};
      auto typed = std::tuple<traced_t<Operands>...>{rebuild<traced_t<Operands>>(reader)...};
      Flat out;
      flatten(std::apply(fn, typed), out, std::string());
      *out_statics = out.statics;
      return out.tensors;
    };
  };
  auto outs = cond_flat(pred.value, wrap(then_fn), wrap(else_fn), flat.tensors, pred.loc);
  Reader reader{outs, *out_statics};
  return rebuild<Out>(reader);
}

namespace tracing::detail {

/// A loop body over a typed carry as a flat function of (i, carry...).
/// It holds copies: a gradient rule may run it after the loop function returned.
template <class Carry, bool PassIndex, class Body> FlatFn loop_body(Body body, std::vector<std::int64_t> statics) {
  return [body, statics](std::span<const TensorBase> in) {
    Reader reader{in.subspan(1), statics};
    auto carry = rebuild<Carry>(reader);
    Flat out;
    if constexpr (PassIndex)
      flatten(body(Tensor<std::int32_t>(in[0]), carry), out, std::string());
    else
      flatten(body(carry), out, std::string());
    return out.tensors;
  };
}

template <class Carry>
Carry rebuild_carry(const std::vector<TensorBase>& flat, const std::vector<std::int64_t>& statics) {
  Reader reader{flat, statics};
  return rebuild<Carry>(reader);
}

}  // namespace tracing::detail

/// body_fn(i, carry) for i in [lo, hi), i an int32 scalar tensor; returns the last carry (a
/// tensor, or a pair, tuple, array or vector of them). Eagerly a for loop; under jit a
/// ForiLoop node whose gradient keeps the carry of every iteration.
template <class Body, class Carry> tracing::detail::traced_t<Carry> fori_loop(std::int64_t lo, std::int64_t hi,
                                                                              Body body_fn, const Carry& init,
                                                                              SourceLoc loc = SourceLoc::current()) {
  using namespace tracing::detail;
  using C = traced_t<Carry>;
  constexpr std::int64_t kMin = std::numeric_limits<std::int32_t>::min(),
                         kMax = std::numeric_limits<std::int32_t>::max();
  if (lo < kMin || lo > kMax || hi < kMin || hi > kMax)
    throw ValueError(xgrad::detail::op_message(op::ForiLoop::name, loc, "lo (", lo, ") and hi (", hi,
                                               ") must fit int32: the loop index is an int32 tensor"));
  Flat flat;
  flatten(init, flat, std::string());
  LoopSpec spec{true, loop_body<C, true>(body_fn, flat.statics), {}, lo, std::max<std::int64_t>(hi - lo, 0), loc};
  return rebuild_carry<C>(loop_flat(spec, flat.tensors), flat.statics);
}

struct WhileOptions {
  /// Stops the loop after this many iterations (-1: no bound). Reverse-mode gradients of a
  /// traced while_loop need a bound.
  std::int64_t max_iters = -1;
};

/// Repeats carry = body_fn(carry) while cond_fn(carry) (a bool scalar tensor) is true.
/// Eagerly a while loop; under jit a While node with the condition and body as subgraphs.
template <class Cond, class Body, class Carry>
tracing::detail::traced_t<Carry> while_loop(Cond cond_fn, Body body_fn, const Carry& init, WhileOptions options = {},
                                            SourceLoc loc = SourceLoc::current()) {
  using namespace tracing::detail;
  using C = traced_t<Carry>;
  if (options.max_iters < -1)
    throw ValueError(xgrad::detail::op_message(
        op::While::name, loc, "WhileOptions::max_iters must be -1 (no bound) or a count of 0 or more, got ",
        options.max_iters));
  Flat flat;
  flatten(init, flat, std::string());
  FlatFn keep_going = [cond_fn, statics = flat.statics](std::span<const TensorBase> in) {
    Reader reader{in, statics};
    return std::vector<TensorBase>{cond_fn(rebuild<C>(reader))};
  };
  LoopSpec spec{false, loop_body<C, false>(body_fn, flat.statics), keep_going, 0, options.max_iters, loc};
  return rebuild_carry<C>(loop_flat(spec, flat.tensors), flat.statics);
}

}  // namespace xgrad

#if !defined(XGRAD_COMPILED)
#include "xgrad/jit/control_flow-inl.hpp"
#endif
