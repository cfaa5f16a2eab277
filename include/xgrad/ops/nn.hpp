// Neural-network ops: bias_add, conv2d, pooling, resize_bilinear, softmax, log_softmax, gelu,
// layer_norm, scaled_dot_product_attention, one_hot and softmax_cross_entropy. Declarations
// only, with the options their signatures take: the ops' structs and the functions' definitions
// are in ops/nn-inl.hpp.
#pragma once

#include <cstdint>
#include <optional>

#include "xgrad/backend/pool_geometry.hpp"
#include "xgrad/core/dtype.hpp"
#include "xgrad/core/source_loc.hpp"
#include "xgrad/core/tensor.hpp"

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

/// Adds a bias of shape [C] along axis 1 of x (MindSpore's BiasAdd).
template <FloatingPoint T>
Tensor<T> bias_add(const Tensor<T>& x, const Tensor<T>& b, SourceLoc loc = SourceLoc::current());

/// 2-D convolution of x [N, C_in, H, W] with w [C_out, C_in, KH, KW] (im2col + GEMM).
template <FloatingPoint T> Tensor<T> conv2d(const Tensor<T>& x, const Tensor<T>& w, Conv2dOptions options = {},
                                            SourceLoc loc = SourceLoc::current());

/// Max over kernel x kernel windows of x [N, C, H, W]; pad_mode valid (default) or same. A NaN
/// in a window propagates; on ties the first maximum in row-major order is the one gradients
/// reach. Runs as MaxPoolTake(x, MaxPoolArgmax(x)): the backward reuses the argmax.
template <FloatingPoint T> Tensor<T> max_pool2d(const Tensor<T>& x, std::int64_t kernel, std::int64_t stride,
                                                PadMode pad_mode = PadMode::valid,
                                                SourceLoc loc = SourceLoc::current());
template <FloatingPoint T>
Tensor<T> max_pool2d(const Tensor<T>& x, std::int64_t kernel, SourceLoc loc = SourceLoc::current());

/// Mean over kernel x kernel windows of x [N, C, H, W] (padding excluded from the count).
template <FloatingPoint T> Tensor<T> avg_pool2d(const Tensor<T>& x, std::int64_t kernel, std::int64_t stride,
                                                PadMode pad_mode = PadMode::valid,
                                                SourceLoc loc = SourceLoc::current());
template <FloatingPoint T>
Tensor<T> avg_pool2d(const Tensor<T>& x, std::int64_t kernel, SourceLoc loc = SourceLoc::current());

/// Bilinear resize of x [N, C, H, W] to [N, C, out_h, out_w].
template <FloatingPoint T> Tensor<T> resize_bilinear(const Tensor<T>& x, std::int64_t out_h, std::int64_t out_w,
                                                     bool align_corners = false, SourceLoc loc = SourceLoc::current());

/// log(softmax(x)) along `axis`, computed as x - max - log(sum(exp(x - max))) so that it
/// neither overflows nor underflows.
template <FloatingPoint T>
Tensor<T> log_softmax(const Tensor<T>& x, std::int64_t axis = -1, SourceLoc loc = SourceLoc::current());

/// Softmax along `axis`: exp(x - max) over its sum, so large inputs stay finite.
template <FloatingPoint T>
Tensor<T> softmax(const Tensor<T>& x, std::int64_t axis = -1, SourceLoc loc = SourceLoc::current());

/// Which form gelu computes: the exact x * Phi(x) with Phi from erf, or the tanh approximation
/// (PyTorch's approximate="tanh", the original GPT-2's).
enum class GeluApproximation { none, tanh };

/// GELU, x * Phi(x) with Phi the standard normal CDF: 0.5 x (1 + erf(x / sqrt(2))), or with
/// `tanh`, 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))). A composite of elementwise ops, so
/// a compiled graph fuses it whole into its neighbours.
template <FloatingPoint T> Tensor<T> gelu(const Tensor<T>& x, GeluApproximation approximate = GeluApproximation::none,
                                          SourceLoc loc = SourceLoc::current());

/// Layer normalization over the last axis: (x - mean) / sqrt(var + eps) with the biased variance,
/// then gamma * that + beta, gamma and beta of shape [x.shape[-1]] (PyTorch's layer_norm with
/// normalized_shape the last axis). A composite of reductions and elementwise ops: a compiled
/// graph fuses it, and its gradient is autodiff's.
template <FloatingPoint T> Tensor<T> layer_norm(const Tensor<T>& x, const Tensor<T>& gamma, const Tensor<T>& beta,
                                                double eps = 1e-5, SourceLoc loc = SourceLoc::current());
/// The same without the affine part.
template <FloatingPoint T>
Tensor<T> layer_norm(const Tensor<T>& x, double eps = 1e-5, SourceLoc loc = SourceLoc::current());

/// scaled_dot_product_attention's options. `causal`: query i sees key j only when j <= i +
/// Tk - Tq, the queries being the newest Tq positions of the keys' sequence (for Tq = Tk the
/// lower triangle; with a cache of past keys the newest query sees them all); a query that sees
/// no key gets zeros. `scale` multiplies q k^T (default 1 / sqrt(D)).
struct AttentionOptions {
  bool causal = false;
  std::optional<double> scale;
};

