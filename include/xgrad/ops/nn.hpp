// Neural-network ops: bias_add, conv2d, pooling, resize_bilinear, softmax, log_softmax,
// one_hot and softmax_cross_entropy. Conv, pooling and resize are primitives whose
// gradients are primitives too (each pair adjoint), so gradients of gradients work.
#pragma once

#include <algorithm>
#include <cstdint>

#include "xgrad/backend/cpu/conv.hpp"
#include "xgrad/backend/cpu/pool.hpp"
#include "xgrad/backend/cpu/resize.hpp"
#include "xgrad/backend/cpu/softmax_xent.hpp"
#include "xgrad/backend/kernels.hpp"
#include "xgrad/ops/elementwise.hpp"
#include "xgrad/ops/manipulation.hpp"
#include "xgrad/ops/reduce.hpp"

namespace xgrad {

/// How conv2d and pooling pad: `pad` uses explicit padding, `valid` none, `same` enough
/// that the output has ceil(input / stride) rows and columns (MindSpore's pad_mode).
enum class PadMode { pad, valid, same };

/// How a loss folds per-sample values.
enum class Reduction { none, mean, sum };

struct Conv2dOptions {
  std::int64_t stride = 1;
  std::int64_t padding = 0;
  std::int64_t dilation = 1;
  PadMode pad_mode = PadMode::pad;
};

/// The geometry of a bilinear resize: input [n, c, h, w] to [n, c, out_h, out_w].
struct ResizeGeometry {
  std::int64_t n, c, h, w, out_h, out_w;
  bool align_corners;
  bool operator==(const ResizeGeometry&) const = default;
};

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

template <const char* Name, class Geometry> struct Windowed {
  static constexpr std::string_view name = Name;
  Geometry geometry;
  std::vector<ir::Attr> attrs() const { return window_attrs(geometry); }
  bool operator==(const Windowed&) const = default;
};

namespace names {
inline constexpr char conv2d[] = "Conv2D", conv2d_input_grad[] = "Conv2DBackpropInput",
                      conv2d_weight_grad[] = "Conv2DBackpropFilter", max_pool[] = "MaxPool",
                      max_pool_grad[] = "MaxPoolGrad", max_pool_grad_grad[] = "MaxPoolGradGrad",
                      max_pool_argmax[] = "MaxPoolArgmax", max_pool_take[] = "MaxPoolTake",
                      max_pool_put[] = "MaxPoolPut", avg_pool[] = "AvgPool", avg_pool_grad[] = "AvgPoolGrad",
                      resize_bilinear[] = "ResizeBilinear", resize_bilinear_grad[] = "ResizeBilinearGrad";
}  // namespace names

using Conv2D = Windowed<names::conv2d, cpu::Conv2dGeometry>;
using Conv2DBackpropInput = Windowed<names::conv2d_input_grad, cpu::Conv2dGeometry>;
using Conv2DBackpropFilter = Windowed<names::conv2d_weight_grad, cpu::Conv2dGeometry>;
using MaxPool = Windowed<names::max_pool, cpu::Pool2dGeometry>;
using MaxPoolGrad = Windowed<names::max_pool_grad, cpu::Pool2dGeometry>;
using MaxPoolGradGrad = Windowed<names::max_pool_grad_grad, cpu::Pool2dGeometry>;
using MaxPoolArgmax = Windowed<names::max_pool_argmax, cpu::Pool2dGeometry>;
using MaxPoolTake = Windowed<names::max_pool_take, cpu::Pool2dGeometry>;
using MaxPoolPut = Windowed<names::max_pool_put, cpu::Pool2dGeometry>;
using AvgPool = Windowed<names::avg_pool, cpu::Pool2dGeometry>;
using AvgPoolGrad = Windowed<names::avg_pool_grad, cpu::Pool2dGeometry>;
using ResizeBilinear = Windowed<names::resize_bilinear, ResizeGeometry>;
using ResizeBilinearGrad = Windowed<names::resize_bilinear_grad, ResizeGeometry>;

struct OneHot {
  static constexpr std::string_view name = "OneHot";
  std::int64_t depth = 0;
  std::vector<ir::Attr> attrs() const { return {{"depth", std::to_string(depth)}}; }
  bool operator==(const OneHot&) const = default;
};
struct SoftmaxCrossEntropy {
  static constexpr std::string_view name = "SoftmaxCrossEntropy";
};
struct SoftmaxCrossEntropyGrad {
  static constexpr std::string_view name = "SoftmaxCrossEntropyGrad";
};

}  // namespace op

