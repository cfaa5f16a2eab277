// Definitions of ops/manipulation.hpp: included by it when header-only, compiled once into the
// library (src/ops_shape.cpp) otherwise.
#pragma once

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "xgrad/backend/cpu/copy.hpp"
#include "xgrad/backend/kernels.hpp"
#include "xgrad/core/factory.hpp"
#include "xgrad/ops/dispatch.hpp"
#include "xgrad/ops/elementwise.hpp"
#include "xgrad/ops/manipulation.hpp"
#include "xgrad/ops/reduce.hpp"

namespace xgrad {

namespace detail {

/// One row of a take: out's row (o, i) is x's row (o, indices[i]), `inner` elements each.
template <class T> struct TakeRows {
  const T* x;
  const std::int32_t* indices;
  T* out;
  std::int64_t count, extent, inner;
  XGRAD_HD void operator()(std::int64_t row) const {
    const std::int64_t o = row / count, i = row % count;
    const T* src = x + (o * extent + indices[i]) * inner;
    T* dst = out + row * inner;
    for (std::int64_t r = 0; r < inner; ++r) dst[r] = src[r];
  }
};

/// Take's adjoint on one block of `block` columns of one outer index: g's rows added into out's
/// rows at their indices, in index order, so each sum is formed the same way on every device and
/// thread count. Blocks are disjoint: no two calls write one element.
template <class T> struct ScatterAddColumns {
  const T* g;
  const std::int32_t* indices;
  T* out;
  std::int64_t count, extent, inner, block;
  XGRAD_HD void operator()(std::int64_t task) const {
    const std::int64_t blocks = (inner + block - 1) / block;
    const std::int64_t o = task / blocks, lo = task % blocks * block;
    const std::int64_t hi = lo + block < inner ? lo + block : inner;
    for (std::int64_t i = 0; i < count; ++i) {
      const T* src = g + (o * count + i) * inner;
      T* dst = out + (o * extent + indices[i]) * inner;
      for (std::int64_t r = lo; r < hi; ++r) dst[r] = math::add(dst[r], src[r]);  // integers wrap
    }
  }
};

/// Refuses an index outside [0, extent), naming the first one and where it is.
inline void check_take_indices(std::string_view op, const TensorBase& indices, std::int64_t extent, std::int64_t axis,
                               SourceLoc loc) {
  if (const OutOfRange bad = first_outside(indices, extent); bad.position >= 0)
    throw_value_error(op, loc, "index ", bad.value, " at position ", bad.position, " of indices ", indices.shape(),
                      " is outside [0, ", extent, "), the extent of axis ", axis);
}

/// A take's result shape: x's with `axis` replaced by the indices' shape.
inline Shape take_shape(const Shape& x, const Shape& indices, int axis) {
  std::vector<std::int64_t> out(x.begin(), x.begin() + axis);
  out.insert(out.end(), indices.begin(), indices.end());
  out.insert(out.end(), x.begin() + axis + 1, x.end());
  return Shape(out);
}

}  // namespace detail

namespace op {

/// A view of the input's buffer with another shape: no kernel, so reshape() makes the view
/// through primitive() and records its derivatives with record_derivatives (detail::apply would
/// allocate an output).
struct Reshape {
  static constexpr std::string_view name = "Reshape";
  Shape shape;
  Shape from;  // the input's shape, which the gradient takes back
  std::vector<ir::Attr> attrs() const { return {{"shape", shape.str()}}; }
  bool operator==(const Reshape&) const = default;
  static constexpr Needs<1> differentiable{true}, saved{false};
  template <class T> autograd::Grads grad(const Tensor<T>& g, Needs<1>, SourceLoc loc, const Tensor<T>&) const {
    return {reshape(g, from.to_vector(), loc)};
  }
  template <class T>
  Tensor<T> jvp(std::span<const TensorBase> t, SourceLoc loc, const Tensor<T>&, const Tensor<T>&) const {
    return reshape(Tensor<T>(t[0]), shape.to_vector(), loc);
  }
};

struct Transpose {
  static constexpr std::string_view name = "Transpose";
  std::vector<std::int64_t> perm;
  std::vector<ir::Attr> attrs() const { return {{"perm", Shape(perm).str()}}; }
  bool operator==(const Transpose&) const = default;
  /// Batching rules (vmap): each takes the batches (on axis 0) of the batched inputs and the
  /// others as they are, and returns the output's batch.
  template <class R, class T> Tensor<R> batch(std::span<const bool>, SourceLoc loc, const Tensor<T>& x) const {
    Transpose def{{0}};
    for (std::int64_t p : perm) def.perm.push_back(p + 1);
    return detail::apply<R>(def, loc, x);
  }
  Shape output_shape(const Shape& x) const {
    Shape out;
    for (auto p : perm) out.push_back(x[p]);
    return out;
  }
  template <class T> void run(Device d, const Tensor<T>& x, Tensor<T>& out) const {
    const auto strides = x.shape().strides();
    cpu::Strides src{};
    for (std::size_t i = 0; i < perm.size(); ++i) src[i] = strides[perm[i]];
    kernels::strided_copy(d, out.shape(), x.data(), src, out.data(), out.shape().strides());
  }
  static constexpr Needs<1> differentiable{true}, saved{false};
  static constexpr bool multilinear = true;
  template <class T> autograd::Grads grad(const Tensor<T>& g, Needs<1>, SourceLoc loc, const Tensor<T>&) const {
    std::vector<std::int64_t> inverse(perm.size());
    for (std::size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<std::int64_t>(i);
    return {transpose(g, inverse, loc)};
  }
};

/// The input repeated along broadcast axes (NumPy rules).
struct BroadcastTo {
  static constexpr std::string_view name = "BroadcastTo";
  Shape shape;
  Shape from;  // the input's shape, which the gradient sums back to
  std::vector<ir::Attr> attrs() const { return {{"shape", shape.str()}}; }
  bool operator==(const BroadcastTo&) const = default;
  Shape output_shape() const { return shape; }
  template <class R, class T> Tensor<R> batch(std::span<const bool>, SourceLoc loc, const Tensor<T>& x) const {
    const Tensor<T> aligned = detail::align_batch(x, shape.ndim());
    return detail::apply<R>(BroadcastTo{detail::with_batch(x.shape()[0], shape), aligned.shape()}, loc, aligned);
  }
  template <class T> static OpTraits traits() { return {.block = cpu::copy_block<T>}; }  // fusion gathers per block
  template <class T> void run(Device d, const Tensor<T>& x, Tensor<T>& out) const {
    kernels::strided_copy(d, shape, x.data(), cpu::broadcast_strides(from, shape), out.data(), shape.strides());
  }
  static constexpr Needs<1> differentiable{true}, saved{false};
  static constexpr bool multilinear = true;
  template <class T> autograd::Grads grad(const Tensor<T>& g, Needs<1>, SourceLoc loc, const Tensor<T>&) const {
    return {sum_to(g, from, loc)};
  }
};

/// The block of the input at `begin` of extent `size` (-1: to the end of the axis).
struct Slice {
  static constexpr std::string_view name = "Slice";
  std::vector<std::int64_t> begin, size;
  Shape from;  // the input's shape
  std::vector<ir::Attr> attrs() const { return {{"begin", Shape(begin).str()}, {"size", Shape(size).str()}}; }
  bool operator==(const Slice&) const = default;
  template <class R, class T> Tensor<R> batch(std::span<const bool>, SourceLoc loc, const Tensor<T>& x) const {
    Slice def{{0}, {x.shape()[0]}, x.shape()};
    def.begin.insert(def.begin.end(), begin.begin(), begin.end());
    def.size.insert(def.size.end(), size.begin(), size.end());
    return detail::apply<R>(def, loc, x);
  }
  Shape output_shape() const {
    Shape out;
    for (std::size_t i = 0; i < begin.size(); ++i) out.push_back(size[i] == -1 ? from[i] - begin[i] : size[i]);
    return out;
  }
  template <class T> void run(Device d, const Tensor<T>& x, Tensor<T>& out) const {
    if (out.numel() == 0) return;  // an empty axis's neighbours may hold offsets past the data
    const auto strides = from.strides();
    std::int64_t offset = 0;
    for (std::size_t i = 0; i < begin.size(); ++i) offset += begin[i] * strides[i];
    kernels::strided_copy(d, out.shape(), x.data() + offset, strides, out.data(), out.shape().strides());
  }
  static constexpr Needs<1> differentiable{true}, saved{false};
  static constexpr bool multilinear = true;
  template <class T> autograd::Grads grad(const Tensor<T>& g, Needs<1>, SourceLoc loc, const Tensor<T>&) const {
    return {slice_backward(g, from, begin, loc)};
  }
};
/// Slice's adjoint: zeros of the input's shape with the gradient written at `begin`.
struct SliceGrad {
  static constexpr std::string_view name = "SliceGrad";
  std::vector<std::int64_t> begin;
  Shape shape;  // the sliced input's shape, this op's output
  Shape block;  // the gradient's shape, the slice's extent
  std::vector<ir::Attr> attrs() const { return {{"begin", Shape(begin).str()}}; }
  bool operator==(const SliceGrad&) const = default;
  template <class R, class T> Tensor<R> batch(std::span<const bool>, SourceLoc loc, const Tensor<T>& g) const {
    SliceGrad def{{0}, detail::with_batch(g.shape()[0], shape), g.shape()};
    def.begin.insert(def.begin.end(), begin.begin(), begin.end());
    return detail::apply<R>(def, loc, g);
  }
  Shape output_shape() const { return shape; }
  template <class T> void run(Device d, const Tensor<T>& g, Tensor<T>& out) const {
    kernels::fill(d, out.data(), out.numel(), T(0));
    if (g.numel() == 0) return;  // nothing to place, and begin may lie past an empty axis's data
    const auto strides = shape.strides();
    std::int64_t offset = 0;
    for (std::size_t i = 0; i < begin.size(); ++i) offset += begin[i] * strides[i];
    kernels::strided_copy(d, g.shape(), g.data(), g.shape().strides(), out.data() + offset, strides);
  }
  static constexpr Needs<1> differentiable{true}, saved{false};
  static constexpr bool multilinear = true;
  template <class T> autograd::Grads grad(const Tensor<T>& u, Needs<1>, SourceLoc loc, const Tensor<T>&) const {
    return {slice(u, begin, block.to_vector(), loc)};
  }
};

/// The inputs joined along `axis` (the one primitive with any number of inputs: concat() runs
/// it through primitive() and records its gradient itself).
struct Concat {
  static constexpr std::string_view name = "Concat";
  int axis = 0;
  std::vector<ir::Attr> attrs() const { return {{"axis", std::to_string(axis)}}; }
  bool operator==(const Concat&) const = default;
  template <class T> void run(Device d, std::span<const TensorBase> parts, Tensor<T>& out) const {
    const auto strides = out.shape().strides();
    std::int64_t at = 0;
    for (const auto& part : parts) {
      Tensor<T> x(part);
      kernels::strided_copy(d, x.shape(), x.data(), x.shape().strides(), out.data() + at * strides[axis], strides);
      at += x.shape()[axis];
    }
  }
  /// The gradient's block for each input, of the shapes `parts`.
  template <class T> autograd::Grads grad(const Tensor<T>& g, SourceLoc loc, const std::vector<Shape>& parts) const {
    autograd::Grads grads;
    std::vector<std::int64_t> begin(g.ndim(), 0);
    for (const auto& s : parts) {
      grads.push_back(slice(g, begin, s.to_vector(), loc));
      begin[axis] += s[axis];
    }
    return grads;
  }
};

/// x's slices along `axis` picked by int32 indices: x [outer, extent, inner] (the axes before,
/// at and after it) gives [outer, count, inner], count the number of indices.
struct Take {
  static constexpr std::string_view name = "Take";
  int axis = 0;
  Shape from, out;  // x's shape and the result's
  std::int64_t count = 0;
  std::vector<ir::Attr> attrs() const { return {{"axis", std::to_string(axis)}}; }
  bool operator==(const Take&) const = default;
  Shape output_shape() const { return out; }
  /// Batched x: a take one axis further in. Batched indices: a loop (counted, said).
  template <class R, class T> Tensor<R> batch(std::span<const bool> batched, SourceLoc loc, const Tensor<T>& x,
                                              const Tensor<std::int32_t>& indices) const {
    if (batched[1]) return detail::batch_by_loop<R>(*this, batched, loc, x, indices);
    return take(x, indices, axis + 1, loc);
  }
  void check(std::span<const TensorBase> in, SourceLoc loc) const {
    detail::check_take_indices(name, in[1], from[axis], axis, loc);
  }
  template <class T> void run(Device d, const Tensor<T>& x, const Tensor<std::int32_t>& indices, Tensor<T>& y) const {
    if (y.numel() == 0) return;  // the other axes' product may be huge then
    const detail::AroundAxis geo(from, axis);
    kernels::for_each_index(d, geo.outer * count,
                            std::max<std::int64_t>(1, (1 << 13) / std::max<std::int64_t>(geo.inner, 1)),
                            detail::TakeRows<T>{x.data(), indices.data(), y.data(), count, geo.extent, geo.inner});
  }
  static constexpr Needs<2> differentiable{true, false}, saved{false, true};
  static constexpr bool multilinear = true;
  template <class T> autograd::Grads grad(const Tensor<T>& g, Needs<2>, SourceLoc loc, const Tensor<T>&,
                                          const Tensor<std::int32_t>& indices) const {
    return {take_backward(g, indices, from, axis, loc), TensorBase()};
  }
};

/// Take's adjoint: zeros of x's shape with g's slices added at their indices (an index taken
/// twice gets both).
struct TakeGrad {
  static constexpr std::string_view name = "TakeGrad";
  int axis = 0;
  Shape shape;  // x's shape, this op's output
  std::int64_t count = 0;
  std::vector<ir::Attr> attrs() const { return {{"axis", std::to_string(axis)}}; }
  bool operator==(const TakeGrad&) const = default;
  Shape output_shape() const { return shape; }
  template <class R, class T> Tensor<R> batch(std::span<const bool> batched, SourceLoc loc, const Tensor<T>& g,
                                              const Tensor<std::int32_t>& indices) const {
    if (batched[1]) return detail::batch_by_loop<R>(*this, batched, loc, g, indices);
    return take_backward(g, indices, detail::with_batch(g.shape()[0], shape), axis + 1, loc);
  }
  void check(std::span<const TensorBase> in, SourceLoc loc) const {
    detail::check_take_indices(name, in[1], shape[axis], axis, loc);
  }
  template <class T> void run(Device d, const Tensor<T>& g, const Tensor<std::int32_t>& indices, Tensor<T>& out) const {
    if (out.numel() == 0) return;  // the other axes' product may be huge then
    const detail::AroundAxis geo(shape, axis);
    kernels::fill(d, out.data(), out.numel(), T(0));
    // On the cpu a task adds whole cache lines of each row; on a device one column a thread.
    const std::int64_t block = d == Device::cpu ? 64 : 1;
    kernels::for_each_index(
        d, geo.outer * ((geo.inner + block - 1) / block), 1,
        detail::ScatterAddColumns<T>{g.data(), indices.data(), out.data(), count, geo.extent, geo.inner, block});
  }
  static constexpr Needs<2> differentiable{true, false}, saved{false, true};
  static constexpr bool multilinear = true;
  template <class T> autograd::Grads grad(const Tensor<T>& u, Needs<2>, SourceLoc loc, const Tensor<T>&,
                                          const Tensor<std::int32_t>& indices) const {
    return {take(u, indices, axis, loc), TensorBase()};
  }
};

struct Cast {
  static constexpr std::string_view name = "Cast";
  DType to = DType::float32;
  std::vector<ir::Attr> attrs() const { return {{"to", std::string(dtype_short_name(to))}}; }
  bool operator==(const Cast&) const = default;
  template <class R, class T> Tensor<R> batch(std::span<const bool>, SourceLoc loc, const Tensor<T>& x) const {
    return detail::apply<R>(*this, loc, x);
  }
  Shape output_shape(const Shape& x) const { return x; }
  template <class T, class U> void run(Device d, const Tensor<T>& x, Tensor<U>& out) const {
    kernels::cast(d, x.data(), out.data(), out.numel());
  }
  static constexpr Needs<1> differentiable{true}, saved{false};
  static constexpr bool multilinear = true;
  template <class U, class T>
  autograd::Grads grad(const Tensor<U>& g, Needs<1>, SourceLoc loc, const Tensor<T>&) const {
    return {cast<T>(g, loc)};
  }
};

}  // namespace op

template <Element T> Tensor<T> reshape(const Tensor<T>& x, const std::vector<std::int64_t>& dims, SourceLoc loc) {
  detail::OpScope scope(op::Reshape::name, loc, {x});
  Shape shape;
  int inferred = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == -1) {
      if (inferred >= 0) throw_shape_error(op::Reshape::name, loc, "only one -1 is allowed in ", Shape(dims));
      inferred = static_cast<int>(i);
    } else if (dims[i] < 0) {
      throw_shape_error(op::Reshape::name, loc, "size ", dims[i], " in ", Shape(dims), " must be non-negative or -1");
    } else {
      known = detail::checked_mul(op::Reshape::name, loc, "the product of the given sizes", known, dims[i]);
    }
    shape.push_back(dims[i]);
  }
  if (inferred >= 0) {
    if (known == 0 || x.numel() % known != 0)
      throw_shape_error(op::Reshape::name, loc, "cannot reshape input ", dtype_name(x.dtype()), x.shape(), " into ",
                        Shape(dims));
    shape[inferred] = x.numel() / known;
  }
  if (shape.numel() != x.numel())
    throw_shape_error(op::Reshape::name, loc, "cannot reshape input ", dtype_name(x.dtype()), x.shape(), " (",
                      x.numel(), " elements) into ", shape, " (", shape.numel(), " elements)");
  const op::Reshape def{shape, x.shape()};
  if (const std::uint64_t level = detail::batch_level_of(op::Reshape::name, loc, {x})) [[unlikely]] {
    std::vector<std::int64_t> batch_dims{detail::batch_of(x, level).shape()[0]};
    for (std::int64_t d : shape) batch_dims.push_back(d);
    Tensor<T> out(detail::batched(reshape(detail::batch_of(x, level), batch_dims, loc), level));
    detail::record_derivatives(def, out, loc, x);
    return out;
  }
  Tensor<T> out(detail::primitive(
      def, loc, {x}, x.dtype(), shape,
      [shape](std::span<const TensorBase> in, const TensorBase& dest) {
        // The graph executor may hand over a view it made in advance over the input's buffer.
        if (dest.defined() && dest.impl()->storage == in[0].impl()->storage) return dest;
        return TensorBase(std::make_shared<TensorImpl>(shape, in[0].dtype(), in[0].impl()->storage));
      },
      OpTraits{.view = true}));
  detail::record_derivatives(def, out, loc, x);
  return out;
}

