// Matrix multiplication: 2-D and batched with broadcast batch axes, on the packed GEMM.
#pragma once

#include <algorithm>

#include "xgrad/backend/kernels.hpp"
#include "xgrad/ops/dispatch.hpp"

namespace xgrad {

namespace op {
struct MatMul {
  static constexpr std::string_view name = "MatMul";
  bool transpose_a = false, transpose_b = false;
  std::vector<ir::Attr> attrs() const {
    return {{"transpose_a", transpose_a ? "true" : "false"}, {"transpose_b", transpose_b ? "true" : "false"}};
  }
  bool operator==(const MatMul&) const = default;
};
}  // namespace op

/// op(a) @ op(b) over the last two axes, where op transposes when asked (MindSpore's
/// MatMul(transpose_a, transpose_b)); leading axes broadcast like NumPy's.
template <FloatingPoint T> Tensor<T> matmul(const Tensor<T>& a, const Tensor<T>& b, bool transpose_a, bool transpose_b,
                                            SourceLoc loc = SourceLoc::current()) {
  detail::OpScope scope(op::MatMul::name, loc, {a, b});
  auto fail = [&](const char* why) {
    throw_shape_error(
        op::MatMul::name, loc, why, " (inputs ", detail::describe_inputs({{"x", &a}, {"y", &b}}),
        transpose_a || transpose_b ? detail::concat(", transpose_a=", transpose_a, ", transpose_b=", transpose_b) : "",
        ")");
  };
  if (a.ndim() < 2 || b.ndim() < 2) fail("both inputs need at least 2 axes");
  const Shape sa = a.shape(), sb = b.shape();
  const std::int64_t m = transpose_a ? sa[sa.ndim() - 1] : sa[sa.ndim() - 2];
  const std::int64_t k = transpose_a ? sa[sa.ndim() - 2] : sa[sa.ndim() - 1];
  const std::int64_t kb = transpose_b ? sb[sb.ndim() - 1] : sb[sb.ndim() - 2];
  const std::int64_t n = transpose_b ? sb[sb.ndim() - 2] : sb[sb.ndim() - 1];
  if (k != kb) fail(detail::concat("the contracted axes differ: ", k, " vs ", kb).c_str());
  Shape batch_a(sa.begin(), sa.end() - 2), batch_b(sb.begin(), sb.end() - 2), batch;
  if (!try_broadcast(batch_a, batch_b, batch)) fail("the batch axes cannot be broadcast together");

  Shape shape = batch;
  shape.push_back(m);
  shape.push_back(n);
  Tensor<T> out(detail::primitive_with_epilogue(
      op::MatMul{transpose_a, transpose_b}, loc, {a, b}, dtype_of<T>(), shape,
      [=](std::span<const TensorBase> in, const TensorBase& dest, const ir::BlockDone* done) {
        Tensor<T> x(in[0]), y(in[1]);
        const Device device = detail::device_of(in);
        auto out = detail::output<T>(dest, shape, device);
        const std::int64_t count = batch.numel();
        cpu::BroadcastPlan<2> plan(batch, {&batch_a, &batch_b});
        // Element strides of one matrix of each operand, as stored and as op() reads it.
        const std::int64_t lda = sa.back(), ldb = sb.back();
        const std::int64_t a_rs = transpose_a ? 1 : lda, a_cs = transpose_a ? lda : 1;
        const std::int64_t b_rs = transpose_b ? 1 : ldb, b_cs = transpose_b ? ldb : 1;
        kernels::batched_gemm(device, plan, count, m, n, k, x.data(), a_rs, a_cs, y.data(), b_rs, b_cs, out.data(),
                              done);
        return TensorBase(out);
      }));

  if constexpr (FloatingPoint<T>) {
    if (detail::should_record(a, b)) {
      // Each gradient costs a matmul: compute only those an input needs.
      const bool need_a = a.requires_grad(), need_b = b.requires_grad();
      detail::record(out, op::MatMul::name, loc, {a, b}, {a, b}, false,
                     [a, b, transpose_a, transpose_b, need_a, need_b](const TensorBase&, const TensorBase& grad) {
                       Tensor<T> g(grad), ga, gb;
                       if (need_a) {
                         ga = !transpose_a ? matmul(g, b, false, !transpose_b)
                                           : (transpose_b ? matmul(b, g, true, true) : matmul(b, g, false, true));
                       }
                       if (need_b) {
                         gb = !transpose_b ? matmul(a, g, !transpose_a, false)
                                           : (transpose_a ? matmul(g, a, true, true) : matmul(g, a, true, false));
                       }
                       return autograd::Grads{ga, gb};
                     });
    }
  }
  return out;
}

/// a @ b over the last two axes; leading axes broadcast like NumPy's.
template <FloatingPoint T>
Tensor<T> matmul(const Tensor<T>& a, const Tensor<T>& b, SourceLoc loc = SourceLoc::current()) {
  return matmul(a, b, false, false, loc);
}

}  // namespace xgrad
