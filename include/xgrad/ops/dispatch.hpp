// The one path every op call takes: shape rule, kernel, and (when asked) a tape record.
// Elementwise ops only describe themselves (ops/elementwise.hpp); these drivers run them.
#pragma once

#include <array>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "xgrad/autograd/node.hpp"
#include "xgrad/backend/cpu/elementwise.hpp"
#include "xgrad/core/tensor.hpp"

namespace xgrad {

/// Properties of an op that graph passes match on.
struct OpTraits {
  bool elementwise = false;
  bool commutative = false;
  bool linear = false;  // f(a x + b y) = a f(x) + b f(y) in each input
};

namespace detail {

/// "x: Float32[3, 32], y: Float32[4]": what every shape error lists.
inline std::string describe_inputs(std::initializer_list<std::pair<std::string_view, const TensorBase*>> inputs) {
  std::string out;
  for (auto& [label, t] : inputs) {
    if (!out.empty()) out += ", ";
    out += detail::concat(label, ": ", dtype_name(t->dtype()), t->shape());
  }
  return out;
}

/// True when an op on these inputs must be recorded for autodiff.
template <class... Ts> bool should_record(const Ts&... inputs) {
  return is_grad_enabled() && (inputs.impl()->requires_grad() || ...);
}

using TensorRefs = std::initializer_list<std::reference_wrapper<const TensorBase>>;

/// Links `out` to the inputs in [first, last) on the tape. `saved` are the tensors the rule
/// reads (their versions are checked at backward); `reads_output` keeps out's buffer for it.
template <class It> void record_range(const TensorBase& out, std::string_view op, SourceLoc loc, It first, It last,
                                      TensorRefs saved, bool reads_output,
                                      std::function<autograd::Grads(const TensorBase&, const TensorBase&)> rule) {
  auto node = std::make_shared<autograd::Node>();
  node->op = op;
  node->loc = loc;
  node->inputs.reserve(static_cast<std::size_t>(std::distance(first, last)));
  for (; first != last; ++first) {
    const TensorBase& in = *first;
    node->inputs.push_back({in.impl()->requires_grad() ? in.impl()->autograd : nullptr, in.shape()});
  }
  node->saved.reserve(saved.size());
  for (const TensorBase& s : saved) node->saved.push_back({s.impl()->storage, s.version()});
  if (reads_output) {
    node->out_storage = out.impl()->storage;
    node->out_version = out.version();
  }
  node->out_shape = out.shape();
  node->out_dtype = out.dtype();
  node->rule = std::move(rule);
  auto meta = std::make_shared<AutogradMeta>();
  meta->requires_grad = true;
  meta->grad_fn = std::move(node);
  out.impl()->autograd = std::move(meta);
}

/// record_range over a braced list of inputs: the common case.
inline void record(const TensorBase& out, std::string_view op, SourceLoc loc, TensorRefs inputs, TensorRefs saved,
                   bool reads_output, std::function<autograd::Grads(const TensorBase&, const TensorBase&)> rule) {
  record_range(out, op, loc, inputs.begin(), inputs.end(), saved, reads_output, std::move(rule));
}

/// Runs unary elementwise op Op: out[i] = Op::apply(x[i]).
template <class Op, class T> Tensor<T> unary(const Tensor<T>& x, SourceLoc loc) {
  auto out = Tensor<T>::empty(x.shape());
  cpu::map_unary<Op>(x.data(), out.data(), x.numel());
  if constexpr (FloatingPoint<T>) {
    if (should_record(x)) {
      // Keep the input alive only for rules that read it.
      Tensor<T> kept = Op::reads_inputs ? x : Tensor<T>();
      record(out, Op::name, loc, {x}, Op::reads_inputs ? TensorRefs{x} : TensorRefs{}, Op::reads_output,
             [kept](const TensorBase& y, const TensorBase& g) {
               return autograd::Grads{Op::grad(kept, Tensor<T>(y), Tensor<T>(g))};
             });
    }
  }
  return out;
}

/// The broadcast shape of a and b, or a ShapeError naming op, both inputs and the caller.
inline Shape broadcast_or_throw(std::string_view op, const TensorBase& a, const TensorBase& b, SourceLoc loc) {
  Shape out;
  if (!try_broadcast(a.shape(), b.shape(), out))
    throw_shape_error(op, loc, "shapes ", a.shape(), " and ", b.shape(), " cannot be broadcast together (inputs ",
                      describe_inputs({{"x", &a}, {"y", &b}}), ")");
  return out;
}

/// Runs binary elementwise op Op with NumPy broadcasting: out = Op::apply(a, b).
template <class Op, class T>
Tensor<typename Op::template result<T>> binary(const Tensor<T>& a, const Tensor<T>& b, SourceLoc loc) {
  using R = typename Op::template result<T>;
  Shape shape = broadcast_or_throw(Op::name, a, b, loc);
  auto out = Tensor<R>::empty(shape);
  cpu::map_binary<Op>(cpu::BroadcastPlan<2>(shape, {&a.shape(), &b.shape()}), a.data(), b.data(), out.data());
  if constexpr (FloatingPoint<T> && FloatingPoint<R>) {
    if (should_record(a, b)) {
      Tensor<T> ka = Op::reads_inputs ? a : Tensor<T>(), kb = Op::reads_inputs ? b : Tensor<T>();
      record(out, Op::name, loc, {a, b}, Op::reads_inputs ? TensorRefs{a, b} : TensorRefs{}, Op::reads_output,
             [ka, kb](const TensorBase& y, const TensorBase& g) {
               auto [ga, gb] = Op::grad(ka, kb, Tensor<T>(y), Tensor<T>(g));
               return autograd::Grads{ga, gb};
             });
    }
  }
  return out;
}

}  // namespace detail
}  // namespace xgrad