template <Element T> Tensor<T> transpose(const Tensor<T>& x, std::vector<std::int64_t> perm, SourceLoc loc) {
  detail::OpScope scope(op::Transpose::name, loc, {x});
  const int rank = x.ndim();
  if (perm.empty()) {
    perm.resize(rank);
    std::iota(perm.rbegin(), perm.rend(), 0);
  }
  if (static_cast<int>(perm.size()) != rank)
    throw_shape_error(op::Transpose::name, loc, "perm ", Shape(perm), " has ", perm.size(), " axes, input ",
                      dtype_name(x.dtype()), x.shape(), " has ", rank);
  std::vector<bool> seen(rank, false);
  for (auto& p : perm) {
    p = normalize_axis(p, rank, op::Transpose::name, loc);
    if (seen[p]) throw_shape_error(op::Transpose::name, loc, "perm ", Shape(perm), " repeats axis ", p);
    seen[p] = true;
  }
  // Moving only axes of length 1 leaves the elements in order: a reshape, which copies nothing.
  std::vector<std::int64_t> dims;
  bool in_order = true;
  std::int64_t last = -1;  // the last axis longer than 1 taken so far
  for (std::int64_t p : perm) {
    dims.push_back(x.shape()[static_cast<int>(p)]);
    if (dims.back() == 1) continue;
    in_order = in_order && p > last;
    last = p;
  }
  if (in_order) return reshape(x, dims, loc);
  return detail::apply<T>(op::Transpose{perm}, loc, x);
}