/// Adds a bias of shape [C] along axis 1 of x (MindSpore's BiasAdd).
template <FloatingPoint T>
Tensor<T> bias_add(const Tensor<T>& x, const Tensor<T>& b, SourceLoc loc = SourceLoc::current()) {
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

template <FloatingPoint T>
Tensor<T> conv2d_input_grad(const Tensor<T>& g, const Tensor<T>& w, const cpu::Conv2dGeometry& geo, SourceLoc loc);
template <FloatingPoint T>
Tensor<T> conv2d_weight_grad(const Tensor<T>& x, const Tensor<T>& g, const cpu::Conv2dGeometry& geo, SourceLoc loc);

/// conv2d on a worked-out geometry; its gradients are the two ops below.
template <FloatingPoint T>
Tensor<T> conv2d_apply(const Tensor<T>& x, const Tensor<T>& w, const cpu::Conv2dGeometry& geo, SourceLoc loc) {
  Tensor<T> y(primitive_with_epilogue(
      op::Conv2D{geo}, loc, {x, w}, dtype_of<T>(), Shape{geo.n, geo.c_out, geo.out_h, geo.out_w},
      [geo](std::span<const TensorBase> in, const TensorBase& dest, const ir::BlockDone* done) {
        const Device device = device_of(in);
        auto out = detail::output<T>(dest, Shape{geo.n, geo.c_out, geo.out_h, geo.out_w}, device);
        kernels::conv2d_forward(device, geo, Tensor<T>(in[0]).data(), Tensor<T>(in[1]).data(), out.data(), done);
        return TensorBase(out);
      }));
  if (should_record(x, w)) {
    // Each gradient costs a convolution: compute only those an input needs.
    const bool need_x = x.requires_grad(), need_w = w.requires_grad();
    record(y, op::Conv2D::name, loc, {x, w}, {x, w}, false,
           [x, w, geo, loc, need_x, need_w](const TensorBase&, const TensorBase& g) {
             Tensor<T> gy(g);
             return autograd::Grads{need_x ? conv2d_input_grad(gy, w, geo, loc) : Tensor<T>(),
                                    need_w ? conv2d_weight_grad(x, gy, geo, loc) : Tensor<T>()};
           });
  }
  return y;
}

template <FloatingPoint T>
Tensor<T> conv2d_input_grad(const Tensor<T>& g, const Tensor<T>& w, const cpu::Conv2dGeometry& geo, SourceLoc loc) {
  Tensor<T> gx(primitive(op::Conv2DBackpropInput{geo}, loc, {g, w}, dtype_of<T>(), Shape{geo.n, geo.c_in, geo.h, geo.w},
                         [geo](std::span<const TensorBase> in, const TensorBase& dest) {
                           const Device device = device_of(in);
                           auto out = detail::output<T>(dest, Shape{geo.n, geo.c_in, geo.h, geo.w}, device);
                           kernels::conv2d_backward_input(device, geo, Tensor<T>(in[0]).data(), Tensor<T>(in[1]).data(),
                                                          out.data());
                           return TensorBase(out);
                         }));
  if (should_record(g, w)) {
    const bool need_g = g.requires_grad(), need_w = w.requires_grad();
    record(gx, op::Conv2DBackpropInput::name, loc, {g, w}, {g, w}, false,
           [g, w, geo, loc, need_g, need_w](const TensorBase&, const TensorBase& u) {
             Tensor<T> up(u);
             return autograd::Grads{need_g ? conv2d_apply(up, w, geo, loc) : Tensor<T>(),
                                    need_w ? conv2d_weight_grad(up, g, geo, loc) : Tensor<T>()};
           });
  }
  return gx;
}

template <FloatingPoint T>
Tensor<T> conv2d_weight_grad(const Tensor<T>& x, const Tensor<T>& g, const cpu::Conv2dGeometry& geo, SourceLoc loc) {
  Tensor<T> gw(primitive(
      op::Conv2DBackpropFilter{geo}, loc, {x, g}, dtype_of<T>(), Shape{geo.c_out, geo.c_in, geo.kh, geo.kw},
      [geo](std::span<const TensorBase> in, const TensorBase& dest) {
        const Device device = device_of(in);
        auto out = detail::output<T>(dest, Shape{geo.c_out, geo.c_in, geo.kh, geo.kw}, device);
        kernels::conv2d_backward_weight(device, geo, Tensor<T>(in[0]).data(), Tensor<T>(in[1]).data(), out.data());
        return TensorBase(out);
      }));
  if (should_record(x, g)) {
    const bool need_x = x.requires_grad(), need_g = g.requires_grad();
    record(gw, op::Conv2DBackpropFilter::name, loc, {x, g}, {x, g}, false,
           [x, g, geo, loc, need_x, need_g](const TensorBase&, const TensorBase& v) {
             Tensor<T> up(v);
             return autograd::Grads{need_x ? conv2d_input_grad(g, up, geo, loc) : Tensor<T>(),
                                    need_g ? conv2d_apply(x, up, geo, loc) : Tensor<T>()};
           });
  }
  return gw;
}

}  // namespace detail

