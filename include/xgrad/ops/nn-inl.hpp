// Definitions of ops/nn.hpp: included by it when header-only, compiled once into the library
// (src/ops_nn.cpp) otherwise.
//
// Conv, pooling and resize are primitives whose gradients are primitives too (each pair
// adjoint), so gradients of gradients work.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <span>
#include <string>
#include <vector>

#include "xgrad/backend/attention_geometry.hpp"
#include "xgrad/backend/cpu/conv.hpp"
#include "xgrad/backend/cpu/pool.hpp"
#include "xgrad/backend/cpu/resize.hpp"
#include "xgrad/backend/cpu/softmax_xent.hpp"
#include "xgrad/backend/kernels.hpp"
#include "xgrad/core/factory.hpp"
#include "xgrad/ops/dispatch.hpp"
#include "xgrad/ops/elementwise.hpp"
#include "xgrad/ops/linalg.hpp"
#include "xgrad/ops/manipulation.hpp"
#include "xgrad/ops/nn.hpp"
#include "xgrad/ops/reduce.hpp"

namespace xgrad {

/// The geometry of a bilinear resize: input [n, c, h, w] to [n, c, out_h, out_w].
struct ResizeGeometry {
  std::int64_t n, c, h, w, out_h, out_w;
  bool align_corners;
  bool operator==(const ResizeGeometry&) const = default;
};

namespace detail {

inline void check_labels(std::string_view op, const TensorBase& labels, std::int64_t classes, SourceLoc loc) {
  if (const OutOfRange bad = first_outside(labels, classes); bad.position >= 0)
    throw_value_error(op, loc, "label ", bad.value, " at index ", bad.position, " is outside [0, ", classes, ")");
}

/// Element k of a one-hot tensor: 1 where its class is its row's label.
template <class T> struct OneHotElement {
  const std::int32_t* labels;
  std::int64_t classes;
  XGRAD_HD T operator()(std::int64_t k) const { return labels[k / classes] == k % classes ? T(1) : T(0); }
};

}  // namespace detail

namespace op {

/// The parameters of the convolution, pooling and resize primitives: their geometry, of which
/// the IR prints what the input and output types do not already say.
inline std::vector<ir::Attr> window_attrs(const cpu::Conv2dGeometry& g) {
  return {{"stride", detail::concat("[", g.stride_h, ", ", g.stride_w, "]")},
          {"pad", detail::concat("[", g.pad_top, ", ", g.pad_left, "]")},
          {"dilation", detail::concat("[", g.dil_h, ", ", g.dil_w, "]")}};
}
inline std::vector<ir::Attr> window_attrs(const cpu::Pool2dGeometry& g) {
  return {{"kernel", detail::concat("[", g.kh, ", ", g.kw, "]")},
          {"stride", detail::concat("[", g.stride_h, ", ", g.stride_w, "]")},
          {"pad", detail::concat("[", g.pad_top, ", ", g.pad_left, "]")}};
}
inline std::vector<ir::Attr> window_attrs(const ResizeGeometry& r) {
  return {{"size", detail::concat("[", r.out_h, ", ", r.out_w, "]")},
          {"align_corners", r.align_corners ? "true" : "false"}};
}

template <class Geometry> struct Windowed {
  Geometry geometry;
  std::vector<ir::Attr> attrs() const { return window_attrs(geometry); }
  bool operator==(const Windowed&) const = default;
};

/// The batching rule of a windowed primitive: the batch folded into the samples (input k leads
/// with the samples where `samples[k]`; a convolution's weights do not, and are not batched),
/// def run once on size x n samples, the result's samples unfolded into [size, n, ...].
template <class R, class Def, class... In> Tensor<R> fold_samples(Def def, std::span<const bool> batched,
                                                                  std::array<bool, sizeof...(In)> samples,
                                                                  SourceLoc loc, const Tensor<In>&... inputs) {
  const std::int64_t size = detail::batch_size(batched, inputs...);
  const std::int64_t n = def.geometry.n;
  def.geometry.n = n * size;
  auto fold = [&](const auto& x, std::size_t i) {
    return samples[i] ? detail::fold_batch(x, batched[i], size, loc) : x;
  };
  const Tensor<R> out = [&]<std::size_t... K>(std::index_sequence<K...>) {
    return detail::apply<R>(def, loc, fold(inputs, K)...);
  }
  (std::index_sequence_for<In...>{});
  std::vector<std::int64_t> dims{size, n};
  for (int i = 1; i < out.ndim(); ++i) dims.push_back(out.shape()[i]);
  return reshape(out, dims, loc);
}

// Each primitive of the family: its output shape, its kernel (backend/kernels.hpp) and its
// gradient rule (below the definitions: the rules run each other's primitives). Each gradient
// is a primitive too, the pairs adjoint, so gradients of gradients work.

struct Conv2D : Windowed<cpu::Conv2dGeometry> {
  static constexpr std::string_view name = "Conv2D";
  template <class R> static OpTraits traits() { return {.contraction = true}; }
  static constexpr bool epilogue = true;
  static constexpr Needs<2> differentiable{true, true}, saved{true, true};
  static constexpr bool multilinear = true;
  Shape output_shape() const { return {geometry.n, geometry.c_out, geometry.out_h, geometry.out_w}; }
  template <class R, class T>
  Tensor<R> batch(std::span<const bool> batched, SourceLoc loc, const Tensor<T>& x, const Tensor<T>& w) const {
    if (batched[1]) return detail::batch_by_loop<R>(*this, batched, loc, x, w);
    return fold_samples<R>(*this, batched, {true, false}, loc, x, w);
  }
  template <class T>
  void run(Device d, const Tensor<T>& x, const Tensor<T>& w, Tensor<T>& y, const ir::BlockDone* done) const {
    kernels::conv2d_forward(d, geometry, x.data(), w.data(), y.data(), done);
  }
  template <class T>
  autograd::Grads grad(const Tensor<T>& g, Needs<2> needs, SourceLoc loc, const Tensor<T>& x, const Tensor<T>& w) const;
};
/// Conv2D's gradient with respect to its input.
struct Conv2DInputGrad : Windowed<cpu::Conv2dGeometry> {
  static constexpr std::string_view name = "Conv2DInputGrad";
  template <class R> static OpTraits traits() { return {.contraction = true}; }
  static constexpr Needs<2> differentiable{true, true}, saved{true, true};
  static constexpr bool multilinear = true;
  Shape output_shape() const { return {geometry.n, geometry.c_in, geometry.h, geometry.w}; }
  template <class R, class T>
  Tensor<R> batch(std::span<const bool> batched, SourceLoc loc, const Tensor<T>& gy, const Tensor<T>& w) const {
    if (batched[1]) return detail::batch_by_loop<R>(*this, batched, loc, gy, w);
    return fold_samples<R>(*this, batched, {true, false}, loc, gy, w);
  }
  template <class T> void run(Device d, const Tensor<T>& gy, const Tensor<T>& w, Tensor<T>& gx) const {
    kernels::conv2d_backward_input(d, geometry, gy.data(), w.data(), gx.data());
  }
  template <class T> autograd::Grads grad(const Tensor<T>& u, Needs<2> needs, SourceLoc loc, const Tensor<T>& gy,
                                          const Tensor<T>& w) const;
};
/// Conv2D's gradient with respect to its weights.
struct Conv2DWeightGrad : Windowed<cpu::Conv2dGeometry> {
  static constexpr std::string_view name = "Conv2DWeightGrad";
  template <class R> static OpTraits traits() { return {.contraction = true}; }
  static constexpr Needs<2> differentiable{true, true}, saved{true, true};
  static constexpr bool multilinear = true;
  Shape output_shape() const { return {geometry.c_out, geometry.c_in, geometry.kh, geometry.kw}; }
  /// A sum over the samples: each value's weights gradient is its own.
  template <class R, class T>
  Tensor<R> batch(std::span<const bool> batched, SourceLoc loc, const Tensor<T>& x, const Tensor<T>& gy) const {
    return detail::batch_by_loop<R>(*this, batched, loc, x, gy);
  }
  template <class T> void run(Device d, const Tensor<T>& x, const Tensor<T>& gy, Tensor<T>& gw) const {
    kernels::conv2d_backward_weight(d, geometry, x.data(), gy.data(), gw.data());
  }
  template <class T> autograd::Grads grad(const Tensor<T>& v, Needs<2> needs, SourceLoc loc, const Tensor<T>& x,
                                          const Tensor<T>& gy) const;
};

/// The plane offset of each window's first maximum (int32, -1 for an empty window): the argmax
/// max pooling's forward and backward share. An index: no gradient.
struct MaxPoolArgmax : Windowed<cpu::Pool2dGeometry> {
  static constexpr std::string_view name = "MaxPoolArgmax";
  Shape output_shape() const { return {geometry.n, geometry.c, geometry.out_h, geometry.out_w}; }
  template <class R, class T> Tensor<R> batch(std::span<const bool> batched, SourceLoc loc, const Tensor<T>& x) const {
    return fold_samples<R>(*this, batched, {true}, loc, x);
  }
  template <class T> void run(Device d, const Tensor<T>& x, Tensor<std::int32_t>& idx) const {
    kernels::max_pool2d_argmax(d, geometry, x.data(), idx.data());
  }
};
/// out[o] = v at window o's argmax idx[o]: max pooling is MaxPoolTake(x, MaxPoolArgmax(x)).
struct MaxPoolTake : Windowed<cpu::Pool2dGeometry> {
  static constexpr std::string_view name = "MaxPoolTake";
  static constexpr Needs<2> differentiable{true, false}, saved{false, true};
  static constexpr bool multilinear = true;
  Shape output_shape() const { return {geometry.n, geometry.c, geometry.out_h, geometry.out_w}; }
  template <class R, class T> Tensor<R> batch(std::span<const bool> batched, SourceLoc loc, const Tensor<T>& v,
                                              const Tensor<std::int32_t>& idx) const {
    return fold_samples<R>(*this, batched, {true, true}, loc, v, idx);
  }
  template <class T> void run(Device d, const Tensor<T>& v, const Tensor<std::int32_t>& idx, Tensor<T>& out) const {
    kernels::max_pool2d_take(d, geometry, idx.data(), v.data(), out.data());
  }
  template <class T> autograd::Grads grad(const Tensor<T>& u, Needs<2>, SourceLoc loc, const Tensor<T>&,
                                          const Tensor<std::int32_t>& idx) const;
};
/// Max pooling's values and argmax from one pass over x (outputs: values, then argmax): what
/// a graph runs for MaxPoolTake(x, MaxPoolArgmax(x)), the pair fusion finds (passes/fuse.hpp).
/// With drop_nonpositive the argmax is -1 where the maximum is not above 0, so that a put
/// through it carries ReLU's gradient mask too. Made only after differentiation, so it has no
/// derivative or batching rules.
struct MaxPoolWithArgmax : Windowed<cpu::Pool2dGeometry> {
  static constexpr std::string_view name = "MaxPoolWithArgmax";
  bool drop_nonpositive = false;
  std::vector<ir::Attr> attrs() const {
    std::vector<ir::Attr> out = window_attrs(geometry);
    if (drop_nonpositive) out.push_back({"drop_nonpositive", "true"});
    return out;
  }
  bool operator==(const MaxPoolWithArgmax&) const = default;
  template <class T> void run(Device d, const Tensor<T>& x, Tensor<T>& values, Tensor<std::int32_t>& idx) const {
    kernels::max_pool2d_argmax(d, geometry, x.data(), idx.data(), values.data(), drop_nonpositive);
  }
};
/// gx = each gy[o] added at its window's argmax idx[o], zeros elsewhere: max pooling's gradient
/// with the argmax given, and MaxPoolTake's adjoint.
struct MaxPoolPut : Windowed<cpu::Pool2dGeometry> {
  static constexpr std::string_view name = "MaxPoolPut";
  static constexpr Needs<2> differentiable{false, true}, saved{true, false};
  static constexpr bool multilinear = true;
  Shape output_shape() const { return {geometry.n, geometry.c, geometry.h, geometry.w}; }
  template <class R, class T> Tensor<R> batch(std::span<const bool> batched, SourceLoc loc,
                                              const Tensor<std::int32_t>& idx, const Tensor<T>& gy) const {
    return fold_samples<R>(*this, batched, {true, true}, loc, idx, gy);
  }
  template <class T> void run(Device d, const Tensor<std::int32_t>& idx, const Tensor<T>& gy, Tensor<T>& gx) const {
    kernels::max_pool2d_put(d, geometry, idx.data(), gy.data(), gx.data());
  }
  template <class T> autograd::Grads grad(const Tensor<T>& u, Needs<2>, SourceLoc loc, const Tensor<std::int32_t>& idx,
                                          const Tensor<T>&) const;
};

/// A convolution whose output goes through max pooling, in one node (backend/cpu/conv_pooled.hpp;
/// the pool's input is the convolution's output): the forward with the ReLU between them, and
/// the gradients without the put, Conv2DInputGrad(MaxPoolPut(idx, gp), w) and
/// Conv2DWeightGrad(x, MaxPoolPut(idx, gp)) summed over the pooled elements only. Fusion makes
/// them (passes/fuse.hpp), after differentiation: no derivative or batching rules.
struct ThroughMaxPool {
  cpu::Conv2dGeometry conv;
  cpu::Pool2dGeometry pool;
  std::vector<ir::Attr> attrs() const {
    std::vector<ir::Attr> out = window_attrs(conv);
    for (ir::Attr a : window_attrs(pool)) out.push_back({"pool_" + a.name, a.value});
    return out;
  }
  bool operator==(const ThroughMaxPool&) const = default;
};
/// MaxPoolWithArgmax(ReLU(Conv2D(x, w) + b)) with drop_nonpositive, b of each channel or none
/// (inputs: x, w, and b when given; outputs: values, then argmax): each image's convolution
/// pooled while in cache, never stored whole.
struct Conv2DReLUMaxPool : ThroughMaxPool {
  static constexpr std::string_view name = "Conv2DReLUMaxPool";
  template <class T> void run(Device d, const Tensor<T>& x, const Tensor<T>& w, const T* bias, Tensor<T>& values,
                              Tensor<std::int32_t>& idx) const {
    kernels::conv2d_relu_max_pool(d, conv, pool, x.data(), w.data(), bias, values.data(), idx.data());
  }
};
/// gx from the pooled gradient (inputs: idx, gp, w).
struct Conv2DInputGradPooled : ThroughMaxPool {
  static constexpr std::string_view name = "Conv2DInputGradPooled";
  template <class T>
  void run(Device d, const Tensor<std::int32_t>& idx, const Tensor<T>& gp, const Tensor<T>& w, Tensor<T>& gx) const {
    kernels::conv2d_backward_input_pooled(d, conv, pool, idx.data(), gp.data(), w.data(), gx.data());
  }
};
/// gw from the pooled gradient (inputs: x, idx, gp).
struct Conv2DWeightGradPooled : ThroughMaxPool {
  static constexpr std::string_view name = "Conv2DWeightGradPooled";
  template <class T>
  void run(Device d, const Tensor<T>& x, const Tensor<std::int32_t>& idx, const Tensor<T>& gp, Tensor<T>& gw) const {
    kernels::conv2d_backward_weight_pooled(d, conv, pool, x.data(), idx.data(), gp.data(), gw.data());
  }
};

/// Mean over each window (padding excluded from the count).
struct AvgPool : Windowed<cpu::Pool2dGeometry> {
  static constexpr std::string_view name = "AvgPool";
  static constexpr Needs<1> differentiable{true}, saved{false};
  static constexpr bool multilinear = true;
  Shape output_shape() const { return {geometry.n, geometry.c, geometry.out_h, geometry.out_w}; }
  template <class R, class T> Tensor<R> batch(std::span<const bool> batched, SourceLoc loc, const Tensor<T>& x) const {
    return fold_samples<R>(*this, batched, {true}, loc, x);
  }
  template <class T> void run(Device d, const Tensor<T>& x, Tensor<T>& y) const {
    kernels::avg_pool2d_forward(d, geometry, x.data(), y.data());
  }
  template <class T> autograd::Grads grad(const Tensor<T>& g, Needs<1>, SourceLoc loc, const Tensor<T>&) const;
};
/// gy spread evenly over each window: AvgPool's gradient and adjoint.
struct AvgPoolGrad : Windowed<cpu::Pool2dGeometry> {
  static constexpr std::string_view name = "AvgPoolGrad";
  static constexpr Needs<1> differentiable{true}, saved{false};
  static constexpr bool multilinear = true;
  Shape output_shape() const { return {geometry.n, geometry.c, geometry.h, geometry.w}; }
  template <class R, class T> Tensor<R> batch(std::span<const bool> batched, SourceLoc loc, const Tensor<T>& g) const {
    return fold_samples<R>(*this, batched, {true}, loc, g);
  }
  template <class T> void run(Device d, const Tensor<T>& gy, Tensor<T>& gx) const {
    kernels::avg_pool2d_backward(d, geometry, gy.data(), gx.data());
  }
  template <class T> autograd::Grads grad(const Tensor<T>& u, Needs<1>, SourceLoc loc, const Tensor<T>&) const;
};

struct ResizeBilinear : Windowed<ResizeGeometry> {
  static constexpr std::string_view name = "ResizeBilinear";
  static constexpr Needs<1> differentiable{true}, saved{false};
  static constexpr bool multilinear = true;
  Shape output_shape() const { return {geometry.n, geometry.c, geometry.out_h, geometry.out_w}; }
  template <class R, class T> Tensor<R> batch(std::span<const bool> batched, SourceLoc loc, const Tensor<T>& x) const {
    return fold_samples<R>(*this, batched, {true}, loc, x);
  }
  template <class T> void run(Device d, const Tensor<T>& x, Tensor<T>& y) const {
    const ResizeGeometry& r = geometry;
    kernels::resize_bilinear_forward(d, r.n, r.c, r.h, r.w, r.out_h, r.out_w, r.align_corners, x.data(), y.data());
  }
  template <class T> autograd::Grads grad(const Tensor<T>& g, Needs<1>, SourceLoc loc, const Tensor<T>&) const;
};
/// ResizeBilinear's gradient and adjoint.
struct ResizeBilinearGrad : Windowed<ResizeGeometry> {
  static constexpr std::string_view name = "ResizeBilinearGrad";
  static constexpr Needs<1> differentiable{true}, saved{false};
  static constexpr bool multilinear = true;
  Shape output_shape() const { return {geometry.n, geometry.c, geometry.h, geometry.w}; }
  template <class R, class T> Tensor<R> batch(std::span<const bool> batched, SourceLoc loc, const Tensor<T>& g) const {
    return fold_samples<R>(*this, batched, {true}, loc, g);
  }
  template <class T> void run(Device d, const Tensor<T>& gy, Tensor<T>& gx) const {
    const ResizeGeometry& r = geometry;
    kernels::resize_bilinear_backward(d, r.n, r.c, r.h, r.w, r.out_h, r.out_w, r.align_corners, gy.data(), gx.data());
  }
  template <class T> autograd::Grads grad(const Tensor<T>& u, Needs<1>, SourceLoc loc, const Tensor<T>&) const;
};

// Each convolution gradient costs a convolution: only those an input needs are computed.
template <class T> autograd::Grads Conv2D::grad(const Tensor<T>& g, Needs<2> needs, SourceLoc loc, const Tensor<T>& x,
                                                const Tensor<T>& w) const {
  return {needs[0] ? detail::apply<T>(Conv2DInputGrad{geometry}, loc, g, w) : Tensor<T>(),
          needs[1] ? detail::apply<T>(Conv2DWeightGrad{geometry}, loc, x, g) : Tensor<T>()};
}
template <class T> autograd::Grads Conv2DInputGrad::grad(const Tensor<T>& u, Needs<2> needs, SourceLoc loc,
                                                         const Tensor<T>& gy, const Tensor<T>& w) const {
  return {needs[0] ? detail::apply<T>(Conv2D{geometry}, loc, u, w) : Tensor<T>(),
          needs[1] ? detail::apply<T>(Conv2DWeightGrad{geometry}, loc, u, gy) : Tensor<T>()};
}
template <class T> autograd::Grads Conv2DWeightGrad::grad(const Tensor<T>& v, Needs<2> needs, SourceLoc loc,
                                                          const Tensor<T>& x, const Tensor<T>& gy) const {
  return {needs[0] ? detail::apply<T>(Conv2DInputGrad{geometry}, loc, gy, v) : Tensor<T>(),
          needs[1] ? detail::apply<T>(Conv2D{geometry}, loc, x, v) : Tensor<T>()};
}
template <class T> autograd::Grads MaxPoolTake::grad(const Tensor<T>& u, Needs<2>, SourceLoc loc, const Tensor<T>&,
                                                     const Tensor<std::int32_t>& idx) const {
  return {detail::apply<T>(MaxPoolPut{geometry}, loc, idx, u), TensorBase()};
}
template <class T> autograd::Grads MaxPoolPut::grad(const Tensor<T>& u, Needs<2>, SourceLoc loc,
                                                    const Tensor<std::int32_t>& idx, const Tensor<T>&) const {
  return {TensorBase(), detail::apply<T>(MaxPoolTake{geometry}, loc, u, idx)};
}
template <class T> autograd::Grads AvgPool::grad(const Tensor<T>& g, Needs<1>, SourceLoc loc, const Tensor<T>&) const {
  return {detail::apply<T>(AvgPoolGrad{geometry}, loc, g)};
}
template <class T>
autograd::Grads AvgPoolGrad::grad(const Tensor<T>& u, Needs<1>, SourceLoc loc, const Tensor<T>&) const {
  return {detail::apply<T>(AvgPool{geometry}, loc, u)};
}
template <class T>
autograd::Grads ResizeBilinear::grad(const Tensor<T>& g, Needs<1>, SourceLoc loc, const Tensor<T>&) const {
  return {detail::apply<T>(ResizeBilinearGrad{geometry}, loc, g)};
}
template <class T>
autograd::Grads ResizeBilinearGrad::grad(const Tensor<T>& u, Needs<1>, SourceLoc loc, const Tensor<T>&) const {
  return {detail::apply<T>(ResizeBilinear{geometry}, loc, u)};
}

/// [labels..., depth] with 1 at each label. Labels are checked when the op runs: under jit
/// their values are known only then. An index: no gradient.
struct OneHot {
  static constexpr std::string_view name = "OneHot";
  std::int64_t depth = 0;
  std::int64_t count = 0;  // labels
  std::vector<ir::Attr> attrs() const { return {{"depth", std::to_string(depth)}}; }
  bool operator==(const OneHot&) const = default;
  Shape output_shape(const Shape& labels) const {
    Shape out = labels;
    out.push_back(depth);
    return out;
  }
  void check(std::span<const TensorBase> in, SourceLoc loc) const { detail::check_labels(name, in[0], depth, loc); }
  template <class R> Tensor<R> batch(std::span<const bool>, SourceLoc loc, const Tensor<std::int32_t>& labels) const {
    return detail::apply<R>(OneHot{depth, count * labels.shape()[0]}, loc, labels);
  }
  template <class T> void run(Device d, const Tensor<std::int32_t>& labels, Tensor<T>& out) const {
    kernels::tabulate(d, out.data(), count * depth, detail::OneHotElement<T>{labels.data(), depth});
  }
};

/// Per-sample losses [rows] of logits [rows, classes] against int32 labels [rows]: one op, whose
/// gradient is one op.
struct SoftmaxCrossEntropy {
  static constexpr std::string_view name = "SoftmaxCrossEntropy";
  static constexpr Needs<2> differentiable{true, false}, saved{true, true};
  std::int64_t rows = 0, classes = 0;
  bool operator==(const SoftmaxCrossEntropy&) const = default;
  /// The batch's rows one after the other: rows x batch rows.
  template <class R, class T> Tensor<R> batch(std::span<const bool> batched, SourceLoc loc, const Tensor<T>& logits,
                                              const Tensor<std::int32_t>& labels) const {
    const std::int64_t size = detail::batch_size(batched, logits, labels);
    const auto loss = detail::apply<R>(SoftmaxCrossEntropy{size * rows, classes}, loc,
                                       detail::fold_batch(logits, batched[0], size, loc),
                                       detail::fold_batch(labels, batched[1], size, loc));
    return reshape(loss, {size, rows}, loc);
  }
  Shape output_shape() const { return {rows}; }
  void check(std::span<const TensorBase> in, SourceLoc loc) const {
    detail::check_labels("SoftmaxCrossEntropyWithLogits", in[1], classes, loc);
  }
  template <class T>
  void run(Device d, const Tensor<T>& logits, const Tensor<std::int32_t>& labels, Tensor<T>& loss) const {
    kernels::softmax_xent_forward(d, logits.data(), labels.data(), rows, classes, loss.data());
  }
  template <class T> autograd::Grads grad(const Tensor<T>& g, Needs<2>, SourceLoc loc, const Tensor<T>& logits,
                                          const Tensor<std::int32_t>& labels) const;
  template <class T> Tensor<T> jvp(std::span<const TensorBase> t, SourceLoc loc, const Tensor<T>& loss,
                                   const Tensor<T>& logits, const Tensor<std::int32_t>& labels) const;
};
/// g[:, None] * (softmax(logits) - one_hot(labels)): SoftmaxCrossEntropy's gradient with respect
/// to the logits.
struct SoftmaxCrossEntropyGrad {
  static constexpr std::string_view name = "SoftmaxCrossEntropyGrad";
  static constexpr Needs<3> differentiable{true, false, true}, saved{true, true, true};
  std::int64_t rows = 0, classes = 0;
  bool operator==(const SoftmaxCrossEntropyGrad&) const = default;
  template <class R, class T> Tensor<R> batch(std::span<const bool> batched, SourceLoc loc, const Tensor<T>& logits,
                                              const Tensor<std::int32_t>& labels, const Tensor<T>& g) const {
    const std::int64_t size = detail::batch_size(batched, logits, labels, g);
    const auto grad = detail::apply<R>(
        SoftmaxCrossEntropyGrad{size * rows, classes}, loc, detail::fold_batch(logits, batched[0], size, loc),
        detail::fold_batch(labels, batched[1], size, loc), detail::fold_batch(g, batched[2], size, loc));
    return reshape(grad, {size, rows, classes}, loc);
  }
  Shape output_shape() const { return {rows, classes}; }
  void check(std::span<const TensorBase> in, SourceLoc loc) const { detail::check_labels(name, in[1], classes, loc); }
  template <class T> void run(Device d, const Tensor<T>& logits, const Tensor<std::int32_t>& labels, const Tensor<T>& g,
                              Tensor<T>& grad) const {
    kernels::softmax_xent_backward(d, logits.data(), labels.data(), g.data(), rows, classes, grad.data());
  }
  template <class T> autograd::Grads grad(const Tensor<T>& u, Needs<3>, SourceLoc loc, const Tensor<T>& logits,
                                          const Tensor<std::int32_t>& labels, const Tensor<T>& g) const;
  template <class T> Tensor<T> jvp(std::span<const TensorBase> t, SourceLoc loc, const Tensor<T>& out,
                                   const Tensor<T>& logits, const Tensor<std::int32_t>& labels,
                                   const Tensor<T>& g) const;
};
template <class T> autograd::Grads SoftmaxCrossEntropy::grad(const Tensor<T>& g, Needs<2>, SourceLoc loc,
                                                             const Tensor<T>& logits,
                                                             const Tensor<std::int32_t>& labels) const {
  return {detail::apply<T>(SoftmaxCrossEntropyGrad{rows, classes}, loc, logits, labels, g), TensorBase()};
}

/// softmax(q k^T * scale) v over [batch, t, d] operands, masked as its geometry says
/// (backend/attention_geometry.hpp): one op, on the cpu FlashAttention's blocked online softmax
/// (backend/cpu/attention.hpp), so no [tq, tk] score matrix is made. Its gradient is one op too,
/// AttentionGrad; the gradient's own derivatives and forward-mode tangents come from the
/// composite that does make the scores (detail::attention_probabilities). In the heads layout
/// (made only by the jit's layout pass) q, k and v are [batch / heads, t, width] buffers, out
/// [batch / heads, tq, heads * dv].
struct Attention {
  static constexpr std::string_view name = "ScaledDotProductAttention";
  static constexpr Needs<3> differentiable{true, true, true}, saved{true, true, true};
  static constexpr bool reads_output = true;
  cpu::AttentionGeometry geometry;
  /// Set eagerly when the tape records the op: run leaves each query's log-denominator ([batch,
  /// tq]) here, and the gradient reads it (AttentionGradWithLse) instead of working it out
  /// again, as PyTorch's eager forward keeps its logsumexp. Never while tracing: a graph pairs
  /// the two ops itself (fuse). Not part of the op's identity.
  std::shared_ptr<TensorBase> saved_lse{};
  std::vector<ir::Attr> attrs() const {
    std::vector<ir::Attr> a{{"causal", geometry.causal ? "true" : "false"}, {"scale", detail::concat(geometry.scale)}};
    if (geometry.heads)
      a.push_back({"heads", detail::concat(geometry.heads, " of width ", geometry.width, " at columns ",
                                           geometry.q_column, ", ", geometry.k_column, ", ", geometry.v_column)});
    return a;
  }
  bool operator==(const Attention& other) const { return geometry == other.geometry; }
  Shape output_shape() const {
    const auto& g = geometry;
    return g.heads ? Shape{g.batch / g.heads, g.tq, g.heads * g.dv} : Shape{g.batch, g.tq, g.dv};
  }
  /// The vmap batch as more batch items.
  template <class R, class T> Tensor<R> batch(std::span<const bool> batched, SourceLoc loc, const Tensor<T>& q,
                                              const Tensor<T>& k, const Tensor<T>& v) const {
    const std::int64_t size = detail::batch_size(batched, q, k, v);
    cpu::AttentionGeometry folded = geometry;
    folded.batch *= size;
    const auto out =
        detail::apply<R>(Attention{folded}, loc, detail::fold_batch(q, batched[0], size, loc),
                         detail::fold_batch(k, batched[1], size, loc), detail::fold_batch(v, batched[2], size, loc));
    return reshape(out, detail::with_batch(size, output_shape()).to_vector(), loc);
  }
  template <class T>
  void run(Device d, const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, Tensor<T>& out) const {
    if (!saved_lse) return kernels::attention_forward(d, geometry, q.data(), k.data(), v.data(), out.data());
    auto lse = Tensor<T>::empty({geometry.batch, geometry.tq}, d);
    kernels::attention_forward(d, geometry, q.data(), k.data(), v.data(), out.data(), lse.data());
    *saved_lse = lse;
  }
  template <class T> autograd::Grads grad(const Tensor<T>& g, const Tensor<T>& out, Needs<3>, SourceLoc loc,
                                          const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v) const;
  template <class T> Tensor<T> jvp(std::span<const TensorBase> t, SourceLoc loc, const Tensor<T>& out,
                                   const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v) const;
};

/// Attention's gradients for its output's gradient g, from q, k, v and that output, all three
/// from one kernel: per batch item dq, dk and dv flattened one after the other
/// (AttentionGeometry::grads_size), or in the heads layout one buffer like q's with each at its
/// operand's columns. Made by Attention's gradient only where that is not differentiated again
/// (which the composite serves), so it has no derivative rules.
struct AttentionGrad {
  static constexpr std::string_view name = "ScaledDotProductAttentionGrad";
  cpu::AttentionGeometry geometry;
  std::vector<ir::Attr> attrs() const { return Attention{geometry}.attrs(); }
  bool operator==(const AttentionGrad&) const = default;
  Shape output_shape() const {
    const auto& g = geometry;
    return g.heads ? Shape{g.batch / g.heads, g.tq, g.width} : Shape{g.batch, g.grads_size()};
  }
  template <class R, class T> Tensor<R> batch(std::span<const bool> batched, SourceLoc loc, const Tensor<T>& q,
                                              const Tensor<T>& k, const Tensor<T>& v, const Tensor<T>& out,
                                              const Tensor<T>& g) const {
    const std::int64_t size = detail::batch_size(batched, q, k, v, out, g);
    cpu::AttentionGeometry folded = geometry;
    folded.batch *= size;
    const auto grads =
        detail::apply<R>(AttentionGrad{folded}, loc, detail::fold_batch(q, batched[0], size, loc),
                         detail::fold_batch(k, batched[1], size, loc), detail::fold_batch(v, batched[2], size, loc),
                         detail::fold_batch(out, batched[3], size, loc), detail::fold_batch(g, batched[4], size, loc));
    return reshape(grads, detail::with_batch(size, output_shape()).to_vector(), loc);
  }
  template <class T> void run(Device d, const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                              const Tensor<T>& out, const Tensor<T>& g, Tensor<T>& grads) const {
    if (grads.numel() == 0) return;
    kernels::attention_backward(d, geometry, q.data(), k.data(), v.data(), out.data(), g.data(), grads.data());
  }
};

/// Attention that also writes each query's log-denominator ([batch, tq]) for its gradient, and
/// AttentionGrad reading those instead of working them out again: made only by the jit's fuse
/// pass where a graph holds an Attention and its gradient (passes/fuse.hpp), so they have no
/// derivative rules. The same values as the pair they replace, bit for bit.
struct AttentionWithLse {
  static constexpr std::string_view name = "ScaledDotProductAttentionWithLse";
  cpu::AttentionGeometry geometry;
  std::vector<ir::Attr> attrs() const { return Attention{geometry}.attrs(); }
  bool operator==(const AttentionWithLse&) const = default;
  template <class T>
  void run(Device d, const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, Tensor<T>& out, Tensor<T>& lse) const {
    kernels::attention_forward(d, geometry, q.data(), k.data(), v.data(), out.data(), lse.data());
  }
};
struct AttentionGradWithLse {
  static constexpr std::string_view name = "ScaledDotProductAttentionGradWithLse";
  cpu::AttentionGeometry geometry;
  std::vector<ir::Attr> attrs() const { return Attention{geometry}.attrs(); }
  bool operator==(const AttentionGradWithLse&) const = default;
  Shape output_shape() const { return AttentionGrad{geometry}.output_shape(); }
  template <class T> void run(Device d, const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                              const Tensor<T>& out, const Tensor<T>& g, const Tensor<T>& lse, Tensor<T>& grads) const {
    if (grads.numel() == 0) return;
    kernels::attention_backward(d, geometry, q.data(), k.data(), v.data(), out.data(), g.data(), grads.data(),
                                lse.data());
  }
};

}  // namespace op

template <FloatingPoint T> Tensor<T> bias_add(const Tensor<T>& x, const Tensor<T>& b, SourceLoc loc) {
  detail::OpScope scope("BiasAdd", loc, {x, b});
  if (x.ndim() < 2 || b.ndim() != 1 || b.shape()[0] != x.shape()[1])
    throw_shape_error("BiasAdd", loc,
                      "bias must have shape [C] where C is axis 1 of x, which needs at least 2 axes (inputs ",
                      detail::describe_inputs({{"x", &x}, {"bias", &b}}), ")");
  std::vector<std::int64_t> dims(x.ndim() - 1, 1);
  dims[0] = b.shape()[0];
  return add(x, reshape(b, dims, loc), loc);
}

namespace detail {

/// Output extent and leading pad of one spatial axis.
struct AxisWindow {
  std::int64_t out = 0, pad_before = 0;
};

inline AxisWindow window_axis(std::string_view op, std::int64_t in, std::int64_t kernel, std::int64_t stride,
                              std::int64_t dilation, std::int64_t padding, PadMode mode, SourceLoc loc) {
  if (kernel < 1 || stride < 1 || dilation < 1 || padding < 0)
    throw_value_error(op, loc, "kernel (", kernel, "), stride (", stride, ") and dilation (", dilation,
                      ") must be positive and padding (", padding, ") non-negative");
  const std::int64_t span = checked_add(op, loc, "the kernel's span",
                                        checked_mul(op, loc, "dilation * (kernel - 1)", dilation, kernel - 1), 1);
  AxisWindow w;
  if (mode == PadMode::same) {
    w.out = in / stride + (in % stride != 0);  // ceil(in / stride); (out - 1) * stride < in
    w.pad_before =
        std::max<std::int64_t>(checked_add(op, loc, "the padded extent", (w.out - 1) * stride, span) - in, 0) / 2;
  } else {
    std::int64_t pad = mode == PadMode::pad ? padding : 0;
    const std::int64_t padded =
        checked_add(op, loc, "the padded extent", in, checked_mul(op, loc, "2 * padding", 2, pad));
    w.pad_before = pad;
    w.out = padded >= span ? (padded - span) / stride + 1 : 0;
  }
  return w;
}

}  // namespace detail

template <FloatingPoint T>
Tensor<T> conv2d(const Tensor<T>& x, const Tensor<T>& w, Conv2dOptions options, SourceLoc loc) {
  detail::OpScope scope(op::Conv2D::name, loc, {x, w});
  if (x.ndim() != 4 || w.ndim() != 4 || x.shape()[1] != w.shape()[1])
    throw_shape_error(op::Conv2D::name, loc,
                      "x must be [N, C_in, H, W] and w [C_out, C_in, KH, KW] with the same C_in (inputs ",
                      detail::describe_inputs({{"x", &x}, {"w", &w}}), ")");
  const Shape &xs = x.shape(), &ws = w.shape();
  auto rows = detail::window_axis(op::Conv2D::name, xs[2], ws[2], options.stride, options.dilation, options.padding,
                                  options.pad_mode, loc);
  auto cols = detail::window_axis(op::Conv2D::name, xs[3], ws[3], options.stride, options.dilation, options.padding,
                                  options.pad_mode, loc);
  if (rows.out <= 0 || cols.out <= 0)
    throw_shape_error(op::Conv2D::name, loc, "the kernel (with dilation ", options.dilation,
                      ") does not fit the padded input (inputs ", detail::describe_inputs({{"x", &x}, {"w", &w}}), ")");
  detail::checked_work(op::Conv2D::name, loc, "its multiply-adds",
                       {xs[0], ws[0], xs[1], ws[2], ws[3], rows.out, cols.out});
  detail::checked_work(
      op::Conv2D::name, loc, "the padded input",
      {xs[0], xs[1], detail::checked_add(op::Conv2D::name, loc, "the padded rows", xs[2], 2 * rows.pad_before),
       detail::checked_add(op::Conv2D::name, loc, "the padded columns", xs[3], 2 * cols.pad_before)});
  cpu::Conv2dGeometry geo{xs[0],
                          xs[1],
                          xs[2],
                          xs[3],
                          ws[0],
                          ws[2],
                          ws[3],
                          options.stride,
                          options.stride,
                          rows.pad_before,
                          cols.pad_before,
                          options.dilation,
                          options.dilation,
                          rows.out,
                          cols.out};
  return detail::apply<T>(op::Conv2D{geo}, loc, x, w);
}

namespace detail {

inline cpu::Pool2dGeometry pool_geometry(std::string_view op, const TensorBase& x, std::int64_t kernel,
                                         std::int64_t stride, PadMode mode, SourceLoc loc) {
  if (x.ndim() != 4) throw_shape_error(op, loc, "x must be [N, C, H, W] (input ", describe_inputs({{"x", &x}}), ")");
  const Shape& s = x.shape();
  if (mode == PadMode::pad) throw_value_error(op, loc, "pad_mode must be valid or same");
  auto rows = window_axis(op, s[2], kernel, stride, 1, 0, mode, loc);
  auto cols = window_axis(op, s[3], kernel, stride, 1, 0, mode, loc);
  if (rows.out <= 0 || cols.out <= 0)
    throw_shape_error(op, loc, "kernel ", kernel, " does not fit input ", describe_inputs({{"x", &x}}));
  checked_work(op, loc, "the window elements it visits", {s[0], s[1], rows.out, cols.out, kernel, kernel});
  checked_work(op, loc, "the padded input",
               {checked_add(op, loc, "the padded rows", s[2], 2 * rows.pad_before + 1),
                checked_add(op, loc, "the padded columns", s[3], 2 * cols.pad_before + 1)});
  return {s[0], s[1], s[2], s[3], kernel, kernel, stride, stride, rows.pad_before, cols.pad_before, rows.out, cols.out};
}

// Max pooling's three primitives (declared in ops/nn.hpp).
template <FloatingPoint T>
Tensor<std::int32_t> max_pool_argmax(const Tensor<T>& x, const cpu::Pool2dGeometry& geo, SourceLoc loc) {
  return apply<std::int32_t>(op::MaxPoolArgmax{geo}, loc, x);
}
template <FloatingPoint T> Tensor<T> max_pool_take(const Tensor<T>& v, const Tensor<std::int32_t>& idx,
                                                   const cpu::Pool2dGeometry& geo, SourceLoc loc) {
  return apply<T>(op::MaxPoolTake{geo}, loc, v, idx);
}
template <FloatingPoint T> Tensor<T> max_pool_put(const Tensor<std::int32_t>& idx, const Tensor<T>& gy,
                                                  const cpu::Pool2dGeometry& geo, SourceLoc loc) {
  return apply<T>(op::MaxPoolPut{geo}, loc, idx, gy);
}

template <FloatingPoint T> Tensor<T> reduce_losses(const Tensor<T>& losses, Reduction reduction, SourceLoc loc) {
  switch (reduction) {
    case Reduction::none:
      return losses;
    case Reduction::sum:
      return sum(losses, {}, false, loc);
    case Reduction::mean:
      break;
  }
  return mean(losses, {}, false, loc);
}

}  // namespace detail

// Runs as MaxPoolTake(x, MaxPoolArgmax(x)): the backward reuses the argmax.
template <FloatingPoint T>
Tensor<T> max_pool2d(const Tensor<T>& x, std::int64_t kernel, std::int64_t stride, PadMode pad_mode, SourceLoc loc) {
  constexpr std::string_view name = "MaxPool";
  detail::OpScope scope(name, loc, {x});
  const auto geo = detail::pool_geometry(name, x, kernel, stride, pad_mode, loc);
  if (geo.h * geo.w > std::numeric_limits<std::int32_t>::max())
    throw_shape_error(name, loc, "a plane of ", geo.h * geo.w, " elements (input ", dtype_name(x.dtype()), x.shape(),
                      ") is beyond the int32 window offsets max pooling keeps for its gradient (at most 2^31 - 1)");
  return detail::max_pool_take(x, detail::max_pool_argmax(x, geo, loc), geo, loc);
}
template <FloatingPoint T> Tensor<T> max_pool2d(const Tensor<T>& x, std::int64_t kernel, SourceLoc loc) {
  return max_pool2d(x, kernel, kernel, PadMode::valid, loc);
}

template <FloatingPoint T>
Tensor<T> avg_pool2d(const Tensor<T>& x, std::int64_t kernel, std::int64_t stride, PadMode pad_mode, SourceLoc loc) {
  detail::OpScope scope(op::AvgPool::name, loc, {x});
  return detail::apply<T>(op::AvgPool{detail::pool_geometry(op::AvgPool::name, x, kernel, stride, pad_mode, loc)}, loc,
                          x);
}
template <FloatingPoint T> Tensor<T> avg_pool2d(const Tensor<T>& x, std::int64_t kernel, SourceLoc loc) {
  return avg_pool2d(x, kernel, kernel, PadMode::valid, loc);
}

template <FloatingPoint T> Tensor<T> resize_bilinear(const Tensor<T>& x, std::int64_t out_h, std::int64_t out_w,
                                                     bool align_corners, SourceLoc loc) {
  detail::OpScope scope(op::ResizeBilinear::name, loc, {x});
  if (x.ndim() != 4)
    throw_shape_error(op::ResizeBilinear::name, loc, "x must be [N, C, H, W] (input ",
                      detail::describe_inputs({{"x", &x}}), ")");
  if (out_h < 1 || out_w < 1)
    throw_value_error(op::ResizeBilinear::name, loc, "output size ", out_h, "x", out_w, " must be positive");
  const Shape& s = x.shape();
  if (s[2] < 1 || s[3] < 1) throw_shape_error(op::ResizeBilinear::name, loc, "input ", s, " has an empty spatial axis");
  return detail::apply<T>(op::ResizeBilinear{{s[0], s[1], s[2], s[3], out_h, out_w, align_corners}}, loc, x);
}

template <FloatingPoint T> Tensor<T> log_softmax(const Tensor<T>& x, std::int64_t axis, SourceLoc loc) {
  detail::OpScope scope("LogSoftmax", loc, {x});
  int a = normalize_axis(axis, x.ndim(), "LogSoftmax", loc);
  // The shift is a constant for autodiff: the result does not depend on it.
  auto shift = max(x.detach(), {a}, true, loc);
  auto shifted = sub(x, shift, loc);
  return sub(shifted, log(sum(exp(shifted, loc), {a}, true, loc), loc), loc);
}

template <FloatingPoint T> Tensor<T> softmax(const Tensor<T>& x, std::int64_t axis, SourceLoc loc) {
  detail::OpScope scope("Softmax", loc, {x});
  int a = normalize_axis(axis, x.ndim(), "Softmax", loc);
  // exp(x - max) lies in (0, 1] and its sum in [1, n]: one exp per element, and no overflow.
  // Scaled by the sum's reciprocal, as PyTorch does: one division per row, not per element.
  auto e = exp(sub(x, max(x.detach(), {a}, true, loc), loc), loc);
  return mul(e, div(T(1), sum(e, {a}, true, loc), loc), loc);
}

template <FloatingPoint T> Tensor<T> gelu(const Tensor<T>& x, GeluApproximation approximate, SourceLoc loc) {
  detail::OpScope scope("GELU", loc, {x});
  const auto half_x = mul(x, T(0.5), loc);
  if (approximate == GeluApproximation::tanh) {
    const T sqrt_2_over_pi = std::numbers::sqrt2_v<T> * std::numbers::inv_sqrtpi_v<T>;
    const auto inner = mul(fma(mul(square(x, loc), T(0.044715), loc), x, x, loc), sqrt_2_over_pi, loc);
    return fma(half_x, tanh(inner, loc), half_x, loc);
  }
  return fma(half_x, erf(mul(x, T(1) / std::numbers::sqrt2_v<T>, loc), loc), half_x, loc);
}

template <FloatingPoint T> Tensor<T> layer_norm(const Tensor<T>& x, double eps, SourceLoc loc) {
  detail::OpScope scope("LayerNorm", loc, {x});
  if (x.ndim() == 0)
    throw_shape_error("LayerNorm", loc, "x must have an axis to normalize over, got a scalar ", dtype_name(x.dtype()),
                      x.shape());
  if (!(eps > 0)) throw_value_error("LayerNorm", loc, "eps must be > 0, got ", eps);
  const auto centered = sub(x, mean(x, {-1}, true, loc), loc);
  const auto variance = mean(square(centered, loc), {-1}, true, loc);
  return mul(centered, rsqrt(add(variance, static_cast<T>(eps), loc), loc), loc);
}

template <FloatingPoint T>
Tensor<T> layer_norm(const Tensor<T>& x, const Tensor<T>& gamma, const Tensor<T>& beta, double eps, SourceLoc loc) {
  detail::OpScope scope("LayerNorm", loc, {x, gamma, beta});
  const Shape features{x.ndim() > 0 ? x.shape()[x.ndim() - 1] : 0};
  if (x.ndim() > 0 && (gamma.shape() != features || beta.shape() != features))
    throw_shape_error("LayerNorm", loc, "gamma and beta must be ", features, ", x's last axis (inputs ",
                      detail::describe_inputs({{"x", &x}, {"gamma", &gamma}, {"beta", &beta}}), ")");
  return fma(layer_norm(x, eps, loc), gamma, beta, loc);
}

namespace detail {

/// [tq, tk], true where query i sees key j under a causal mask (AttentionGeometry::key_end),
/// made from constants: a compiled graph folds it.
inline Tensor<bool> causal_keep(std::int64_t tq, std::int64_t tk, SourceLoc loc) {
  const auto offset = sub(arange<std::int64_t>(tk, loc), reshape(arange<std::int64_t>(tq, loc), {tq, 1}, loc), loc);
  return less(offset, tk - tq + 1, loc);
}

/// Attention's probabilities [batch, tq, tk] as a composite of ops, zero where a query does
/// not see a key (and on the whole row of a query that sees none): what its derivatives past
/// the first are made of.
template <class T> Tensor<T> attention_probabilities(const cpu::AttentionGeometry& g, const Tensor<T>& q,
                                                     const Tensor<T>& k, SourceLoc loc) {
  const auto scores = mul(matmul(q, k, false, true, loc), static_cast<T>(g.scale), loc);
  if (!g.causal) return softmax(scores, -1, loc);
  const auto keep = causal_keep(g.tq, g.tk, loc);
  // The lowest finite score weighs exactly 0 beside any score the query sees; a query that
  // sees none gets a uniform row, zeroed by the outer where.
  return where(keep, softmax(where(keep, scores, std::numeric_limits<T>::lowest(), loc), -1, loc), T(0), loc);
}

/// The items [batch * heads, t, size] of a heads-layout buffer x [batch, t, width] whose heads
/// start at `column` (AttentionGeometry), and back: items [batch * heads, t, size] as the
/// columns [batch, t, heads * size] of one.
template <class T> Tensor<T> heads_as_items(const Tensor<T>& x, std::int64_t heads, std::int64_t column,
                                            std::int64_t size, SourceLoc loc) {
  const std::int64_t b = x.shape()[0], t = x.shape()[1];
  const auto part =
      column == 0 && heads * size == x.shape()[2] ? x : slice(x, {0, 0, column}, {b, t, heads * size}, loc);
  return reshape(transpose(reshape(part, {b, t, heads, size}, loc), {0, 2, 1, 3}, loc), {b * heads, t, size}, loc);
}
template <class T> Tensor<T> items_as_heads(const Tensor<T>& x, std::int64_t heads, SourceLoc loc) {
  const std::int64_t b = x.shape()[0] / heads, t = x.shape()[1], size = x.shape()[2];
  return reshape(transpose(reshape(x, {b, heads, t, size}, loc), {0, 2, 1, 3}, loc), {b, t, heads * size}, loc);
}

/// The standard layout of a heads-layout geometry.
inline cpu::AttentionGeometry standard_layout(cpu::AttentionGeometry g) {
  g.heads = g.width = g.q_column = g.k_column = g.v_column = 0;
  return g;
}

/// Whether a gradient rule's result will be differentiated again: recorded by a backward pass
/// that records itself, or carrying a forward-mode tangent.
inline bool differentiated_again(TensorRefs values) {
  if (is_grad_enabled())
    for (const TensorBase& t : values)
      if (t.impl()->requires_grad()) return true;
  return carries_tangents(values.begin(), values.end());
}

}  // namespace detail

template <class T> autograd::Grads op::Attention::grad(const Tensor<T>& g, const Tensor<T>& out, Needs<3> needs,
                                                       SourceLoc loc, const Tensor<T>& q, const Tensor<T>& k,
                                                       const Tensor<T>& v) const {
  const cpu::AttentionGeometry& s = geometry;
  if (s.tq == 0 || s.tk == 0) return {zeros_like(q), zeros_like(k), zeros_like(v)};
  if (s.heads) {  // the standard layout's gradients, each placed at its operand's columns
    auto items = [&](const Tensor<T>& x, std::int64_t column, std::int64_t size) {
      return detail::heads_as_items(x, s.heads, column, size, loc);
    };
    const auto grads = Attention{detail::standard_layout(s)}.grad(items(g, 0, s.dv), items(out, 0, s.dv), needs, loc,
                                                                  items(q, s.q_column, s.d), items(k, s.k_column, s.d),
                                                                  items(v, s.v_column, s.dv));
    auto place = [&](const TensorBase& grad, const Tensor<T>& like, std::int64_t column) {
      return slice_backward(detail::items_as_heads(Tensor<T>(grad), s.heads, loc), like.shape(), {0, 0, column}, loc);
    };
    return {place(grads[0], q, s.q_column), place(grads[1], k, s.k_column), place(grads[2], v, s.v_column)};
  }
  if (detail::differentiated_again({g, q, k, v})) {
    const auto p = detail::attention_probabilities(s, q, k, loc);
    const auto dp = matmul(g, v, false, true, loc);
    const auto ds = mul(mul(p, sub(dp, sum(mul(p, dp, loc), {2}, true, loc), loc), loc), static_cast<T>(s.scale), loc);
    return {matmul(ds, k, loc), matmul(ds, q, true, false, loc), matmul(p, g, true, false, loc)};
  }
  const bool lse_saved = saved_lse && saved_lse->defined();
  const auto grads = lse_saved ? detail::apply<T>(AttentionGradWithLse{s}, loc, q, k, v, out, g, Tensor<T>(*saved_lse))
                               : detail::apply<T>(AttentionGrad{s}, loc, q, k, v, out, g);
  auto part = [&](std::int64_t begin, std::int64_t rows, std::int64_t width) {
    return reshape(slice(grads, {0, begin}, {s.batch, rows * width}, loc), {s.batch, rows, width}, loc);
  };
  return {part(0, s.tq, s.d), part(s.tq * s.d, s.tk, s.d), part(s.tq * s.d + s.tk * s.d, s.tk, s.dv)};
}

// With p the probabilities and t_s the scores' tangent, softmax's Jacobian gives p's tangent
// p * (t_s - sum(p * t_s)); the output's is that times v, plus p times v's tangent.
template <class T> Tensor<T> op::Attention::jvp(std::span<const TensorBase> t, SourceLoc loc, const Tensor<T>& out,
                                                const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v) const {
  if (geometry.tq == 0 || geometry.tk == 0) return zeros_like(out);
  if (const std::int64_t heads = geometry.heads) {  // the standard layout's tangent, in the heads layout
    auto items = [&](const TensorBase& x, std::int64_t column, std::int64_t size) {
      return x.defined() ? TensorBase(detail::heads_as_items(Tensor<T>(x), heads, column, size, loc)) : TensorBase();
    };
    const std::array<TensorBase, 3> tangents{items(t[0], geometry.q_column, geometry.d),
                                             items(t[1], geometry.k_column, geometry.d),
                                             items(t[2], geometry.v_column, geometry.dv)};
    return detail::items_as_heads(
        Attention{detail::standard_layout(geometry)}.jvp(
            tangents, loc, Tensor<T>(items(out, 0, geometry.dv)), Tensor<T>(items(q, geometry.q_column, geometry.d)),
            Tensor<T>(items(k, geometry.k_column, geometry.d)), Tensor<T>(items(v, geometry.v_column, geometry.dv))),
        heads, loc);
  }
  const auto p = detail::attention_probabilities(geometry, q, k, loc);
  Tensor<T> scores, result;
  auto add_to = [&](Tensor<T>& sum, const Tensor<T>& part) { sum = sum.defined() ? add(sum, part, loc) : part; };
  if (t[0].defined()) add_to(scores, matmul(Tensor<T>(t[0]), k, false, true, loc));
  if (t[1].defined()) add_to(scores, matmul(q, Tensor<T>(t[1]), false, true, loc));
  if (scores.defined()) {
    scores = mul(scores, static_cast<T>(geometry.scale), loc);
    add_to(result, matmul(mul(p, sub(scores, sum(mul(p, scores, loc), {2}, true, loc), loc), loc), v, loc));
  }
  if (t[2].defined()) add_to(result, matmul(p, Tensor<T>(t[2]), loc));
  return result;
}

template <FloatingPoint T> Tensor<T> scaled_dot_product_attention(const Tensor<T>& q, const Tensor<T>& k,
                                                                  const Tensor<T>& v, AttentionOptions options,
                                                                  SourceLoc loc) {
  constexpr std::string_view op = op::Attention::name;
  detail::OpScope scope(op, loc, {q, k, v});
  auto inputs = [&] { return detail::describe_inputs({{"q", &q}, {"k", &k}, {"v", &v}}); };
  const int rank = q.ndim();
  if (rank < 2 || k.ndim() != rank || v.ndim() != rank)
    throw_shape_error(op, loc, "q, k and v must be [..., T, D] with the same number of axes, at least 2 (inputs ",
                      inputs(), ")");
  const Shape &qs = q.shape(), &ks = k.shape(), &vs = v.shape();
  std::int64_t batch = 1;
  for (int a = 0; a < rank - 2; ++a) {
    if (ks[a] != qs[a] || vs[a] != qs[a])
      throw_shape_error(op, loc, "q, k and v must have the same leading (batch) axes; axis ", a, " differs (inputs ",
                        inputs(), ")");
    batch *= qs[a];
  }
  const std::int64_t tq = qs[rank - 2], d = qs[rank - 1], tk = ks[rank - 2], dv = vs[rank - 1];
  if (ks[rank - 1] != d)
    throw_shape_error(op, loc, "k's last axis must equal q's (", d,
                      "), the length of each query-key dot product (inputs ", inputs(), ")");
  if (vs[rank - 2] != tk)
    throw_shape_error(op, loc, "v must have one row per key: its axis -2 must equal k's (", tk, ") (inputs ", inputs(),
                      ")");
  const double scale = options.scale.value_or(d > 0 ? 1 / std::sqrt(static_cast<double>(d)) : 1.0);
  if (!std::isfinite(scale)) throw_value_error(op, loc, "scale must be finite, got ", scale);
  detail::checked_work(op, loc, "the query-key products it computes",
                       {batch, tq, tk, std::max({d, dv, std::int64_t{1}})});
  // The gradient holds one item's dq, dk and dv in a row, whose length must be countable even
  // when there is no item.
  const std::string_view row = "the gradient's row tq * d + tk * (d + dv)";
  detail::checked_add(op, loc, row, detail::checked_mul(op, loc, row, tq, d),
                      detail::checked_mul(op, loc, row, tk, detail::checked_add(op, loc, row, d, dv)));
  op::Attention attention{cpu::AttentionGeometry{batch, tq, tk, d, dv, scale, options.causal}};
  if (!is_tracing() && detail::should_record(q, k, v)) attention.saved_lse = std::make_shared<TensorBase>();
  const auto out = detail::apply<T>(attention, loc, reshape(q, {batch, tq, d}, loc), reshape(k, {batch, tk, d}, loc),
                                    reshape(v, {batch, tk, dv}, loc));
  std::vector<std::int64_t> dims(qs.begin(), qs.end());
  dims.back() = dv;
  return reshape(out, dims, loc);
}

template <FloatingPoint T>
Tensor<T> one_hot(const Tensor<std::int32_t>& labels, std::int64_t num_classes, SourceLoc loc) {
  if (num_classes < 1) throw_value_error(op::OneHot::name, loc, "num_classes (", num_classes, ") must be positive");
  return detail::apply<T>(op::OneHot{num_classes, labels.numel()}, loc, labels);
}

// Second derivatives, from composite ops (softmax is one): with p = softmax(logits) and u the
// incoming gradient, d/dg = sum(u * (p - onehot)) and d/dlogits = g * (p u - p sum(p u)).
template <class T>
autograd::Grads op::SoftmaxCrossEntropyGrad::grad(const Tensor<T>& u, Needs<3>, SourceLoc loc, const Tensor<T>& logits,
                                                  const Tensor<std::int32_t>& labels, const Tensor<T>& g) const {
  const Tensor<T> p_minus_onehot = detail::apply<T>(*this, loc, logits, labels, ones_like(g));
  auto dg = sum(mul(u, p_minus_onehot, loc), {1}, false, loc);
  auto p = softmax(logits, -1, loc);
  auto pu = mul(p, u, loc);
  auto dlogits = mul(reshape(g, {g.numel(), 1}, loc), sub(pu, mul(p, sum(pu, {1}, true, loc), loc), loc), loc);
  return {dlogits, TensorBase(), dg};
}

// Tangents: the loss moves by sum((p - onehot) * t) per row; the gradient g (p - onehot) by
// t_g (p - onehot) + g (p t - p sum(p t)), softmax's Jacobian applied to the logits' tangent t.
template <class T> Tensor<T> op::SoftmaxCrossEntropy::jvp(std::span<const TensorBase> t, SourceLoc loc,
                                                          const Tensor<T>&, const Tensor<T>& logits,
                                                          const Tensor<std::int32_t>& labels) const {
  const Tensor<T> p_minus_onehot =
      detail::apply<T>(SoftmaxCrossEntropyGrad{rows, classes}, loc, logits, labels, ones<T>({rows}));
  return sum(mul(p_minus_onehot, Tensor<T>(t[0]), loc), {1}, false, loc);
}

template <class T> Tensor<T> op::SoftmaxCrossEntropyGrad::jvp(std::span<const TensorBase> t, SourceLoc loc,
                                                              const Tensor<T>&, const Tensor<T>& logits,
                                                              const Tensor<std::int32_t>& labels,
                                                              const Tensor<T>& g) const {
  Tensor<T> out;
  if (t[2].defined()) out = detail::apply<T>(*this, loc, logits, labels, Tensor<T>(t[2]));
  if (t[0].defined()) {
    const auto p = softmax(logits, -1, loc);
    const auto pt = mul(p, Tensor<T>(t[0]), loc);
    const auto moved = mul(reshape(g, {g.numel(), 1}, loc), sub(pt, mul(p, sum(pt, {1}, true, loc), loc), loc), loc);
    out = out.defined() ? add(out, moved, loc) : moved;
  }
  return out;
}

// One op, and its gradient one op: no softmax or one-hot tensor is made.
template <FloatingPoint T> Tensor<T> softmax_cross_entropy(const Tensor<T>& logits, const Tensor<std::int32_t>& labels,
                                                           Reduction reduction, SourceLoc loc) {
  detail::OpScope scope("SoftmaxCrossEntropyWithLogits", loc, {logits, labels});
  if (logits.ndim() != 2 || labels.ndim() != 1 || labels.shape()[0] != logits.shape()[0])
    throw_shape_error("SoftmaxCrossEntropyWithLogits", loc, "logits must be [N, C] and labels [N] (inputs ",
                      detail::describe_inputs({{"logits", &logits}, {"labels", &labels}}), ")");
  auto losses = detail::apply<T>(op::SoftmaxCrossEntropy{logits.shape()[0], logits.shape()[1]}, loc, logits, labels);
  return detail::reduce_losses(losses, reduction, loc);
}

}  // namespace xgrad