template <Element T> Tensor<T> broadcast_to(const Tensor<T>& x, const Shape& shape, SourceLoc loc) {
  detail::OpScope scope(op::BroadcastTo::name, loc, {x});
  Shape check;
  if (!try_broadcast(x.shape(), shape, check) || !(check == shape))
    throw_shape_error(op::BroadcastTo::name, loc, "input ", dtype_name(x.dtype()), x.shape(),
                      " cannot be broadcast to ", shape);
  if (x.shape() == shape) return x;
  return detail::apply<T>(op::BroadcastTo{shape, x.shape()}, loc, x);
}

template <Element T> Tensor<T> expand_dims(const Tensor<T>& x, std::int64_t axis, SourceLoc loc) {
  detail::OpScope scope("ExpandDims", loc, {x});
  int a = normalize_axis(axis, x.ndim() + 1, "ExpandDims", loc);
  auto dims = x.shape().to_vector();
  dims.insert(dims.begin() + a, 1);
  return reshape(x, dims, loc);
}

template <Element T> Tensor<T> squeeze(const Tensor<T>& x, const std::vector<std::int64_t>& axes, SourceLoc loc) {
  detail::OpScope scope("Squeeze", loc, {x});
  std::vector<bool> drop(x.ndim(), axes.empty());
  for (auto axis : axes) {
    int a = normalize_axis(axis, x.ndim(), "Squeeze", loc);
    if (x.shape()[a] != 1)
      throw_shape_error("Squeeze", loc, "axis ", axis, " of input ", dtype_name(x.dtype()), x.shape(), " has size ",
                        x.shape()[a], ", not 1");
    drop[a] = true;
  }
  std::vector<std::int64_t> dims;
  for (int i = 0; i < x.ndim(); ++i)
    if (!(drop[i] && x.shape()[i] == 1)) dims.push_back(x.shape()[i]);
  return reshape(x, dims, loc);
}