/// 2-D convolution of x [N, C_in, H, W] with w [C_out, C_in, KH, KW] (im2col + GEMM).
template <FloatingPoint T> Tensor<T> conv2d(const Tensor<T>& x, const Tensor<T>& w, Conv2dOptions options = {},
                                            SourceLoc loc = SourceLoc::current()) {
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
  return detail::conv2d_apply(x, w, geo, loc);
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

template <FloatingPoint T>
Tensor<T> max_pool_select(const Tensor<T>& x, const Tensor<T>& v, const cpu::Pool2dGeometry& geo, SourceLoc loc);

/// Routes gy to the argmax of each window of x: max_pool2d's gradient.
template <FloatingPoint T>
Tensor<T> max_pool_scatter(const Tensor<T>& x, const Tensor<T>& gy, const cpu::Pool2dGeometry& geo, SourceLoc loc) {
  Tensor<T> gx(primitive(op::MaxPoolGrad{geo}, loc, {x, gy}, dtype_of<T>(), Shape{geo.n, geo.c, geo.h, geo.w},
                         [geo](std::span<const TensorBase> in, const TensorBase& dest) {
                           const Device device = device_of(in);
                           auto out = detail::output<T>(dest, Shape{geo.n, geo.c, geo.h, geo.w}, device);
                           kernels::max_pool2d_scatter(device, geo, Tensor<T>(in[0]).data(), Tensor<T>(in[1]).data(),
                                                       out.data());
                           return TensorBase(out);
                         }));
  if (should_record(gy)) {
    record(gx, op::MaxPoolGrad::name, loc, {x, gy}, {x}, false, [x, geo, loc](const TensorBase&, const TensorBase& u) {
      return autograd::Grads{TensorBase(), max_pool_select(x, Tensor<T>(u), geo, loc)};
    });
  }
  return gx;
}

/// Reads v at the argmax of each window of x: the adjoint of max_pool_scatter.
template <FloatingPoint T>
Tensor<T> max_pool_select(const Tensor<T>& x, const Tensor<T>& v, const cpu::Pool2dGeometry& geo, SourceLoc loc) {
  Tensor<T> out(
      primitive(op::MaxPoolGradGrad{geo}, loc, {x, v}, dtype_of<T>(), Shape{geo.n, geo.c, geo.out_h, geo.out_w},
                [geo](std::span<const TensorBase> in, const TensorBase& dest) {
                  const Device device = device_of(in);
                  auto out = detail::output<T>(dest, Shape{geo.n, geo.c, geo.out_h, geo.out_w}, device);
                  kernels::max_pool2d_select(device, geo, Tensor<T>(in[0]).data(), Tensor<T>(in[1]).data(), out.data());
                  return TensorBase(out);
                }));
  if (should_record(v)) {
    record(out, op::MaxPoolGradGrad::name, loc, {x, v}, {x}, false,
           [x, geo, loc](const TensorBase&, const TensorBase& u) {
             return autograd::Grads{TensorBase(), max_pool_scatter(x, Tensor<T>(u), geo, loc)};
           });
  }
  return out;
}

/// The plane offset of each window's first maximum in x (int32, -1 for an empty window): the
/// argmax max pooling's forward and backward share in a compiled graph, where a pass rewrites
/// them to max_pool_take and max_pool_put (passes/simplify.hpp). An index: no gradient.
template <FloatingPoint T>
Tensor<std::int32_t> max_pool_argmax(const Tensor<T>& x, const cpu::Pool2dGeometry& geo, SourceLoc loc) {
  return Tensor<std::int32_t>(
      primitive(op::MaxPoolArgmax{geo}, loc, {x}, DType::int32, Shape{geo.n, geo.c, geo.out_h, geo.out_w},
                [geo](std::span<const TensorBase> in, const TensorBase& dest) {
                  const Device device = device_of(in);
                  auto out = detail::output<std::int32_t>(dest, Shape{geo.n, geo.c, geo.out_h, geo.out_w}, device);
                  kernels::max_pool2d_argmax(device, geo, Tensor<T>(in[0]).data(), out.data());
                  return TensorBase(out);
                }));
}

template <FloatingPoint T> Tensor<T> max_pool_put(const Tensor<std::int32_t>& idx, const Tensor<T>& gy,
                                                  const cpu::Pool2dGeometry& geo, SourceLoc loc);

/// out[o] = v at window o's argmax idx[o]: max pooling is max_pool_take(x, max_pool_argmax(x)).
template <FloatingPoint T> Tensor<T> max_pool_take(const Tensor<T>& v, const Tensor<std::int32_t>& idx,
                                                   const cpu::Pool2dGeometry& geo, SourceLoc loc) {
  Tensor<T> out(primitive(op::MaxPoolTake{geo}, loc, {v, idx}, dtype_of<T>(), Shape{geo.n, geo.c, geo.out_h, geo.out_w},
                          [geo](std::span<const TensorBase> in, const TensorBase& dest) {
                            const Device device = device_of(in);
                            auto out = detail::output<T>(dest, Shape{geo.n, geo.c, geo.out_h, geo.out_w}, device);
                            kernels::max_pool2d_take(device, geo, Tensor<std::int32_t>(in[1]).data(),
                                                     Tensor<T>(in[0]).data(), out.data());
                            return TensorBase(out);
                          }));
  if (should_record(v)) {
    record(out, op::MaxPoolTake::name, loc, {v, idx}, {idx}, false,
           [idx, geo, loc](const TensorBase&, const TensorBase& u) {
             return autograd::Grads{max_pool_put(idx, Tensor<T>(u), geo, loc), TensorBase()};
           });
  }
  return out;
}

/// gx = each gy[o] added at its window's argmax idx[o], zeros elsewhere: max pooling's gradient
/// with the argmax given, and the adjoint of max_pool_take.
template <FloatingPoint T> Tensor<T> max_pool_put(const Tensor<std::int32_t>& idx, const Tensor<T>& gy,
                                                  const cpu::Pool2dGeometry& geo, SourceLoc loc) {
  Tensor<T> gx(primitive(op::MaxPoolPut{geo}, loc, {idx, gy}, dtype_of<T>(), Shape{geo.n, geo.c, geo.h, geo.w},
                         [geo](std::span<const TensorBase> in, const TensorBase& dest) {
                           const Device device = device_of(in);
                           auto out = detail::output<T>(dest, Shape{geo.n, geo.c, geo.h, geo.w}, device);
                           kernels::max_pool2d_put(device, geo, Tensor<std::int32_t>(in[0]).data(),
                                                   Tensor<T>(in[1]).data(), out.data());
                           return TensorBase(out);
                         }));
  if (should_record(gy)) {
    record(gx, op::MaxPoolPut::name, loc, {idx, gy}, {idx}, false,
           [idx, geo, loc](const TensorBase&, const TensorBase& u) {
             return autograd::Grads{TensorBase(), max_pool_take(Tensor<T>(u), idx, geo, loc)};
           });
  }
  return gx;
}

template <FloatingPoint T> Tensor<T> avg_pool_apply(const Tensor<T>& x, const cpu::Pool2dGeometry& geo, SourceLoc loc);

/// Spreads gy evenly over each window: avg_pool2d's gradient (and adjoint).
template <FloatingPoint T>
Tensor<T> avg_pool_spread(const Tensor<T>& gy, const cpu::Pool2dGeometry& geo, SourceLoc loc) {
  Tensor<T> gx(primitive(op::AvgPoolGrad{geo}, loc, {gy}, dtype_of<T>(), Shape{geo.n, geo.c, geo.h, geo.w},
                         [geo](std::span<const TensorBase> in, const TensorBase& dest) {
                           const Device device = device_of(in);
                           auto out = detail::output<T>(dest, Shape{geo.n, geo.c, geo.h, geo.w}, device);
                           kernels::avg_pool2d_backward(device, geo, Tensor<T>(in[0]).data(), out.data());
                           return TensorBase(out);
                         }));
  if (should_record(gy)) {
    record(gx, op::AvgPoolGrad::name, loc, {gy}, {}, false, [geo, loc](const TensorBase&, const TensorBase& u) {
      return autograd::Grads{avg_pool_apply(Tensor<T>(u), geo, loc)};
    });
  }
  return gx;
}

template <FloatingPoint T> Tensor<T> avg_pool_apply(const Tensor<T>& x, const cpu::Pool2dGeometry& geo, SourceLoc loc) {
  Tensor<T> y(primitive(op::AvgPool{geo}, loc, {x}, dtype_of<T>(), Shape{geo.n, geo.c, geo.out_h, geo.out_w},
                        [geo](std::span<const TensorBase> in, const TensorBase& dest) {
                          const Device device = device_of(in);
                          auto out = detail::output<T>(dest, Shape{geo.n, geo.c, geo.out_h, geo.out_w}, device);
                          kernels::avg_pool2d_forward(device, geo, Tensor<T>(in[0]).data(), out.data());
                          return TensorBase(out);
                        }));
  if (should_record(x)) {
    record(y, op::AvgPool::name, loc, {x}, {}, false, [geo, loc](const TensorBase&, const TensorBase& g) {
      return autograd::Grads{avg_pool_spread(Tensor<T>(g), geo, loc)};
    });
  }
  return y;
}

}  // namespace detail

