// Definitions of ops/linalg.hpp: included by it when header-only, compiled once into the
// library (src/ops_nn.cpp) otherwise.
#pragma once

#include <algorithm>
#include <vector>

#include "xgrad/backend/kernels.hpp"
#include "xgrad/ops/dispatch.hpp"
#include "xgrad/ops/linalg.hpp"

namespace xgrad {

namespace op {
/// op(a) @ op(b) over the last two axes, op transposing when asked; leading (batch) axes
/// broadcast.
struct MatMul {
  static constexpr std::string_view name = "MatMul";
  static constexpr bool epilogue = true;
  template <class R> static OpTraits traits() { return {.contraction = true}; }
  bool transpose_a = false, transpose_b = false;
  std::vector<ir::Attr> attrs() const {
    return {{"transpose_a", transpose_a ? "true" : "false"}, {"transpose_b", transpose_b ? "true" : "false"}};
  }
  bool operator==(const MatMul&) const = default;
  /// The batch axis leads, with axes of 1 after it where the other operand has more batch axes.
  /// A batch of matrices times one matrix is one larger product: the batch folds into the rows
  /// of the left operand, or the columns of the right (jacfwd's tangents, a Hessian's columns).
  template <class R, class T>
  Tensor<R> batch(std::span<const bool> batched, SourceLoc loc, const Tensor<T>& a, const Tensor<T>& b) const {
    if (batched[0] != batched[1] && a.ndim() + b.ndim() == 5) {
      const Tensor<T>& x = batched[0] ? a : b;  // [size, r, c]
      const std::int64_t size = x.shape()[0], rows = x.shape()[1], cols = x.shape()[2];
      if (batched[0]) {  // [size * m, k] @ b
        const Tensor<T> folded = transpose_a ? reshape(transpose(x, {0, 2, 1}, loc), {size * cols, rows}, loc)
                                             : reshape(x, {size * rows, cols}, loc);
        const Tensor<R> out = detail::apply<R>(MatMul{false, transpose_b}, loc, folded, b);
        return reshape(out, {size, out.shape()[0] / size, out.shape()[1]}, loc);
      }
      // Each value's product transposed, op(b_i)^T op(a)^T, stacked: [size * n, k] @ op(a)^T. For
      // a batch of vectors (n = 1) no transpose here copies anything.
      const std::int64_t n = transpose_b ? rows : cols;
      const Tensor<T> folded = transpose_b ? reshape(x, {size * rows, cols}, loc)
                                           : reshape(transpose(x, {0, 2, 1}, loc), {size * cols, rows}, loc);
      const Tensor<R> out = detail::apply<R>(MatMul{false, !transpose_a}, loc, folded, a);
      return transpose(reshape(out, {size, n, out.shape()[1]}, loc), {0, 2, 1}, loc);
    }
    const int rank = std::max(a.ndim() - batched[0], b.ndim() - batched[1]);
    return detail::apply<R>(*this, loc, batched[0] ? detail::align_batch(a, rank) : a,
                            batched[1] ? detail::align_batch(b, rank) : b);
  }
  static Shape batch_of(const Shape& s) { return Shape(s.begin(), s.end() - 2); }
  Shape output_shape(const Shape& sa, const Shape& sb) const {
    Shape out;
    try_broadcast(batch_of(sa), batch_of(sb), out);  // matmul() has checked that they broadcast
    out.push_back(transpose_a ? sa.back() : sa[sa.ndim() - 2]);
    out.push_back(transpose_b ? sb[sb.ndim() - 2] : sb.back());
    return out;
  }
  template <class T>
  void run(Device d, const Tensor<T>& a, const Tensor<T>& b, Tensor<T>& out, const ir::BlockDone* done) const {
    // An empty product writes nothing; its batch may still count 2^40 matrices without rows.
    if (out.numel() == 0) return;
    const Shape &sa = a.shape(), &sb = b.shape();
    const Shape batch_a = batch_of(sa), batch_b = batch_of(sb), batch = batch_of(out.shape());
    const std::int64_t m = out.shape()[out.ndim() - 2], n = out.shape().back();
    const std::int64_t k = transpose_a ? sa[sa.ndim() - 2] : sa.back();
    cpu::BroadcastPlan<2> plan(batch, {&batch_a, &batch_b});
    // Element strides of one matrix of each operand, as stored and as op() reads it.
    const std::int64_t lda = sa.back(), ldb = sb.back();
    const std::int64_t a_rs = transpose_a ? 1 : lda, a_cs = transpose_a ? lda : 1;
    const std::int64_t b_rs = transpose_b ? 1 : ldb, b_cs = transpose_b ? ldb : 1;
    kernels::batched_gemm(d, plan, batch.numel(), m, n, k, a.data(), a_rs, a_cs, b.data(), b_rs, b_cs, out.data(),
                          done);
  }
  static constexpr Needs<2> differentiable{true, true}, saved{true, true};
  static constexpr bool multilinear = true;
  // Each gradient costs a matmul: only those an input needs are computed.
  template <class T> autograd::Grads grad(const Tensor<T>& g, Needs<2> needs, SourceLoc loc, const Tensor<T>& a,
                                          const Tensor<T>& b) const {
    Tensor<T> ga, gb;
    if (needs[0])
      ga = !transpose_a ? matmul(g, b, false, !transpose_b, loc)
                        : (transpose_b ? matmul(b, g, true, true, loc) : matmul(b, g, false, true, loc));
    if (needs[1])
      gb = !transpose_b ? matmul(a, g, !transpose_a, false, loc)
                        : (transpose_a ? matmul(g, a, true, true, loc) : matmul(g, a, true, false, loc));
    return {ga, gb};
  }
};
}  // namespace op

template <FloatingPoint T>
Tensor<T> matmul(const Tensor<T>& a, const Tensor<T>& b, bool transpose_a, bool transpose_b, SourceLoc loc) {
  detail::OpScope scope(op::MatMul::name, loc, {a, b});
  auto fail = [&](const char* why) {
    throw_shape_error(
        op::MatMul::name, loc, why, " (inputs ", detail::describe_inputs({{"x", &a}, {"y", &b}}),
        transpose_a || transpose_b ? detail::concat(", transpose_a=", transpose_a, ", transpose_b=", transpose_b) : "",
        ")");
  };
  if (a.ndim() < 2 || b.ndim() < 2) fail("both inputs need at least 2 axes");
  const Shape sa = a.shape(), sb = b.shape();
  const std::int64_t k = transpose_a ? sa[sa.ndim() - 2] : sa[sa.ndim() - 1];
  const std::int64_t kb = transpose_b ? sb[sb.ndim() - 1] : sb[sb.ndim() - 2];
  if (k != kb) fail(detail::concat("the contracted axes differ: ", k, " vs ", kb).c_str());
  Shape batch;
  if (!try_broadcast(op::MatMul::batch_of(sa), op::MatMul::batch_of(sb), batch))
    fail("the batch axes cannot be broadcast together");
  if (sa.ndim() > 2 && sb.ndim() == 2 && !transpose_a && k > 0) {
    // A batch of matrices times one matrix is one taller product (a dense layer over a
    // sequence): one GEMM instead of one per matrix, and b's gradient one GEMM, not a sum of them.
    std::vector<std::int64_t> dims(sa.begin(), sa.end() - 1);
    const auto out = detail::apply<T>(op::MatMul{false, transpose_b}, loc, reshape(a, {a.numel() / k, k}, loc), b);
    dims.push_back(out.shape()[1]);
    return reshape(out, dims, loc);
  }
  return detail::apply<T>(op::MatMul{transpose_a, transpose_b}, loc, a, b);
}

template <FloatingPoint T> Tensor<T> matmul(const Tensor<T>& a, const Tensor<T>& b, SourceLoc loc) {
  return matmul(a, b, false, false, loc);
}

}  // namespace xgrad
