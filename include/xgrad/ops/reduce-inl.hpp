// Definitions of ops/reduce.hpp: included by it when header-only, compiled once into the
// library (src/ops_shape.cpp) otherwise.
#pragma once

#include <algorithm>
#include <array>
#include <limits>
#include <string>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "xgrad/backend/cpu/reduce.hpp"
#include "xgrad/backend/kernels.hpp"
#include "xgrad/core/factory.hpp"
#include "xgrad/ops/dispatch.hpp"
#include "xgrad/ops/elementwise.hpp"
#include "xgrad/ops/manipulation.hpp"
#include "xgrad/ops/reduce.hpp"

namespace xgrad {

namespace detail {
/// One column (o, r) of a running sum along the middle extent of [outer, extent, inner].
template <class T> struct CumSumColumn {
  const T* x;
  T* out;
  std::int64_t extent, inner;
  bool reverse;
  XGRAD_HD void operator()(std::int64_t column) const {
    const std::int64_t base = column / inner * extent * inner + column % inner;
    T acc = T(0);
    for (std::int64_t k = 0; k < extent; ++k) {
      const std::int64_t at = base + (reverse ? extent - 1 - k : k) * inner;
      acc = math::add(acc, x[at]);  // integers wrap
      out[at] = acc;
    }
  }
};
}  // namespace detail

namespace op {

struct SumReducer {
  template <class T> XGRAD_HD static T identity() { return T(0); }
  template <class V> XGRAD_HD static V combine(const V& a, const V& b) { return math::add(a, b); }  // ints wrap
  template <class B> static auto horizontal(const B& b) { return xsimd::hadd(b); }
};

template <class Select> struct ExtremumReducer {
  template <class B> static auto horizontal(const B& b) {
    alignas(64) typename B::value_type lanes[B::size];
    b.store_aligned(lanes);
    auto acc = lanes[0];
    for (std::size_t i = 1; i < B::size; ++i) acc = Select::combine(acc, lanes[i]);
    return acc;
  }
};
// NaN propagates (math::max, math::min): the max or min of a group holding a NaN is NaN, as in
// NumPy and PyTorch, and as argmax and max pooling, which point at the first NaN.
struct MaxReducer : ExtremumReducer<MaxReducer> {
  template <class T> XGRAD_HD static T identity() { return std::numeric_limits<T>::lowest(); }
  template <class V> XGRAD_HD static V combine(const V& a, const V& b) { return math::max(a, b); }
};
struct MinReducer : ExtremumReducer<MinReducer> {
  template <class T> XGRAD_HD static T identity() { return std::numeric_limits<T>::max(); }
  template <class V> XGRAD_HD static V combine(const V& a, const V& b) { return math::min(a, b); }
};

}  // namespace op

namespace detail {

/// Reduces x with R down to `kept`, which has x's rank (or fewer leading axes) and 1 on each
/// reduced axis, into `dest` when defined (see output()). Alternating runs of kept and reduced
/// axes are reduced one run per pass, innermost first; the last pass writes the result.
template <class R, class T> Tensor<T> reduce_to(const Tensor<T>& x, const Shape& kept, const TensorBase& dest) {
  const int lead = x.ndim() - kept.ndim();
  std::array<bool, kMaxRank> reduced_axis{};
  for (int i = 0; i < x.ndim(); ++i) reduced_axis[i] = i < lead || (kept[i - lead] == 1 && x.shape()[i] != 1);
  const Device device = x.device();
  const T* src = x.data();
  Tensor<T> cur;  // the latest pass's result
  Shape cur_shape = x.shape();
  for (int end = x.ndim(); end > 0;) {
    if (!reduced_axis[end - 1]) {
      --end;
      continue;
    }
    int begin = end;
    while (begin > 0 && reduced_axis[begin - 1]) --begin;
    std::int64_t outer = 1, reduced = 1, inner = 1;
    for (int i = 0; i < begin; ++i) outer *= cur_shape[i];
    for (int i = begin; i < end; ++i) {
      reduced *= cur_shape[i];
      cur_shape[i] = 1;
    }
    for (int i = end; i < x.ndim(); ++i) inner *= cur_shape[i];
    const bool last = std::none_of(reduced_axis.begin(), reduced_axis.begin() + begin, [](bool r) { return r; });
    Tensor<T> next = last ? output<T>(dest, kept, device) : Tensor<T>::empty(cur_shape, device);
    // An empty result needs no pass: the kernel would still walk the reduced extent ([2^40, 0] over axis 0).
    if (next.numel() > 0) kernels::reduce<R>(device, src, next.data(), outer, reduced, inner);
    cur = std::move(next);  // src may point into the old cur until here
    src = cur.data();
    end = begin;
  }
  if (cur.defined()) return cur;
  // Nothing to reduce: the same elements.
  if (!dest.defined()) return Tensor<T>(std::make_shared<TensorImpl>(kept, x.dtype(), x.impl()->storage));
  Tensor<T> out(dest);
  copy_bytes(out.data(), device, x.data(), device, static_cast<std::size_t>(x.numel()) * sizeof(T));
  return out;
}

}  // namespace detail

namespace op {

/// The reductions to a shape that keeps the reduced axes as 1s (sum, max and min over any axes
/// are these, reshaped when keepdims is false).
template <class Reducer> struct ReduceTo {
  using reducer = Reducer;
  Shape shape;
  std::vector<ir::Attr> attrs() const { return {{"shape", shape.str()}}; }
  bool operator==(const ReduceTo&) const = default;
  Shape output_shape() const { return shape; }
  template <class T> void run(Device, const Tensor<T>& x, Tensor<T>& out) const {
    detail::reduce_to<Reducer>(x, shape, out);
  }
};

/// Sums over the broadcast axes: broadcast_to's adjoint.
struct SumTo : ReduceTo<SumReducer> {
  static constexpr std::string_view name = "SumTo";
  Shape from;  // the input's shape, which the gradient broadcasts back to
  bool operator==(const SumTo&) const = default;
  /// Each value summed to `shape`, which may have fewer axes than it: the batch's target has
  /// them as 1s after the batch axis, then dropped.
  template <class R, class T> Tensor<R> batch(std::span<const bool>, SourceLoc loc, const Tensor<T>& x) const {
    const std::int64_t size = x.shape()[0];
    Shape target{size};
    for (int i = shape.ndim(); i < from.ndim(); ++i) target.push_back(1);
    for (std::int64_t d : shape) target.push_back(d);
    const Tensor<R> summed = detail::apply<R>(SumTo{{target}, x.shape()}, loc, x);
    return target.ndim() == shape.ndim() + 1 ? summed
                                             : reshape(summed, detail::with_batch(size, shape).to_vector(), loc);
  }
  static constexpr Needs<1> differentiable{true}, saved{false};
  static constexpr bool multilinear = true;
  template <class T> autograd::Grads grad(const Tensor<T>& g, Needs<1>, SourceLoc loc, const Tensor<T>&) const {
    return {broadcast_to(g, from, loc)};
  }
};

/// max or min: the gradient is shared evenly between tied extrema, or between the NaNs of a
/// group whose result is NaN (as PyTorch's).
template <class Reducer> struct Extremum : ReduceTo<Reducer> {
  static constexpr Needs<1> differentiable{true}, saved{true};
  static constexpr bool reads_output = true;
  /// 1 where x holds its group's result y (a NaN where y is NaN), else 0.
  template <class T> static Tensor<T> holders(const Tensor<T>& x, const Tensor<T>& y, SourceLoc loc) {
    const auto x_nan = equal(equal(x, x, loc), false, loc);
    return cast<T>(where(equal(y, y, loc), equal(x, y, loc), x_nan, loc), loc);
  }
  template <class T>
  autograd::Grads grad(const Tensor<T>& g, const Tensor<T>& y, Needs<1>, SourceLoc loc, const Tensor<T>& x) const {
    const auto mask = holders(x, y, loc);
    return {g * mask / sum_to(mask, y.shape(), loc)};
  }
  /// The mean of the holders' tangents: grad's transpose.
  template <class T>
  Tensor<T> jvp(std::span<const TensorBase> t, SourceLoc loc, const Tensor<T>& y, const Tensor<T>& x) const {
    const auto mask = holders(x, y, loc);
    return sum_to(Tensor<T>(t[0]) * mask, y.shape(), loc) / sum_to(mask, y.shape(), loc);
  }
};
struct ReduceMax : Extremum<MaxReducer> {
  static constexpr std::string_view name = "ReduceMax";
  bool operator==(const ReduceMax&) const = default;
  template <class R, class T> Tensor<R> batch(std::span<const bool>, SourceLoc loc, const Tensor<T>& x) const {
    return detail::apply<R>(ReduceMax{{detail::with_batch(x.shape()[0], shape)}}, loc, x);
  }
};
struct ReduceMin : Extremum<MinReducer> {
  static constexpr std::string_view name = "ReduceMin";
  bool operator==(const ReduceMin&) const = default;
  template <class R, class T> Tensor<R> batch(std::span<const bool>, SourceLoc loc, const Tensor<T>& x) const {
    return detail::apply<R>(ReduceMin{{detail::with_batch(x.shape()[0], shape)}}, loc, x);
  }
};

/// Running sums along `axis`, from its start (or with `reverse` from its end). Linear: its
/// gradient is the running sum of g the other way.
struct CumSum {
  static constexpr std::string_view name = "CumSum";
  int axis = 0;
  bool reverse = false;
  std::vector<ir::Attr> attrs() const {
    return {{"axis", std::to_string(axis)}, {"reverse", reverse ? "true" : "false"}};
  }
  bool operator==(const CumSum&) const = default;
  template <class R, class T> Tensor<R> batch(std::span<const bool>, SourceLoc loc, const Tensor<T>& x) const {
    return detail::apply<R>(CumSum{axis + 1, reverse}, loc, x);
  }
  Shape output_shape(const Shape& x) const { return x; }
  template <class T> void run(Device d, const Tensor<T>& x, Tensor<T>& out) const {
    if (out.numel() == 0) return;  // the other axes' product may be huge then
    const detail::AroundAxis geo(x.shape(), axis);
    kernels::for_each_index(d, geo.outer * geo.inner,
                            std::max<std::int64_t>(1, (1 << 13) / std::max<std::int64_t>(geo.extent, 1)),
                            detail::CumSumColumn<T>{x.data(), out.data(), geo.extent, geo.inner, reverse});
  }
  static constexpr Needs<1> differentiable{true}, saved{false};
  static constexpr bool multilinear = true;
  template <class T> autograd::Grads grad(const Tensor<T>& g, Needs<1>, SourceLoc loc, const Tensor<T>&) const {
    return {detail::apply<T>(CumSum{axis, !reverse}, loc, g)};
  }
};

/// The index of the first largest element along `axis`, as int32. An index: no gradient.
struct Argmax {
  static constexpr std::string_view name = "Argmax";
  int axis = 0;
  bool keepdims = false;
  std::vector<ir::Attr> attrs() const { return {{"axis", std::to_string(axis)}}; }
  bool operator==(const Argmax&) const = default;
  template <class R, class T> Tensor<R> batch(std::span<const bool>, SourceLoc loc, const Tensor<T>& x) const {
    return detail::apply<R>(Argmax{axis + 1, keepdims}, loc, x);
  }
  Shape output_shape(const Shape& x) const {
    Shape out;
    for (int i = 0; i < x.ndim(); ++i)
      if (i != axis || keepdims) out.push_back(i == axis ? 1 : x[i]);
    return out;
  }
  template <class T> void run(Device d, const Tensor<T>& x, Tensor<std::int32_t>& out) const {
    const detail::AroundAxis geo(x.shape(), axis);
    kernels::argmax(d, x.data(), out.data(), geo.outer, geo.extent, geo.inner);
  }
};

}  // namespace op

namespace detail {

/// The shapes a reduction over `axes` produces: with size-1 axes kept, and as asked.
struct ReducedShapes {
  Shape kept;
  Shape out;
  std::int64_t count = 1;  // elements folded into each output
};

inline ReducedShapes reduced_shapes(std::string_view op, const TensorBase& x, const std::vector<std::int64_t>& axes,
                                    bool keepdims, SourceLoc loc) {
  std::vector<bool> reduce(x.ndim(), axes.empty());
  for (auto axis : axes) {
    int a = normalize_axis(axis, x.ndim(), op, loc);
    if (reduce[a]) throw_shape_error(op, loc, "axis ", axis, " appears twice in axes ", Shape(axes));
    reduce[a] = true;
  }
  ReducedShapes r;
  for (int i = 0; i < x.ndim(); ++i) {
    r.kept.push_back(reduce[i] ? 1 : x.shape()[i]);
    if (reduce[i]) r.count *= x.shape()[i];
    if (!reduce[i] || keepdims) r.out.push_back(reduce[i] ? 1 : x.shape()[i]);
  }
  return r;
}

}  // namespace detail

template <Numeric T> Tensor<T> sum_to(const Tensor<T>& x, const Shape& shape, SourceLoc loc) {
  if (x.shape() == shape) return x;
  detail::OpScope scope(op::SumTo::name, loc, {x});
  Shape check;
  if (!try_broadcast(shape, x.shape(), check) || !(check == x.shape()))
    throw_shape_error(op::SumTo::name, loc, "input ", dtype_name(x.dtype()), x.shape(), " does not broadcast from ",
                      shape);
  return detail::apply<T>(op::SumTo{{shape}, x.shape()}, loc, x);
}

template <Numeric T>
Tensor<T> sum(const Tensor<T>& x, const std::vector<std::int64_t>& axes, bool keepdims, SourceLoc loc) {
  detail::OpScope scope("ReduceSum", loc, {x});
  auto shapes = detail::reduced_shapes("ReduceSum", x, axes, keepdims, loc);
  auto kept = sum_to(x, shapes.kept, loc);
  return shapes.out == shapes.kept ? kept : reshape(kept, shapes.out, loc);
}

template <FloatingPoint T>
Tensor<T> mean(const Tensor<T>& x, const std::vector<std::int64_t>& axes, bool keepdims, SourceLoc loc) {
  detail::OpScope scope("ReduceMean", loc, {x});
  auto shapes = detail::reduced_shapes("ReduceMean", x, axes, keepdims, loc);
  return sum(x, axes, keepdims, loc) / static_cast<T>(shapes.count);
}

namespace detail {

/// max or min over axes (op::Extremum).
template <class Reduce, class T>
Tensor<T> extremum(const Tensor<T>& x, const std::vector<std::int64_t>& axes, bool keepdims, SourceLoc loc) {
  constexpr std::string_view name = Reduce::name;
  OpScope scope(name, loc, {x});
  auto shapes = reduced_shapes(name, x, axes, keepdims, loc);
  if (shapes.count == 0 && shapes.kept.numel() != 0)
    throw_shape_error(name, loc, "cannot reduce over an empty axis of input ", dtype_name(x.dtype()), x.shape());
  const Tensor<T> kept = apply<T>(Reduce{{shapes.kept}}, loc, x);
  return shapes.out == shapes.kept ? kept : reshape(kept, shapes.out, loc);
}

}  // namespace detail

template <Numeric T>
Tensor<T> max(const Tensor<T>& x, const std::vector<std::int64_t>& axes, bool keepdims, SourceLoc loc) {
  return detail::extremum<op::ReduceMax>(x, axes, keepdims, loc);
}

template <Numeric T>
Tensor<T> min(const Tensor<T>& x, const std::vector<std::int64_t>& axes, bool keepdims, SourceLoc loc) {
  return detail::extremum<op::ReduceMin>(x, axes, keepdims, loc);
}

template <Numeric T> Tensor<T> cumsum(const Tensor<T>& x, std::int64_t axis, bool reverse, SourceLoc loc) {
  detail::OpScope scope(op::CumSum::name, loc, {x});
  if (x.ndim() == 0)
    throw_shape_error(op::CumSum::name, loc, "x must have an axis to sum along, got a scalar ", dtype_name(x.dtype()),
                      x.shape());
  return detail::apply<T>(op::CumSum{normalize_axis(axis, x.ndim(), op::CumSum::name, loc), reverse}, loc, x);
}

template <Numeric T> Tensor<std::int32_t> argmax(const Tensor<T>& x, std::int64_t axis, bool keepdims, SourceLoc loc) {
  if (x.ndim() == 0) return zeros<std::int32_t>(Shape{});
  detail::OpScope scope(op::Argmax::name, loc, {x});
  int a = normalize_axis(axis, x.ndim(), op::Argmax::name, loc);
  if (x.shape()[a] == 0)
    throw_shape_error(op::Argmax::name, loc, "axis ", axis, " of input ", dtype_name(x.dtype()), x.shape(),
                      " is empty");
  return detail::apply<std::int32_t>(op::Argmax{a, keepdims}, loc, x);
}

}  // namespace xgrad