/// Max over kernel x kernel windows of x [N, C, H, W]; pad_mode valid (default) or same.
template <FloatingPoint T> Tensor<T> max_pool2d(const Tensor<T>& x, std::int64_t kernel, std::int64_t stride,
                                                PadMode pad_mode = PadMode::valid,
                                                SourceLoc loc = SourceLoc::current()) {
  detail::OpScope scope(op::MaxPool::name, loc, {x});
  auto geo = detail::pool_geometry(op::MaxPool::name, x, kernel, stride, pad_mode, loc);
  Tensor<T> y(detail::primitive(op::MaxPool{geo}, loc, {x}, dtype_of<T>(), Shape{geo.n, geo.c, geo.out_h, geo.out_w},
                                [geo](std::span<const TensorBase> in, const TensorBase& dest) {
                                  const Device device = detail::device_of(in);
                                  auto out = detail::output<T>(dest, Shape{geo.n, geo.c, geo.out_h, geo.out_w}, device);
                                  kernels::max_pool2d_forward(device, geo, Tensor<T>(in[0]).data(), out.data());
                                  return TensorBase(out);
                                }));
  if (detail::should_record(x)) {
    detail::record(y, op::MaxPool::name, loc, {x}, {x}, false, [x, geo, loc](const TensorBase&, const TensorBase& g) {
      return autograd::Grads{detail::max_pool_scatter(x, Tensor<T>(g), geo, loc)};
    });
  }
  return y;
}
template <FloatingPoint T>
Tensor<T> max_pool2d(const Tensor<T>& x, std::int64_t kernel, SourceLoc loc = SourceLoc::current()) {
  return max_pool2d(x, kernel, kernel, PadMode::valid, loc);
}