template <Element T> Tensor<T> flatten(const Tensor<T>& x, SourceLoc loc) {
  detail::OpScope scope("Flatten", loc, {x});
  if (x.ndim() == 0) throw_shape_error("Flatten", loc, "input must have at least one axis, got a scalar");
  return reshape(x, {x.shape()[0], x.ndim() == 1 ? 1 : -1}, loc);
}

template <Element T> Tensor<T> slice(const Tensor<T>& x, const std::vector<std::int64_t>& begin,
                                     const std::vector<std::int64_t>& size, SourceLoc loc) {
  detail::OpScope scope(op::Slice::name, loc, {x});
  const int rank = x.ndim();
  if (static_cast<int>(begin.size()) != rank || static_cast<int>(size.size()) != rank)
    throw_shape_error(op::Slice::name, loc, "begin ", Shape(begin), " and size ", Shape(size),
                      " need one entry per axis of input ", dtype_name(x.dtype()), x.shape());
  for (int i = 0; i < rank; ++i) {
    const std::int64_t extent = x.shape()[i];
    // begin first, so that neither extent - begin nor begin + n can overflow.
    const bool begin_fits = begin[i] >= 0 && begin[i] <= extent;
    const std::int64_t n = !begin_fits ? -1 : size[i] == -1 ? extent - begin[i] : size[i];
    if (!begin_fits || n < 0 || n > extent - begin[i])
      throw_shape_error(op::Slice::name, loc, "begin ", Shape(begin), " with size ", Shape(size), " leaves input ",
                        dtype_name(x.dtype()), x.shape(), " at axis ", i);
  }
  return detail::apply<T>(op::Slice{begin, size, x.shape()}, loc, x);
}

