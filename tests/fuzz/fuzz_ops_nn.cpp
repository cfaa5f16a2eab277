// The third part of fuzz_ops' table (fuzz_ops.cpp has the harness): the layers, losses,
// optimizers and sampling of xgrad::nn, the control-flow ops and jit's configuration, each built from
// fuzzer-chosen sizes and options and then called. One row per public class or function.
#include <random>

#include "fuzz_ops.hpp"

namespace xgrad::fuzz::ops {

namespace {

/// A size or count for a constructor: small mostly, anything sometimes.
I64 small_or_any(In& in) { return in.u8() < 200 ? I64(in.pick(5)) : in.any_int(); }

/// A fori_loop range: mostly a few iterations, sometimes any bounds. Bounds that fit int32
/// are kept within 64 iterations of each other: a loop asked to run 2^32 times is slow, not
/// wrong; the others must be refused.
std::pair<I64, I64> loop_range(In& in) {
  if (in.u8() < 220) {
    const I64 lo = I64(in.pick(5)) - 2;
    return {lo, lo + I64(in.pick(6)) - 1};
  }
  const I64 lo = in.any_int();
  I64 hi = in.any_int();
  const auto fits = [](I64 v) { return v >= kI32Min && v <= kI32Max; };
  if (fits(lo) && fits(hi) && hi > lo + 64) hi = lo + 64;
  return {lo, hi};
}

/// A while_loop bound: never -1 (no bound), since the fuzzer's values can make any condition
/// stay true forever; negative ones below -1 must be refused.
I64 loop_bound(In& in) {
  constexpr I64 bounds[] = {0, 1, 3, 50, -2, -7, kI64Min};
  return bounds[in.pick(std::size(bounds))];
}

xg::Reduction any_reduction(In& in) { return static_cast<xg::Reduction>(in.pick(3)); }

/// Calls a layer through `in`, comparing eager with jit, unless it drops out in training: each
/// call moves its dropout key on, so the jitted call draws another mask than the eager one did.
/// Such a call runs eagerly, checked but not compared.
template <class F, class... A>
void run_layer(In& in, const xg::nn::Module& layer, float dropout, F f, const A&... args) {
  if (layer.training() && dropout != 0.0f)
    in.run_eager(std::move(f), args...);
  else
    in.run(std::move(f), args...);
}

/// Whether a loop over xs's leading axis takes few steps: an empty tensor's leading axis may be
/// 2^40, and a loop asked to run that often is slow, not wrong (as loop_range says).
bool few_steps(const xg::TensorBase& xs) { return xs.ndim() == 0 || xs.shape()[0] <= 64; }

}  // namespace

// clang-format off
const std::vector<Row> kRowsNn = {
    // Layers (nn/layers.hpp), called like any op: eagerly, with backward(), and traced.
    ROW("nn::Dense", kF32, auto layer = std::make_shared<xg::nn::Dense>(small_or_any(in), small_or_any(in), xg::nn::DenseOptions{.has_bias = in.flag()}); in.run([layer](const Tn<float>& x) { return (*layer)(x); }, in.tensor<float>())),
    ROW("nn::Conv2d", kF32, I64 ci = small_or_any(in), co = small_or_any(in), k = small_or_any(in); xg::nn::Conv2dOptions o; o.stride = small_or_any(in); o.padding = small_or_any(in); o.dilation = small_or_any(in); o.pad_mode = in.pad_mode(); o.has_bias = in.flag(); auto layer = std::make_shared<xg::nn::Conv2d>(ci, co, k, o); in.run([layer](const Tn<float>& x) { return (*layer)(x); }, in.tensor<float>())),
    ROW("nn::BatchNorm2d", kF32, I64 c = small_or_any(in); xg::nn::BatchNormOptions o{in.value<float>(), in.value<float>()}; auto layer = std::make_shared<xg::nn::BatchNorm2d>(c, o); layer->set_train(in.flag()); in.run([layer](const Tn<float>& x) { return (*layer)(x); }, in.tensor<float>())),
    ROW("nn::LayerNorm", kF32, I64 n = small_or_any(in); xg::nn::LayerNormOptions o{in.value<float>(), in.flag()}; auto layer = std::make_shared<xg::nn::LayerNorm>(n, o); in.run([layer](const Tn<float>& x) { return (*layer)(x); }, in.tensor<float>())),
    ROW("nn::GELU", kF32, auto layer = std::make_shared<xg::nn::GELU>(in.flag() ? xg::GeluApproximation::tanh : xg::GeluApproximation::none); in.run([layer](const Tn<float>& x) { return (*layer)(x); }, in.tensor<float>())),
    ROW("nn::MultiheadAttention", kF32, I64 e = small_or_any(in), h = small_or_any(in); xg::nn::MultiheadAttentionOptions o{.causal = in.flag(), .dropout = in.value<float>(), .has_bias = in.flag(), .seed = 1}; auto layer = std::make_shared<xg::nn::MultiheadAttention>(e, h, o); layer->set_train(in.flag()); if (in.flag()) run_layer(in, *layer, o.dropout, [layer](const Tn<float>& x) { return (*layer)(x); }, in.tensor<float>()); else run_layer(in, *layer, o.dropout, [layer](const Tn<float>& x, const Tn<float>& m) { return (*layer)(x, m); }, in.tensor<float>(), in.tensor<float>())),
    ROW("nn::MultiheadAttention(cached)", kF32, I64 e = small_or_any(in), h = small_or_any(in); auto layer = std::make_shared<xg::nn::MultiheadAttention>(e, h, xg::nn::MultiheadAttentionOptions{.causal = in.flag(), .dropout = 0.0f, .has_bias = true, .seed = 1}); auto a = in.tensor<float>(), b = in.tensor<float>(); in.run_eager([layer](const Tn<float>& x, const Tn<float>& y) { xg::nn::KeyValueCache cache; layer->forward_cached(x, cache); return layer->forward_cached(y, cache); }, a, b)),
    ROW("nn::TransformerEncoderLayer", kF32, I64 e = small_or_any(in), h = small_or_any(in); xg::nn::TransformerLayerOptions o{.feedforward = small_or_any(in), .dropout = in.value<float>(), .causal = in.flag(), .norm_first = in.flag(), .activation = in.flag() ? xg::GeluApproximation::tanh : xg::GeluApproximation::none, .eps = in.value<float>(), .seed = 1}; auto layer = std::make_shared<xg::nn::TransformerEncoderLayer>(e, h, o); run_layer(in, *layer, o.dropout, [layer](const Tn<float>& x) { return (*layer)(x); }, in.tensor<float>())),
    ROW("nn::LSTM", kF32, auto layer = std::make_shared<xg::nn::LSTM>(small_or_any(in), small_or_any(in)); auto x = in.tensor<float>(); if (!few_steps(x)) return; in.run([layer](const Tn<float>& x) { return (*layer)(x); }, x)),
    ROW("nn::GRU", kF32, auto layer = std::make_shared<xg::nn::GRU>(small_or_any(in), small_or_any(in)); auto x = in.tensor<float>(); if (!few_steps(x)) return; auto h0 = in.flag() ? in.tensor<float>() : Tn<float>(); in.run([layer, h0](const Tn<float>& x) { return layer->run(x, h0).output; }, x)),
    ROW("nn::sinusoidal_positions", kF32, I64 n = small_or_any(in), d = small_or_any(in); in.run_eager([n, d] { return xg::nn::sinusoidal_positions(n, d); })),
    ROW("nn::sample", kF32, xg::nn::SamplingOptions o{.temperature = in.value<float>(), .top_k = small_or_any(in)}; std::uint64_t seed = in.u8(); in.run_eager([o, seed](const Tn<float>& logits) { std::mt19937_64 gen(seed); return xg::nn::sample(logits, o, gen); }, in.tensor<float>())),
    ROW("nn::Sequential", kF32, auto seq = std::make_shared<xg::nn::Sequential>(); seq->emplace<xg::nn::Dense>(small_or_any(in), small_or_any(in)); seq->emplace<xg::nn::Dense>(small_or_any(in), small_or_any(in)); in.run([seq](const Tn<float>& x) { return (*seq)(x); }, in.tensor<float>())),

    // Losses (nn/loss.hpp): labels of any dtype and shape reach them as a TensorBase.
    ROW("nn::MSELoss", kF32, auto loss = std::make_shared<xg::nn::MSELoss>(any_reduction(in)); in.run([loss](const Tn<float>& out, const Tn<float>& labels) { return (*loss)(out, labels); }, in.tensor<float>(), in.tensor<float>())),
    ROW("nn::MSELoss(int labels)", kF32, auto loss = std::make_shared<xg::nn::MSELoss>(); in.run([loss](const Tn<float>& out, const Tn<I32>& labels) { return (*loss)(out, labels); }, in.tensor<float>(), in.tensor<I32>())),
    ROW("nn::SoftmaxCrossEntropy(sparse)", kF32, auto loss = std::make_shared<xg::nn::SoftmaxCrossEntropy>(xg::nn::SoftmaxCrossEntropyOptions{.sparse = true, .reduction = any_reduction(in)}); auto x = in.tensor<float>(); auto l = in.labels(in.flag() && x.ndim() ? xg::Shape{x.shape()[0]} : in.input_shape(), x.ndim() == 2 ? x.shape()[1] : 3); in.run([loss](const Tn<float>& x, const Tn<I32>& l) { return (*loss)(x, l); }, x, l)),
    ROW("nn::SoftmaxCrossEntropy(dense)", kF32, auto loss = std::make_shared<xg::nn::SoftmaxCrossEntropy>(xg::nn::SoftmaxCrossEntropyOptions{.sparse = false, .reduction = any_reduction(in)}); auto x = in.tensor<float>(); auto l = in.flag() ? in.tensor<float>(x.shape()) : in.tensor<float>(); in.run([loss](const Tn<float>& x, const Tn<float>& l) { return (*loss)(x, l); }, x, l)),

    // Optimizers (nn/optim.hpp): hyperparameters of any value, gradients of any shape, two steps.
    ROW("optim::SGD", kF32, float lr = in.value<float>(), wd = in.value<float>(); in.run_eager([=](const Tn<float>& p0, const Tn<float>& g) { xg::Parameter<float> p(p0, "p"); xg::optim::SGD opt({p}, lr, wd); opt.step({g}); opt.step({g}); return Tn<float>(p); }, in.tensor<float>(), in.tensor<float>())),
    ROW("optim::Momentum", kF32, float lr = in.value<float>(), m = in.value<float>(); xg::optim::MomentumOptions o{in.value<float>(), in.flag()}; in.run_eager([=](const Tn<float>& p0, const Tn<float>& g) { xg::Parameter<float> p(p0, "p"); xg::optim::Momentum opt({p}, lr, m, o); opt.step({g}); opt.step({g}); return Tn<float>(p); }, in.tensor<float>(), in.tensor<float>())),
    ROW("optim::Adam", kF32, float lr = in.value<float>(); xg::optim::AdamOptions o{in.value<float>(), in.value<float>(), in.value<float>(), in.value<float>()}; bool decoupled = in.flag(); in.run_eager([=](const Tn<float>& p0, const Tn<float>& g) { xg::Parameter<float> p(p0, "p"); auto opt = decoupled ? std::unique_ptr<xg::optim::Optimizer>(new xg::optim::AdamW({p}, lr, o)) : std::unique_ptr<xg::optim::Optimizer>(new xg::optim::Adam({p}, lr, o)); opt->step({g}); opt->step({g}); return Tn<float>(p); }, in.tensor<float>(), in.tensor<float>())),

    // Control flow (jit/control_flow.hpp): eagerly C++ loops, traced single nodes.
    ROW("fori_loop", kFloat, const auto range = loop_range(in); const I64 lo = range.first, hi = range.second; in.run([lo, hi](const Tn<T>& x) { return xg::fori_loop(lo, hi, [](xg::Tensor<I32> i, const Tn<T>& c) { return c * T(0.5) + xg::cast<T>(i); }, x); }, in.tensor<T>())),
    ROW("while_loop", kFloat, I64 bound = loop_bound(in); T limit = in.value<T>(); in.run([bound, limit](const Tn<T>& x) { return xg::while_loop([limit](const Tn<T>& c) { return xg::sum(c) < limit; }, [](const Tn<T>& c) { return c * T(2) + T(1); }, x, {.max_iters = bound}); }, in.tensor<T>())),
    ROW("scan", kFloat, bool reverse = in.flag(); auto c = in.tensor<T>(); auto xs = in.tensor<T>(); if (!few_steps(xs)) return; in.run([reverse](const Tn<T>& c, const Tn<T>& xs) { auto [last, ys] = xg::scan([](const Tn<T>& carry, const Tn<T>& x) { auto next = xg::tanh(carry + x); return std::pair{next, next * T(2)}; }, c, xs, {.reverse = reverse}); return ys; }, c, xs)),
    ROW("cond", kNum, in.run([](const Tn<bool>& p, const Tn<T>& x, const Tn<T>& y) { return xg::cond(p, [](const Tn<T>& a, const Tn<T>& b) { return a + b; }, [](const Tn<T>& a, const Tn<T>& b) { return a - b; }, x, y); }, in.tensor<bool>(), in.tensor<T>(), in.tensor<T>())),

    // jit's configuration (jit/jit.hpp): any level, retrace limit and name.
    ROW("JitConfig", kFloat, xg::JitConfig c; c.level = static_cast<xg::JitLevel>(in.u8() % 5); c.max_retraces = in.u8() < 128 ? I64(in.pick(4)) - 2 : in.any_int(); c.strict = in.flag(); c.poison_freed_buffers = in.flag(); in.run_eager([c](const Tn<T>& x) { auto f = xg::jit([](const Tn<T>& v) { return xg::tanh(v) * v; }, c); return f(x); }, in.tensor<T>())),
};
// clang-format on

}  // namespace xgrad::fuzz::ops