/// Mean over kernel x kernel windows of x [N, C, H, W] (padding excluded from the count).
template <FloatingPoint T> Tensor<T> avg_pool2d(const Tensor<T>& x, std::int64_t kernel, std::int64_t stride,
                                                PadMode pad_mode = PadMode::valid,
                                                SourceLoc loc = SourceLoc::current()) {
  detail::OpScope scope(op::AvgPool::name, loc, {x});
  return detail::avg_pool_apply(x, detail::pool_geometry(op::AvgPool::name, x, kernel, stride, pad_mode, loc), loc);
}
template <FloatingPoint T>
Tensor<T> avg_pool2d(const Tensor<T>& x, std::int64_t kernel, SourceLoc loc = SourceLoc::current()) {
  return avg_pool2d(x, kernel, kernel, PadMode::valid, loc);
}

namespace detail {

template <FloatingPoint T> Tensor<T> resize_apply(const Tensor<T>& x, const ResizeGeometry& r, SourceLoc loc);

template <FloatingPoint T> Tensor<T> resize_adjoint(const Tensor<T>& gy, const ResizeGeometry& r, SourceLoc loc) {
  Tensor<T> gx(primitive(op::ResizeBilinearGrad{r}, loc, {gy}, dtype_of<T>(), Shape{r.n, r.c, r.h, r.w},
                         [r](std::span<const TensorBase> in, const TensorBase& dest) {
                           auto out = detail::output<T>(dest, Shape{r.n, r.c, r.h, r.w}, in[0].device());
                           kernels::resize_bilinear_backward(out.device(), r.n, r.c, r.h, r.w, r.out_h, r.out_w,
                                                             r.align_corners, Tensor<T>(in[0]).data(), out.data());
                           return TensorBase(out);
                         }));
  if (should_record(gy)) {
    record(gx, op::ResizeBilinearGrad::name, loc, {gy}, {}, false, [r, loc](const TensorBase&, const TensorBase& u) {
      return autograd::Grads{resize_apply(Tensor<T>(u), r, loc)};
    });
  }
  return gx;
}

template <FloatingPoint T> Tensor<T> resize_apply(const Tensor<T>& x, const ResizeGeometry& r, SourceLoc loc) {
  Tensor<T> y(primitive(op::ResizeBilinear{r}, loc, {x}, dtype_of<T>(), Shape{r.n, r.c, r.out_h, r.out_w},
                        [r](std::span<const TensorBase> in, const TensorBase& dest) {
                          auto out = detail::output<T>(dest, Shape{r.n, r.c, r.out_h, r.out_w}, in[0].device());
                          kernels::resize_bilinear_forward(out.device(), r.n, r.c, r.h, r.w, r.out_h, r.out_w,
                                                           r.align_corners, Tensor<T>(in[0]).data(), out.data());
                          return TensorBase(out);
                        }));
  if (should_record(x)) {
    record(y, op::ResizeBilinear::name, loc, {x}, {}, false, [r, loc](const TensorBase&, const TensorBase& g) {
      return autograd::Grads{resize_adjoint(Tensor<T>(g), r, loc)};
    });
  }
  return y;
}

}  // namespace detail