/// softmax(q k^T * scale) v for q [..., Tq, D], k [..., Tk, D] and v [..., Tk, Dv] with the same
/// leading axes: [..., Tq, Dv]. One op: on the CPU a blocked kernel with an online softmax
/// (FlashAttention's) that never makes the [Tq, Tk] score matrix, and its gradient one op too.
template <FloatingPoint T> Tensor<T> scaled_dot_product_attention(const Tensor<T>& q, const Tensor<T>& k,
                                                                  const Tensor<T>& v, AttentionOptions options = {},
                                                                  SourceLoc loc = SourceLoc::current());

/// [labels..., num_classes] with 1 at each label; labels outside [0, num_classes) throw.
template <FloatingPoint T>
Tensor<T> one_hot(const Tensor<std::int32_t>& labels, std::int64_t num_classes, SourceLoc loc = SourceLoc::current());

/// Cross-entropy of logits [N, C] against int32 class labels [N] (sparse, as MindSpore's
/// SoftmaxCrossEntropyWithLogits(sparse=True)); per-sample losses folded by `reduction`. One
/// op, and its gradient one op: no softmax or one-hot tensor is made.
template <FloatingPoint T> Tensor<T> softmax_cross_entropy(const Tensor<T>& logits, const Tensor<std::int32_t>& labels,
                                                           Reduction reduction = Reduction::mean,
                                                           SourceLoc loc = SourceLoc::current());

namespace detail {
// Max pooling's primitives, for passes, tests and benchmarks that build them directly:
// max_pool2d is max_pool_take(x, max_pool_argmax(x)), and max_pool_put its gradient.
template <FloatingPoint T>
Tensor<std::int32_t> max_pool_argmax(const Tensor<T>& x, const cpu::Pool2dGeometry& geo, SourceLoc loc);
template <FloatingPoint T> Tensor<T> max_pool_take(const Tensor<T>& v, const Tensor<std::int32_t>& idx,
                                                   const cpu::Pool2dGeometry& geo, SourceLoc loc);
template <FloatingPoint T> Tensor<T> max_pool_put(const Tensor<std::int32_t>& idx, const Tensor<T>& gy,
                                                  const cpu::Pool2dGeometry& geo, SourceLoc loc);
/// Per-sample losses folded as `reduction` says: softmax_cross_entropy's, and nn's losses'.
template <FloatingPoint T> Tensor<T> reduce_losses(const Tensor<T>& losses, Reduction reduction, SourceLoc loc);
}  // namespace detail

// The instances xgrad::compiled holds (core/config.hpp).
#define XGRAD_NN_INSTANCE(T, X)                                                                                       \
  X Tensor<T> bias_add<T>(const Tensor<T>&, const Tensor<T>&, SourceLoc);                                             \
  X Tensor<T> conv2d<T>(const Tensor<T>&, const Tensor<T>&, Conv2dOptions, SourceLoc);                                \
  X Tensor<T> max_pool2d<T>(const Tensor<T>&, std::int64_t, std::int64_t, PadMode, SourceLoc);                        \
  X Tensor<T> max_pool2d<T>(const Tensor<T>&, std::int64_t, SourceLoc);                                               \
  X Tensor<T> avg_pool2d<T>(const Tensor<T>&, std::int64_t, std::int64_t, PadMode, SourceLoc);                        \
  X Tensor<T> avg_pool2d<T>(const Tensor<T>&, std::int64_t, SourceLoc);                                               \
  X Tensor<T> resize_bilinear<T>(const Tensor<T>&, std::int64_t, std::int64_t, bool, SourceLoc);                      \
  X Tensor<T> log_softmax<T>(const Tensor<T>&, std::int64_t, SourceLoc);                                              \
  X Tensor<T> softmax<T>(const Tensor<T>&, std::int64_t, SourceLoc);                                                  \
  X Tensor<T> gelu<T>(const Tensor<T>&, GeluApproximation, SourceLoc);                                                \
  X Tensor<T> layer_norm<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, double, SourceLoc);                 \
  X Tensor<T> layer_norm<T>(const Tensor<T>&, double, SourceLoc);                                                     \
  X Tensor<T> scaled_dot_product_attention<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, AttentionOptions, \
                                              SourceLoc);                                                             \
  X Tensor<T> one_hot<T>(const Tensor<std::int32_t>&, std::int64_t, SourceLoc);                                       \
  X Tensor<T> softmax_cross_entropy<T>(const Tensor<T>&, const Tensor<std::int32_t>&, Reduction, SourceLoc);          \
  X Tensor<std::int32_t> detail::max_pool_argmax<T>(const Tensor<T>&, const cpu::Pool2dGeometry&, SourceLoc);         \
  X Tensor<T> detail::max_pool_take<T>(const Tensor<T>&, const Tensor<std::int32_t>&, const cpu::Pool2dGeometry&,     \
                                       SourceLoc);                                                                    \
  X Tensor<T> detail::max_pool_put<T>(const Tensor<std::int32_t>&, const Tensor<T>&, const cpu::Pool2dGeometry&,      \
                                      SourceLoc);                                                                     \
  X Tensor<T> detail::reduce_losses<T>(const Tensor<T>&, Reduction, SourceLoc);
#define XGRAD_NN_INSTANCES(X) XGRAD_FOR_EACH_FloatingPoint(XGRAD_NN_INSTANCE, X)
#if defined(XGRAD_COMPILED) && !defined(XGRAD_INSTANTIATE_NN)
XGRAD_NN_INSTANCES(extern template)
#endif

}  // namespace xgrad

#if !defined(XGRAD_COMPILED)
#include "xgrad/ops/nn-inl.hpp"
#endif
