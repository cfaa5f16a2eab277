// The second half of fuzz_ops' table (fuzz_ops.cpp has the harness and the first half):
// linear algebra, shapes, reductions and the neural-network ops. One row per op.
#include "fuzz_ops.hpp"

namespace xgrad::fuzz::ops {

// clang-format off
const std::vector<Row> kRowsShapes = {
    // Linear algebra (ops/linalg.hpp).
    ROW("matmul", kFloat, in.run([](const Tn<T>& a, const Tn<T>& b) { return xg::matmul(a, b); }, in.tensor<T>(), in.tensor<T>())),
    ROW("matmul(transposed)", kFloat, bool ta = in.flag(), tb = in.flag(); in.run([=](const Tn<T>& a, const Tn<T>& b) { return xg::matmul(a, b, ta, tb); }, in.tensor<T>(), in.tensor<T>())),

    // Shapes (ops/manipulation.hpp).
    ROW("reshape", kAll, auto s = in.sizes(); in.run([=](const Tn<T>& x) { return xg::reshape(x, s); }, in.tensor<T>())),
    ROW("transpose", kAll, auto x = in.tensor<T>(); auto p = in.axes(x.ndim()); in.run([=](const Tn<T>& x) { return xg::transpose(x, p); }, x)),
    ROW("broadcast_to", kAll, auto s = in.sizes(); in.run([=](const Tn<T>& x) { return xg::broadcast_to(x, xg::Shape(s)); }, in.tensor<T>())),
    ROW("sum_to", kNum, auto s = in.sizes(); in.run([=](const Tn<T>& x) { return xg::sum_to(x, xg::Shape(s)); }, in.tensor<T>())),
    ROW("expand_dims", kAll, auto x = in.tensor<T>(); I64 a = in.axis(x.ndim() + 1); in.run([=](const Tn<T>& x) { return xg::expand_dims(x, a); }, x)),
    ROW("squeeze", kAll, auto x = in.tensor<T>(); auto a = in.axes(x.ndim()); in.run([=](const Tn<T>& x) { return xg::squeeze(x, a); }, x)),
    ROW("flatten", kAll, in.run([](const Tn<T>& x) { return xg::flatten(x); }, in.tensor<T>())),
    ROW("slice", kAll, auto x = in.tensor<T>(); std::vector<I64> b(x.ndim() + (in.pick(8) == 0)), s(b.size()); for (auto& v : b) v = in.u8() < 200 ? in.pick(4) : in.any_int(); for (auto& v : s) v = in.u8() < 200 ? I64(in.pick(5)) - 1 : in.any_int(); in.run([=](const Tn<T>& x) { return xg::slice(x, b, s); }, x)),
    ROW("slice_backward", kNum, auto g = in.tensor<T>(); auto s = in.sizes(); std::vector<I64> b(g.ndim()); for (auto& v : b) v = in.u8() < 200 ? in.pick(4) : in.any_int(); in.run([=](const Tn<T>& g) { return xg::slice_backward(g, xg::Shape(s), b); }, g)),
    ROW("concat", kAll, auto xs = in.tensors<T>(); I64 a = in.axis(xs.empty() ? 1 : xs[0].ndim()); in.run([=](const Tv<T>& xs) { return xg::concat(xs, a); }, xs)),
    ROW("split", kAll, auto x = in.tensor<T>(); auto sizes = in.sizes(); I64 a = in.axis(x.ndim()); in.run([=](const Tn<T>& x) { auto p = xg::split(x, sizes, a); return p.empty() ? x : p.back(); }, x)),
    ROW("take", kAll, auto x = in.tensor<T>(); I64 a = in.axis(x.ndim()); I64 n = x.ndim() > 0 && a >= -x.ndim() && a < x.ndim() ? x.shape()[a < 0 ? a + x.ndim() : a] : 3; auto i = in.labels(in.input_shape(), n); in.run([=](const Tn<T>& x, const Tn<I32>& i) { return xg::take(x, i, a); }, x, i)),
    ROW("cumsum", kNum, auto x = in.tensor<T>(); I64 a = in.axis(x.ndim()); bool r = in.flag(); in.run([=](const Tn<T>& x) { return xg::cumsum(x, a, r); }, x)),
    ROW("tril", kAll, I64 k = in.u8() < 200 ? I64(in.pick(7)) - 3 : in.any_int(); in.run([=](const Tn<T>& x) { return xg::tril(x, k); }, in.tensor<T>())),
    ROW("triu", kAll, I64 k = in.u8() < 200 ? I64(in.pick(7)) - 3 : in.any_int(); in.run([=](const Tn<T>& x) { return xg::triu(x, k); }, in.tensor<T>())),
    ROW("masked_fill", kAll, auto x = in.tensor<T>(); auto m = in.tensor<bool>(in.pick(2) ? x.shape() : in.input_shape()); T v = in.value<T>(); in.run([=](const Tn<T>& x, const Tn<bool>& m) { return xg::masked_fill(x, m, v); }, x, m)),
    ROW("stack", kAll, auto xs = in.tensors<T>(); I64 a = in.axis(xs.empty() ? 1 : xs[0].ndim() + 1); in.run([=](const Tv<T>& xs) { return xg::stack(xs, a); }, xs)),

    // Reductions (ops/reduce.hpp).
    ROW("sum", kNum, auto x = in.tensor<T>(); auto a = in.axes(x.ndim()); bool k = in.flag(); in.run([=](const Tn<T>& x) { return xg::sum(x, a, k); }, x)),
    ROW("mean", kFloat, auto x = in.tensor<T>(); auto a = in.axes(x.ndim()); bool k = in.flag(); in.run([=](const Tn<T>& x) { return xg::mean(x, a, k); }, x)),
    ROW("max", kNum, auto x = in.tensor<T>(); auto a = in.axes(x.ndim()); bool k = in.flag(); in.run([=](const Tn<T>& x) { return xg::max(x, a, k); }, x)),
    ROW("min", kNum, auto x = in.tensor<T>(); auto a = in.axes(x.ndim()); bool k = in.flag(); in.run([=](const Tn<T>& x) { return xg::min(x, a, k); }, x)),
    ROW("argmax", kNum, auto x = in.tensor<T>(); I64 a = in.axis(x.ndim()); bool k = in.flag(); in.run([=](const Tn<T>& x) { return xg::argmax(x, a, k); }, x)),

    // Neural-network ops (ops/nn.hpp).
    ROW("bias_add", kFloat, in.run([](const Tn<T>& x, const Tn<T>& b) { return xg::bias_add(x, b); }, in.tensor<T>(), in.tensor<T>())),
    ROW("conv2d", kFloat, xg::Conv2dOptions o{in.u8() < 200 ? I64(in.pick(4)) : in.any_int(), in.u8() < 200 ? I64(in.pick(4)) : in.any_int(), in.u8() < 200 ? I64(in.pick(4)) : in.any_int(), in.pad_mode()}; in.run([=](const Tn<T>& x, const Tn<T>& w) { return xg::conv2d(x, w, o); }, in.tensor<T>(), in.tensor<T>())),
    ROW("max_pool2d", kFloat, I64 k = in.u8() < 200 ? I64(in.pick(4)) : in.any_int(), s = in.u8() < 200 ? I64(in.pick(4)) : in.any_int(); auto m = in.pad_mode(); in.run([=](const Tn<T>& x) { return xg::max_pool2d(x, k, s, m); }, in.tensor<T>())),
    ROW("max_pool2d(kernel)", kFloat, I64 k = in.u8() < 200 ? I64(in.pick(4)) : in.any_int(); in.run([=](const Tn<T>& x) { return xg::max_pool2d(x, k); }, in.tensor<T>())),
    ROW("avg_pool2d", kFloat, I64 k = in.u8() < 200 ? I64(in.pick(4)) : in.any_int(), s = in.u8() < 200 ? I64(in.pick(4)) : in.any_int(); auto m = in.pad_mode(); in.run([=](const Tn<T>& x) { return xg::avg_pool2d(x, k, s, m); }, in.tensor<T>())),
    ROW("avg_pool2d(kernel)", kFloat, I64 k = in.u8() < 200 ? I64(in.pick(4)) : in.any_int(); in.run([=](const Tn<T>& x) { return xg::avg_pool2d(x, k); }, in.tensor<T>())),
    ROW("resize_bilinear", kFloat, I64 h = in.u8() < 200 ? I64(in.pick(6)) : in.any_int(), w = in.u8() < 200 ? I64(in.pick(6)) : in.any_int(); bool a = in.flag(); in.run([=](const Tn<T>& x) { return xg::resize_bilinear(x, h, w, a); }, in.tensor<T>())),
    ROW("softmax", kFloat, auto x = in.tensor<T>(); I64 a = in.axis(x.ndim()); in.run([=](const Tn<T>& x) { return xg::softmax(x, a); }, x)),
    ROW("log_softmax", kFloat, auto x = in.tensor<T>(); I64 a = in.axis(x.ndim()); in.run([=](const Tn<T>& x) { return xg::log_softmax(x, a); }, x)),
    ROW("gelu", kFloat, auto form = in.flag() ? xg::GeluApproximation::tanh : xg::GeluApproximation::none; in.run([=](const Tn<T>& x) { return xg::gelu(x, form); }, in.tensor<T>())),
    ROW("scaled_dot_product_attention", kFloat, auto q = in.tensor<T>(); bool same = in.flag(); auto k = same ? in.tensor<T>(q.shape()) : in.tensor<T>(); auto v = same ? in.tensor<T>(q.shape()) : in.tensor<T>(); xg::AttentionOptions o{.causal = in.flag()}; if (in.flag()) o.scale = in.value<double>(); in.run([=](const Tn<T>& q, const Tn<T>& k, const Tn<T>& v) { return xg::scaled_dot_product_attention(q, k, v, o); }, q, k, v)),
    ROW("layer_norm", kFloat, auto x = in.tensor<T>(); auto gamma = in.tensor<T>(); auto beta = in.tensor<T>(); in.run([](const Tn<T>& x, const Tn<T>& g, const Tn<T>& b) { return xg::layer_norm(x, g, b); }, x, gamma, beta)),
    ROW("one_hot", kFloat, I64 c = in.u8() < 200 ? I64(in.pick(6)) : in.any_int(); in.run([=](const Tn<I32>& l) { return xg::one_hot<T>(l, c); }, in.labels(in.input_shape(), c))),
    ROW("softmax_cross_entropy", kFloat, auto x = in.tensor<T>(); auto r = in.reduction(); auto l = in.labels(in.flag() && x.ndim() ? xg::Shape{x.shape()[0]} : in.input_shape(), x.ndim() == 2 ? x.shape()[1] : 3); in.run([=](const Tn<T>& x, const Tn<I32>& l) { return xg::softmax_cross_entropy(x, l, r); }, x, l)),
};
// clang-format on

}  // namespace xgrad::fuzz::ops