/// Bilinear resize of x [N, C, H, W] to [N, C, out_h, out_w].
template <FloatingPoint T> Tensor<T> resize_bilinear(const Tensor<T>& x, std::int64_t out_h, std::int64_t out_w,
                                                     bool align_corners = false, SourceLoc loc = SourceLoc::current()) {
  detail::OpScope scope(op::ResizeBilinear::name, loc, {x});
  if (x.ndim() != 4)
    throw_shape_error(op::ResizeBilinear::name, loc, "x must be [N, C, H, W] (input ",
                      detail::describe_inputs({{"x", &x}}), ")");
  if (out_h < 1 || out_w < 1)
    throw_value_error(op::ResizeBilinear::name, loc, "output size ", out_h, "x", out_w, " must be positive");
  const Shape& s = x.shape();
  if (s[2] < 1 || s[3] < 1) throw_shape_error(op::ResizeBilinear::name, loc, "input ", s, " has an empty spatial axis");
  return detail::resize_apply(x, ResizeGeometry{s[0], s[1], s[2], s[3], out_h, out_w, align_corners}, loc);
}

/// log(softmax(x)) along `axis`, computed as x - max - log(sum(exp(x - max))) so that it
/// neither overflows nor underflows.
template <FloatingPoint T>
Tensor<T> log_softmax(const Tensor<T>& x, std::int64_t axis = -1, SourceLoc loc = SourceLoc::current()) {
  detail::OpScope scope("LogSoftmax", loc, {x});
  int a = normalize_axis(axis, x.ndim(), "LogSoftmax", loc);
  // The shift is a constant for autodiff: the result does not depend on it.
  auto shift = max(x.detach(), {a}, true, loc);
  auto shifted = sub(x, shift, loc);
  return sub(shifted, log(sum(exp(shifted, loc), {a}, true, loc), loc), loc);
}