template <Numeric T> Tensor<T> slice_backward(const Tensor<T>& g, const Shape& in_shape,
                                              const std::vector<std::int64_t>& begin, SourceLoc loc) {
  detail::OpScope scope(op::SliceGrad::name, loc, {g});
  const int rank = in_shape.ndim();
  bool fits = g.ndim() == rank && static_cast<int>(begin.size()) == rank;
  for (int i = 0; fits && i < rank; ++i)
    fits = begin[i] >= 0 && begin[i] <= in_shape[i] && g.shape()[i] <= in_shape[i] - begin[i];
  if (!fits)
    throw_shape_error(op::SliceGrad::name, loc, "the gradient ", dtype_name(g.dtype()), g.shape(), " at begin ",
                      Shape(begin), " must lie inside the input shape ", in_shape, " (one begin per axis)");
  detail::checked_numel(op::SliceGrad::name, loc, in_shape);  // before its strides are computed
  return detail::apply<T>(op::SliceGrad{begin, in_shape, g.shape()}, loc, g);
}

template <Element T>
Tensor<T> take(const Tensor<T>& x, const Tensor<std::int32_t>& indices, std::int64_t axis, SourceLoc loc) {
  detail::OpScope scope(op::Take::name, loc, {x, indices});
  if (x.ndim() == 0)
    throw_shape_error(op::Take::name, loc, "x must have an axis to take along, got a scalar ", dtype_name(x.dtype()),
                      x.shape());
  const int a = normalize_axis(axis, x.ndim(), op::Take::name, loc);
  return detail::apply<T>(op::Take{a, x.shape(), detail::take_shape(x.shape(), indices.shape(), a), indices.numel()},
                          loc, x, indices);
}

