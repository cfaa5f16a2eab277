// Control flow that depends on tensor values: cond, while_loop, fori_loop, scan. Eagerly they
// are plain C++ branches and loops (the tape sees every op). While tracing they are graph ops
// whose branches and bodies are subgraphs, and their gradients are graph ops too.
#pragma once

#include <algorithm>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
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
struct Scan {
  static constexpr std::string_view name = "Scan";
  std::int64_t trips = 0;
  bool reverse = false;
  std::vector<ir::Attr> attrs() const {
    return {{"trips", std::to_string(trips)}, {"reverse", reverse ? "true" : "false"}};
  }
  bool operator==(const Scan&) const = default;
};
/// A traced loop's gradient: reruns the loop keeping each carry, then the body's pullback.
struct ForiLoopGrad {
  static constexpr std::string_view name = "ForiLoopGrad";
};
struct WhileGrad {
  static constexpr std::string_view name = "WhileGrad";
};
struct ScanGrad {
  static constexpr std::string_view name = "ScanGrad";
};
}  // namespace op

namespace tracing::detail {

/// cond over flat operand lists (see xg::cond).
XGRAD_API std::vector<TensorBase> cond_flat(const TensorBase& pred, const FlatFn& then_fn, const FlatFn& else_fn,
                                            const std::vector<TensorBase>& operands, SourceLoc loc);

enum class LoopKind { fori, while_loop, scan };

/// A loop over flat carries: `body` maps (i, carry..., x_t...) to (carry..., y_t...), where only
/// a scan has xs (x_t is row i of each) and ys (y_t stacked at row i); `keep_going` (when set)
/// maps carry to a bool scalar; at most `max_iters` iterations when that is not negative.
struct LoopSpec {
  LoopKind kind = LoopKind::fori;
  FlatFn body;
  FlatFn keep_going;
  std::int64_t lo = 0;
  std::int64_t max_iters = -1;
  SourceLoc loc;
  bool reverse = false;  // iterations run from the last index down (a scan's)

  std::string_view op() const {
    return kind == LoopKind::fori   ? xgrad::op::ForiLoop::name
           : kind == LoopKind::scan ? xgrad::op::Scan::name
                                    : xgrad::op::While::name;
  }
  /// The index iteration `it` runs at: a fori_loop's i, a scan's row.
  std::int64_t index(std::int64_t it) const { return reverse ? lo + max_iters - 1 - it : lo + it; }
};

/// A loop over flat carries (and a scan's xs): eagerly a C++ loop, traced a graph op. Returns
/// the last carry, then a scan's ys.
XGRAD_API std::vector<TensorBase> loop_flat(const LoopSpec& spec, const std::vector<TensorBase>& init,
                                            const std::vector<TensorBase>& xs = {});

/// The number of steps of a scan over xs: their common leading axis.
XGRAD_API std::int64_t scan_length(std::span<const TensorBase> xs, SourceLoc loc);

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
  LoopSpec spec{
      LoopKind::fori, loop_body<C, true>(body_fn, flat.statics), {}, lo, std::max<std::int64_t>(hi - lo, 0), loc};
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
  LoopSpec spec{
      LoopKind::while_loop, loop_body<C, false>(body_fn, flat.statics), keep_going, 0, options.max_iters, loc};
  return rebuild_carry<C>(loop_flat(spec, flat.tensors), flat.statics);
}

struct ScanOptions {
  /// Runs the steps from the last row of xs to the first; y_t still goes to row t of ys.
  bool reverse = false;
};

/// Scans step_fn over the leading axis of xs, as JAX's lax.scan: for t in [0, T),
/// (carry, y_t) = step_fn(carry, x_t) with x_t = xs[t]; returns {last carry, ys} where ys[t] = y_t,
/// stacked along a new leading axis. The carry is a tensor or a pair, tuple, array or vector of
/// them; so are xs (one leading T) and y_t. Eagerly a for loop; under jit a Scan node whose
/// gradient keeps the carry of every step.
template <class Step, class Carry, class Xs> auto scan(Step step_fn, const Carry& init, const Xs& xs,
                                                       ScanOptions options = {}, SourceLoc loc = SourceLoc::current()) {
  using namespace tracing::detail;
  using C = traced_t<Carry>;
  using X = traced_t<Xs>;
  using Out = std::invoke_result_t<Step&, C&, X&>;
  static_assert(
      requires { requires std::tuple_size<Out>::value == 2; },
      "scan: step_fn(carry, x_t) must return std::pair{new_carry, y_t}");
  using Y = traced_t<std::tuple_element_t<1, Out>>;
  Flat carry, rows;
  flatten(init, carry, std::string());
  flatten(xs, rows, std::string());
  const std::size_t n = carry.tensors.size();
  // Set by each run of the body: the container sizes of y_t, which ys takes.
  auto y_statics = std::make_shared<std::vector<std::int64_t>>();
  FlatFn body = [step_fn, n, carry_statics = carry.statics, x_statics = rows.statics, y_statics,
                 loc](std::span<const TensorBase> in) {
    Reader carry_in{in.subspan(1, n), carry_statics}, x_in{in.subspan(1 + n), x_statics};
    auto c = rebuild<C>(carry_in);
    auto x = rebuild<X>(x_in);
    auto [next, y] = step_fn(c, x);
    Flat out, y_out;
    flatten(next, out, std::string());
    // The loop checks the carry's types; where it ends and y_t starts only this knows.
    if (out.tensors.size() != n)
      throw_shape_error(op::Scan::name, loc, "the body returns a carry of ", out.tensors.size(),
                        " tensors for a carry of ", n, "; it must return the carry's types");
    flatten(y, y_out, std::string());
    *y_statics = y_out.statics;
    out.tensors.insert(out.tensors.end(), y_out.tensors.begin(), y_out.tensors.end());
    return out.tensors;
  };
  LoopSpec spec{LoopKind::scan, std::move(body), {}, 0, scan_length(rows.tensors, loc), loc, options.reverse};
  const auto outs = loop_flat(spec, carry.tensors, rows.tensors);
  Reader carry_out{std::span(outs).first(n), carry.statics}, ys_out{std::span(outs).subspan(n), *y_statics};
  auto last = rebuild<C>(carry_out);
  return std::pair<C, Y>{std::move(last), rebuild<Y>(ys_out)};
}

}  // namespace xgrad

#if !defined(XGRAD_COMPILED)
#include "xgrad/jit/control_flow-inl.hpp"
#endif