/// Softmax along `axis` (exp of log_softmax, so large inputs stay finite).
template <FloatingPoint T>
Tensor<T> softmax(const Tensor<T>& x, std::int64_t axis = -1, SourceLoc loc = SourceLoc::current()) {
  detail::OpScope scope("Softmax", loc, {x});
  normalize_axis(axis, x.ndim(), "Softmax", loc);  // its errors name softmax, not the LogSoftmax inside
  return exp(log_softmax(x, axis, loc), loc);
}

namespace detail {

inline void check_labels(std::string_view op, const TensorBase& labels, std::int64_t classes, SourceLoc loc) {
  std::vector<std::int32_t> host;  // device labels are read through a copy
  if (labels.device() != Device::cpu) host = Tensor<std::int32_t>(labels).to_vector();
  const std::int32_t* l = host.empty() ? Tensor<std::int32_t>(labels).data() : host.data();
  if (std::int64_t i = cpu::first_bad_label(l, labels.numel(), classes); i >= 0)
    throw_value_error(op, loc, "label ", l[i], " at index ", i, " is outside [0, ", classes, ")");
}

/// Element k of a one-hot tensor: 1 where its class is its row's label.
template <class T> struct OneHotElement {
  const std::int32_t* labels;
  std::int64_t classes;
  XGRAD_HD T operator()(std::int64_t k) const { return labels[k / classes] == k % classes ? T(1) : T(0); }
};

}  // namespace detail

/// [labels..., num_classes] with 1 at each label; labels outside [0, num_classes) throw.
template <FloatingPoint T>
Tensor<T> one_hot(const Tensor<std::int32_t>& labels, std::int64_t num_classes, SourceLoc loc = SourceLoc::current()) {
  if (num_classes < 1) throw_value_error(op::OneHot::name, loc, "num_classes (", num_classes, ") must be positive");
  Shape shape = labels.shape();
  shape.push_back(num_classes);
  // Labels are checked when the op runs: under jit their values are known only then.
  return Tensor<T>(detail::primitive(op::OneHot{num_classes}, loc, {labels}, dtype_of<T>(), shape,
                                     [shape, num_classes, loc](std::span<const TensorBase> in, const TensorBase& dest) {
                                       detail::check_labels(op::OneHot::name, in[0], num_classes, loc);
                                       auto out = detail::output<T>(dest, shape, in[0].device());
                                       kernels::tabulate(
                                           out.device(), out.data(), out.numel(),
                                           detail::OneHotElement<T>{Tensor<std::int32_t>(in[0]).data(), num_classes});
                                       return TensorBase(out);
                                     }));
}