template <Numeric T> Tensor<T> take_backward(const Tensor<T>& g, const Tensor<std::int32_t>& indices,
                                             const Shape& x_shape, std::int64_t axis, SourceLoc loc) {
  detail::OpScope scope(op::TakeGrad::name, loc, {g, indices});
  const int rank = x_shape.ndim();
  const int a = rank > 0 ? normalize_axis(axis, rank, op::TakeGrad::name, loc) : 0;
  const Shape want = rank > 0 ? detail::take_shape(x_shape, indices.shape(), a) : Shape();
  if (rank == 0 || g.shape() != want)
    throw_shape_error(op::TakeGrad::name, loc, "the gradient ", dtype_name(g.dtype()), g.shape(),
                      " must have the shape of a take from ", x_shape, " along axis ", axis, " with indices ",
                      indices.shape(), ": ", want);
  detail::checked_numel(op::TakeGrad::name, loc, x_shape);
  return detail::apply<T>(op::TakeGrad{a, x_shape, indices.numel()}, loc, g, indices);
}

template <Element T> std::vector<Tensor<T>> split(const Tensor<T>& x, const std::vector<std::int64_t>& sizes,
                                                  std::int64_t axis, SourceLoc loc) {
  detail::OpScope scope("Split", loc, {x});
  if (x.ndim() == 0)
    throw_shape_error("Split", loc, "x must have an axis to split, got a scalar ", dtype_name(x.dtype()), x.shape());
  const int a = normalize_axis(axis, x.ndim(), "Split", loc);
  const std::int64_t extent = x.shape()[a];
  std::int64_t total = 0;
  bool fits = !sizes.empty();
  for (std::int64_t n : sizes) {
    fits = fits && n >= 0 && n <= extent - total;  // never past the extent: no overflow
    if (fits) total += n;
  }
  if (!fits || total != extent)
    throw_shape_error("Split", loc, "sizes ", Shape(sizes), " must be non-negative and add up to ", extent,
                      ", the extent of axis ", axis, " of x ", dtype_name(x.dtype()), x.shape());
  std::vector<Tensor<T>> pieces;
  std::vector<std::int64_t> begin(static_cast<std::size_t>(x.ndim()), 0), size(static_cast<std::size_t>(x.ndim()), -1);
  for (std::int64_t n : sizes) {
    size[static_cast<std::size_t>(a)] = n;
    pieces.push_back(slice(x, begin, size, loc));
    begin[static_cast<std::size_t>(a)] += n;
  }
  return pieces;
}