namespace detail {

template <FloatingPoint T> Tensor<T> softmax_xent_grad(const Tensor<T>& logits, const Tensor<std::int32_t>& labels,
                                                       const Tensor<T>& g, SourceLoc loc);

/// Per-sample losses [N] of logits [N, C] against labels [N]: one op, whose gradient is one op.
template <FloatingPoint T>
Tensor<T> softmax_xent_losses(const Tensor<T>& logits, const Tensor<std::int32_t>& labels, SourceLoc loc) {
  const std::int64_t rows = logits.shape()[0], classes = logits.shape()[1];
  Tensor<T> losses(primitive(op::SoftmaxCrossEntropy{}, loc, {logits, labels}, dtype_of<T>(), Shape{rows},
                             [rows, classes, loc](std::span<const TensorBase> in, const TensorBase& dest) {
                               // Checked when the op runs: under jit the labels are known only then.
                               check_labels("SoftmaxCrossEntropyWithLogits", in[1], classes, loc);
                               const Device device = device_of(in);
                               auto out = detail::output<T>(dest, Shape{rows}, device);
                               const T* x = Tensor<T>(in[0]).data();
                               const std::int32_t* l = Tensor<std::int32_t>(in[1]).data();
                               kernels::softmax_xent_forward(device, x, l, rows, classes, out.data());
                               return TensorBase(out);
                             }));
  if (should_record(logits)) {
    record(losses, op::SoftmaxCrossEntropy::name, loc, {logits, labels}, {logits, labels}, false,
           [logits, labels, loc](const TensorBase&, const TensorBase& g) {
             return autograd::Grads{softmax_xent_grad(logits, labels, Tensor<T>(g), loc), TensorBase()};
           });
  }
  return losses;
}

/// g[:, None] * (softmax(logits) - one_hot(labels)): the losses' gradient w.r.t. the logits.
template <FloatingPoint T> Tensor<T> softmax_xent_grad(const Tensor<T>& logits, const Tensor<std::int32_t>& labels,
                                                       const Tensor<T>& g, SourceLoc loc) {
  const Shape shape = logits.shape();
  Tensor<T> gx(primitive(op::SoftmaxCrossEntropyGrad{}, loc, {logits, labels, g}, dtype_of<T>(), shape,
                         [shape, loc](std::span<const TensorBase> in, const TensorBase& dest) {
                           check_labels(op::SoftmaxCrossEntropyGrad::name, in[1], shape[1], loc);
                           const Device device = device_of(in);
                           auto out = detail::output<T>(dest, shape, device);
                           const T* x = Tensor<T>(in[0]).data();
                           const std::int32_t* l = Tensor<std::int32_t>(in[1]).data();
                           const T* g = Tensor<T>(in[2]).data();
                           kernels::softmax_xent_backward(device, x, l, g, shape[0], shape[1], out.data());
                           return TensorBase(out);
                         }));
  if (should_record(logits, g)) {
    // Second derivatives, from composite ops: with p = softmax(logits) and u the incoming
    // gradient, d/dg = sum(u * (p - onehot)) and d/dlogits = g * (p u - p sum(p u)).
    record(
        gx, op::SoftmaxCrossEntropyGrad::name, loc, {logits, labels, g}, {logits, labels, g}, false,
        [logits, labels, g, loc](const TensorBase&, const TensorBase& upstream) {
          Tensor<T> u(upstream);
          auto dg = sum(mul(u, softmax_xent_grad(logits, labels, ones_like(g), loc), loc), {1}, false, loc);
          auto p = softmax(logits, -1, loc);
          auto pu = mul(p, u, loc);
          auto dlogits = mul(reshape(g, {g.numel(), 1}, loc), sub(pu, mul(p, sum(pu, {1}, true, loc), loc), loc), loc);
          return autograd::Grads{dlogits, TensorBase(), dg};
        });
  }
  return gx;
}

}  // namespace detail

/// Cross-entropy of logits [N, C] against int32 class labels [N] (sparse, as MindSpore's
/// SoftmaxCrossEntropyWithLogits(sparse=True)); per-sample losses folded by `reduction`. One
/// op, and its gradient one op: no softmax or one-hot tensor is made.
template <FloatingPoint T> Tensor<T> softmax_cross_entropy(const Tensor<T>& logits, const Tensor<std::int32_t>& labels,
                                                           Reduction reduction = Reduction::mean,
                                                           SourceLoc loc = SourceLoc::current()) {
  detail::OpScope scope("SoftmaxCrossEntropyWithLogits", loc, {logits, labels});
  if (logits.ndim() != 2 || labels.ndim() != 1 || labels.shape()[0] != logits.shape()[0])
    throw_shape_error("SoftmaxCrossEntropyWithLogits", loc, "logits must be [N, C] and labels [N] (inputs ",
                      detail::describe_inputs({{"logits", &logits}, {"labels", &labels}}), ")");
  auto losses = detail::softmax_xent_losses(logits, labels, loc);
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

}  // namespace xgrad