namespace detail {
/// x where column j - row i of its last two axes is at most k (`upper` false: the lower triangle)
/// or at least k (`upper`: the upper one), 0 elsewhere.
template <Element T>
Tensor<T> triangle(std::string_view op, const Tensor<T>& x, std::int64_t k, bool upper, SourceLoc loc) {
  OpScope scope(op, loc, {x});
  if (x.ndim() < 2)
    throw_shape_error(op, loc, "x must have at least two axes (a matrix's rows and columns), got ",
                      dtype_name(x.dtype()), x.shape());
  const std::int64_t rows = x.shape()[x.ndim() - 2], cols = x.shape()[x.ndim() - 1];
  // j - i for each element, made from constants: a compiled graph folds the mask.
  const auto offset =
      sub(arange<std::int64_t>(cols, loc), reshape(arange<std::int64_t>(rows, loc), {rows, 1}, loc), loc);
  // k at the int64 limits (no diagonal that far) keeps everything or nothing, without overflow.
  const auto keep = upper ? greater(offset, k == std::numeric_limits<std::int64_t>::min() ? k : k - 1, loc)
                          : less(offset, k == std::numeric_limits<std::int64_t>::max() ? k : k + 1, loc);
  return where(keep, x, T(0), loc);
}
}  // namespace detail

template <Element T> Tensor<T> tril(const Tensor<T>& x, std::int64_t k, SourceLoc loc) {
  return detail::triangle("Tril", x, k, false, loc);
}

template <Element T> Tensor<T> triu(const Tensor<T>& x, std::int64_t k, SourceLoc loc) {
  return detail::triangle("Triu", x, k, true, loc);
}

template <Element T> Tensor<T> concat(const std::vector<Tensor<T>>& xs, std::int64_t axis, SourceLoc loc) {
  if (xs.empty()) throw_shape_error(op::Concat::name, loc, "needs at least one input");
  detail::OpScope scope(op::Concat::name, loc, {xs[0]});
  const Shape& first = xs[0].shape();
  int a = normalize_axis(axis, first.ndim(), op::Concat::name, loc);
  Shape shape = first;
  shape[a] = 0;
  for (std::size_t k = 0; k < xs.size(); ++k) {
    const Shape& s = xs[k].shape();
    bool fits = s.ndim() == first.ndim();
    for (int i = 0; fits && i < s.ndim(); ++i) fits = i == a || s[i] == first[i];
    if (!fits) {
      std::string all;
      for (std::size_t j = 0; j < xs.size(); ++j) all += detail::concat(j ? ", " : "", "x", j, ": ", xs[j].shape());
      throw_shape_error(op::Concat::name, loc, "input ", k, " has shape ", s,
                        ", which does not match input 0 outside axis ", a, " (inputs ", all, ")");
    }
    shape[a] = detail::checked_add(op::Concat::name, loc, "the concatenated extent", shape[a], s[a]);
  }
  const op::Concat def{a};
  std::vector<TensorBase> inputs(xs.begin(), xs.end());
  Tensor<T> out;
  if (const std::uint64_t level = detail::batch_level_of(op::Concat::name, loc, xs)) [[unlikely]] {
    // Every input's batch along a new axis 0 (an unbatched input repeated), joined along a + 1.
    std::int64_t size = 0;
    for (const auto& x : xs)
      if (detail::batched_at(x, level)) size = detail::batch_of(x, level).shape()[0];
    std::vector<Tensor<T>> batches;
    for (const auto& x : xs) {
      Shape repeated{size};
      for (std::int64_t d : x.shape()) repeated.push_back(d);
      batches.push_back(detail::batched_at(x, level) ? detail::batch_of(x, level) : broadcast_to(x, repeated, loc));
    }
    out = Tensor<T>(detail::batched(concat(batches, a + 1, loc), level));
  } else {
    out = Tensor<T>(detail::primitive(def, loc, inputs, dtype_of<T>(), shape,
                                      [def, shape](std::span<const TensorBase> in, const TensorBase& dest) {
                                        const Device device = detail::device_of(in);
                                        auto out = detail::output<T>(dest, shape, device);
                                        def.run(device, in, out);
                                        return TensorBase(out);
                                      }));
  }
  if constexpr (FloatingPoint<T>) {
    if (std::any_of(xs.begin(), xs.end(), [](const auto& x) { return detail::should_record(x); })) {
      std::vector<Shape> parts;
      for (const auto& x : xs) parts.push_back(x.shape());
      std::vector<std::reference_wrapper<const TensorBase>> refs(xs.begin(), xs.end());
      detail::record_range(
          out, op::Concat::name, loc, refs.begin(), refs.end(), {}, false,
          [def, parts, loc](const TensorBase&, const TensorBase& g) { return def.grad(Tensor<T>(g), loc, parts); });
    }
    detail::push_tangents_range(out, xs.begin(), xs.end(), [&](std::span<const TensorBase> tangents) {
      std::vector<Tensor<T>> parts;
      for (std::size_t k = 0; k < xs.size(); ++k)
        parts.push_back(tangents[k].defined() ? Tensor<T>(tangents[k]) : zeros_like(xs[k], loc));
      return TensorBase(concat(parts, a, loc));
    });
  }
  return out;
}

template <Element T> Tensor<T> stack(const std::vector<Tensor<T>>& xs, std::int64_t axis, SourceLoc loc) {
  if (xs.empty()) throw_shape_error("Stack", loc, "needs at least one input");
  detail::OpScope scope("Stack", loc, {xs[0]});
  for (std::size_t k = 1; k < xs.size(); ++k)
    if (!(xs[k].shape() == xs[0].shape()))
      throw_shape_error("Stack", loc, "input ", k, " has shape ", xs[k].shape(), ", input 0 has ", xs[0].shape());
  const int a = normalize_axis(axis, xs[0].ndim() + 1, "Stack", loc);  // checked here to name stack, not ExpandDims
  std::vector<Tensor<T>> expanded;
  for (const auto& x : xs) expanded.push_back(expand_dims(x, a, loc));
  return concat(expanded, a, loc);
}

template <Element U, Element T> Tensor<U> cast(const Tensor<T>& x, SourceLoc loc) {
  if constexpr (std::is_same_v<T, U>)
    return x;
  else
    return detail::apply<U>(op::Cast{dtype_of<U>()}, loc, x);
}

}  // namespace xgrad
