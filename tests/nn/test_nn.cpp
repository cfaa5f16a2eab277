// nn: each layer's forward against values worked out by hand, its gradients against central
// differences, the optimizers against their update equations, and Model.train giving the same
// losses eagerly and as one compiled step.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <xgrad/models/lenet5.hpp>
#include <xgrad/nn/layers.hpp>
#include <xgrad/nn/model.hpp>
#include <xgrad/xgrad.hpp>

#include "test_support.hpp"

namespace xg = xgrad;
using xg::Tensor;

namespace {

/// Restores the mode and the initializers' seed sequence a test changed.
struct ModeGuard {
  xg::Mode saved = xg::get_mode();
  ~ModeGuard() { xg::set_mode(saved); }
};

std::vector<float> values(const Tensor<float>& t) { return {t.data(), t.data() + t.numel()}; }

void check_values(const Tensor<float>& got, const std::vector<float>& want, double tol = 1e-6) {
  REQUIRE(static_cast<std::size_t>(got.numel()) == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i);
    CHECK(got.data()[i] == doctest::Approx(want[i]).epsilon(tol));
  }
}

/// sum(module(x) * weights) in double: a scalar whose gradient reaches every output element with
/// a different weight, so a wrong index in a gradient shows.
double objective(xg::nn::Module& m, const Tensor<float>& x, const Tensor<float>& weights) {
  xg::no_grad off;
  const Tensor<float> y = m(x);
  double s = 0;
  for (std::int64_t i = 0; i < y.numel(); ++i) s += static_cast<double>(y.data()[i]) * weights.data()[i];
  return s;
}

/// Checks d objective / d p for every parameter of m (and d / dx) against central differences.
void check_gradients(xg::nn::Module& m, Tensor<float> x) {
  constexpr float eps = 1e-3f;
  const Tensor<float> weights = xg::uniform<float>(m(x).shape(), -1.0f, 1.0f, 99);
  auto params = m.parameters();
  x.set_requires_grad(true);
  params.push_back(xg::Parameter<float>::shared(x));
  auto [value, grads] =
      xg::value_and_grad([&](const Tensor<float>& in) { return xg::sum(m(in) * weights); }, params)(x);
  for (std::size_t k = 0; k < params.size(); ++k) {
    float* p = params[k].data();
    double scale = 1e-3;
    for (std::int64_t i = 0; i < params[k].numel(); ++i) scale = std::max(scale, std::abs(double(grads[k].data()[i])));
    for (std::int64_t i = 0; i < params[k].numel(); ++i) {
      const float saved = p[i];
      p[i] = saved + eps;
      const double up = objective(m, x, weights);
      p[i] = saved - eps;
      const double down = objective(m, x, weights);
      p[i] = saved;
      const double numeric = (up - down) / (2.0 * eps);
      INFO("parameter " << k << " (" << params[k].name() << ") element " << i);
      CHECK(std::abs(numeric - grads[k].data()[i]) <= 2e-2 * scale);
    }
  }
}

}  // namespace

TEST_CASE("nn: Dense computes x W^T + b and its gradients") {
  xg::nn::Dense dense(3, 2);
  xg::no_grad off;
  dense.weight.assign(xg::tensor<float>({{1, 2, 3}, {-1, 0, 1}}));
  dense.bias.assign(xg::tensor<float>({0.5, -0.5}));
  const auto x = xg::tensor<float>({{1, 1, 1}, {2, 0, -1}});
  // [1+2+3+.5, -1+0+1-.5], [2-3+.5, -2-1-.5]
  check_values(dense(x), {6.5f, -0.5f, -0.5f, -3.5f});
  xg::enable_grad on;
  check_gradients(dense, xg::randn<float>({4, 3}, 1));
  CHECK(dense.named_parameters().size() == 2);
  xg::nn::Dense no_bias(3, 2, {.has_bias = false});
  CHECK(no_bias.named_parameters().size() == 1);
  CHECK_THROWS_WITH_AS(dense(xg::ones<float>({2, 4})), doctest::Contains("Dense: expected input [N, 3], got [2, 4]"),
                       xg::ShapeError);
  CHECK_THROWS_WITH_AS(xg::nn::Dense(0, 2), doctest::Contains("in_features must be > 0, got 0"), xg::ValueError);
}

TEST_CASE("nn: Conv2d in each pad mode, with stride, dilation and bias") {
  const auto x = xg::reshape(xg::arange<float>(0, 16), {1, 1, 4, 4});
  SUBCASE("valid: sums of 2x2 windows") {
    xg::nn::Conv2d conv(1, 1, 2, {.pad_mode = xg::PadMode::valid, .weight_init = xg::init::ones()});
    check_values(conv(x), {10, 14, 18, 26, 30, 34, 42, 46, 50});
  }
  SUBCASE("same with stride 2 keeps ceil(4 / 2) rows; the bias is added") {
    xg::nn::Conv2d conv(1, 1, 3,
                        {.stride = 2,
                         .pad_mode = xg::PadMode::same,
                         .has_bias = true,
                         .weight_init = xg::init::ones(),
                         .bias_init = xg::init::ones()});
    // One row and column of padding, after the input (MindSpore's and TensorFlow's same): 3x3
    // windows from (0,0), (0,2), (2,0), (2,2), plus the bias 1.
    check_values(conv(x), {0 + 1 + 2 + 4 + 5 + 6 + 8 + 9 + 10 + 1, 2 + 3 + 6 + 7 + 10 + 11 + 1,
                           8 + 9 + 10 + 12 + 13 + 14 + 1, 10 + 11 + 14 + 15 + 1});
  }
  SUBCASE("pad 1 with dilation 2: a 3x3 kernel spanning 5x5") {
    xg::nn::Conv2d conv(1, 1, 3,
                        {.padding = 1, .dilation = 2, .pad_mode = xg::PadMode::pad, .weight_init = xg::init::ones()});
    // Output 2x2; window rows/cols {-1, 1, 3} + offset: (0,0) -> rows {-1,1,3} cols {-1,1,3}.
    check_values(conv(x), {5 + 7 + 13 + 15, 4 + 6 + 12 + 14, 1 + 3 + 9 + 11, 0 + 2 + 8 + 10});
  }
  SUBCASE("gradients, several channels") {
    xg::nn::Conv2d conv(2, 3, 3, {.stride = 2, .has_bias = true, .bias_init = xg::init::normal(0.1)});
    check_gradients(conv, xg::randn<float>({2, 2, 5, 5}, 3));
  }
  CHECK_THROWS_WITH_AS(xg::nn::Conv2d(1, 1, 3)(xg::ones<float>({1, 2, 4, 4})),
                       doctest::Contains("Conv2d: expected input [N, 1, H, W], got [1, 2, 4, 4]"), xg::ShapeError);
  CHECK_THROWS_WITH_AS(xg::nn::Conv2d(1, 1, 3, {.padding = 1}), doctest::Contains("padding 1 needs pad_mode pad"),
                       xg::ValueError);
}

TEST_CASE("nn: pooling, ReLU and Flatten") {
  const auto x = xg::reshape(xg::arange<float>(0, 16), {1, 1, 4, 4}) * -1.0f + 8.0f;  // 8, 7, ..., -7
  check_values(xg::nn::MaxPool2d(2)(x), {8, 6, 0, -2});
  check_values(xg::nn::AvgPool2d(2)(x), {5.5f, 3.5f, -2.5f, -4.5f});
  check_values(xg::nn::MaxPool2d(3, 1)(x), {8, 7, 4, 3});
  check_values(xg::nn::ReLU()(xg::tensor<float>({-1, 0, 2})), {0, 0, 2});
  CHECK(xg::nn::Flatten()(x).shape() == xg::Shape{1, 16});
  xg::nn::MaxPool2d pool(2);
  // Distinct values 0.1 apart: no nudge of the central differences changes a window's maximum.
  auto spread = xg::zeros<float>({2, 2, 4, 4});
  for (int i = 0; i < 64; ++i) spread.data()[i] = static_cast<float>(i * 37 % 64) * 0.1f;
  check_gradients(pool, spread);
  xg::nn::AvgPool2d avg(2, {.stride = 1});
  check_gradients(avg, xg::randn<float>({1, 2, 4, 4}, 6));
  CHECK_THROWS_WITH_AS(xg::nn::MaxPool2d(0), doctest::Contains("kernel_size must be > 0"), xg::ValueError);
}

TEST_CASE("nn: BatchNorm2d normalizes by batch statistics in training and moving ones in evaluation") {
  xg::nn::BatchNorm2d bn(2, {.momentum = 0.5f});
  // Channel 0 holds 1, 2, 3, 4 (mean 2.5, variance 1.25); channel 1 holds 10, 10, 10, 14 (11, 3).
  const auto x = xg::reshape(xg::tensor<float>({1, 2, 10, 10, 3, 4, 10, 14}), {2, 2, 2, 1});
  const double s0 = 1 / std::sqrt(1.25 + 1e-5), s1 = 1 / std::sqrt(3.0 + 1e-5);
  auto y = bn(x);
  check_values(y,
               {float(-1.5 * s0), float(-0.5 * s0), float(-1 * s1), float(-1 * s1), float(0.5 * s0), float(1.5 * s0),
                float(-1 * s1), float(3 * s1)},
               1e-5);
  // moving = 0.5 * initial + 0.5 * batch, with the unbiased variance (4 samples: * 4/3).
  check_values(bn.moving_mean, {0.5f * 0 + 0.5f * 2.5f, 0.5f * 0 + 0.5f * 11});
  check_values(bn.moving_variance, {0.5f + 0.5f * 1.25f * 4 / 3, 0.5f + 0.5f * 3 * 4 / 3.0f}, 1e-6);
  bn.set_train(false);
  const auto e = bn(x);
  CHECK(e.data()[0] == doctest::Approx((1 - 1.25) / std::sqrt(0.5 + 0.5 * 1.25 * 4 / 3 + 1e-5)));
  CHECK(bn.named_buffers().size() == 2);
  xg::nn::BatchNorm2d g(2);
  {
    xg::no_grad off;
    g.gamma.assign(xg::tensor<float>({1.5, 0.5}));
    g.beta.assign(xg::tensor<float>({0.1, -0.2}));
  }
  check_gradients(g, xg::randn<float>({3, 2, 2, 2}, 8));
}

TEST_CASE("nn: Embedding looks rows up, adds the gradient into the rows it used, and traces") {
  ModeGuard mode;
  xg::nn::Embedding emb(5, 3);
  REQUIRE(emb.weight.shape() == xg::Shape{5, 3});
  CHECK(emb.named_parameters().size() == 1);
  const auto table = values(emb.weight);
  const auto ids = xg::tensor<std::int32_t>({1, 4, 1, 0}, {2, 2});
  const auto y = emb(ids);
  REQUIRE(y.shape() == xg::Shape{2, 2, 3});
  const int picked[] = {1, 4, 1, 0};
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) CHECK(y.data()[i * 3 + j] == table[static_cast<std::size_t>(picked[i] * 3 + j)]);
  // d sum(emb(ids) * w) / d weight: row 1 gets w's slices 0 and 2, rows 4 and 0 one each, rows 2
  // and 3 nothing.
  const auto w = xg::randn<float>({2, 2, 3}, 5);
  const auto dw = xg::grad([&](const Tensor<float>& table_in) { return xg::sum(xg::take(table_in, ids) * w); })(
      emb.weight.detach());
  const auto wv = values(w);
  for (int j = 0; j < 3; ++j) {
    CHECK(dw.data()[1 * 3 + j] ==
          doctest::Approx(wv[static_cast<std::size_t>(0 * 3 + j)] + wv[static_cast<std::size_t>(2 * 3 + j)]));
    CHECK(dw.data()[4 * 3 + j] == wv[static_cast<std::size_t>(1 * 3 + j)]);
    CHECK(dw.data()[0 * 3 + j] == wv[static_cast<std::size_t>(3 * 3 + j)]);
    CHECK(dw.data()[2 * 3 + j] == 0.0f);
    CHECK(dw.data()[3 * 3 + j] == 0.0f);
  }
  // The layer's own gradient reaches its weight.
  xg::sum(emb(ids) * w).backward();
  REQUIRE(emb.weight.grad().defined());
  CHECK(values(emb.weight.grad()) == values(dw));
  // Traced inside a compiled function: the same rows, and the ids checked on each call.
  auto f = xg::jit([&](const Tensor<std::int32_t>& i) { return emb(i) * 2.0f; });
  const auto z = f(ids);
  for (std::int64_t k = 0; k < z.numel(); ++k) CHECK(z.data()[k] == 2 * y.data()[k]);
  const auto what = xg::testing::message_of<xg::ValueError>([&] { f(xg::tensor<std::int32_t>({5})); });
  CHECK(xg::testing::contains(what, "index 5"));
  CHECK_THROWS_AS(xg::nn::Embedding(0, 3), xg::ValueError);
}

namespace {
/// MultiheadAttention written out: per-head projections and a naive softmax attention.
Tensor<float> attention_by_hand(const xg::nn::MultiheadAttention& mha, const Tensor<float>& x, const Tensor<float>& m,
                                std::int64_t heads, bool causal) {
  const std::int64_t e = x.shape()[2], hd = e / heads, n = x.shape()[0], t = x.shape()[1], s = m.shape()[1];
  auto rows = [&](const Tensor<float>& p, std::int64_t first) {
    return p.ndim() == 2 ? xg::slice(p, {first * e, 0}, {e, e}) : xg::slice(p, {first * e}, {e});
  };
  auto project = [&](const Tensor<float>& in, std::int64_t which) {
    return xg::matmul(in, rows(mha.in_proj_weight, which), false, true) + rows(mha.in_proj_bias, which);
  };
  const auto q = project(x, 0), k = project(m, 1), v = project(m, 2);
  std::vector<Tensor<float>> outs;
  for (std::int64_t h = 0; h < heads; ++h) {
    auto head = [&](const Tensor<float>& a, std::int64_t len) { return xg::slice(a, {0, 0, h * hd}, {n, len, hd}); };
    auto scores = xg::matmul(head(q, t), head(k, s), false, true) * float(1 / std::sqrt(double(hd)));
    if (causal) scores = scores + xg::triu(xg::full<float>({t, s}, -1e30f), 1);
    outs.push_back(xg::matmul(xg::softmax(scores, -1), head(v, s)));
  }
  return xg::matmul(xg::concat(outs, 2), mha.out_proj_weight, false, true) + mha.out_proj_bias;
}
}  // namespace

TEST_CASE("nn: MultiheadAttention equals its heads written out, self and cross, causal, cached, compiled") {
  xg::nn::MultiheadAttention mha(8, 2);
  CHECK(mha.named_parameters().size() == 4);
  CHECK(mha.in_proj_weight.shape() == xg::Shape{24, 8});
  {
    xg::no_grad off;  // biases away from their zero start, so a dropped bias shows
    mha.in_proj_bias.assign(xg::randn<float>({24}, 4) * 0.1f);
    mha.out_proj_bias.assign(xg::randn<float>({8}, 5) * 0.1f);
  }
  const auto x = xg::randn<float>({2, 5, 8}, 1), memory = xg::randn<float>({2, 3, 8}, 2);
  auto close = [](const Tensor<float>& a, const Tensor<float>& b) {
    REQUIRE(a.shape() == b.shape());
    check_values(a, values(b), 1e-4);
  };
  close(mha(x), attention_by_hand(mha, x, x, 2, false));
  close(mha(x, memory), attention_by_hand(mha, x, memory, 2, false));
  check_gradients(mha, xg::randn<float>({2, 3, 8}, 3));

  xg::nn::MultiheadAttention causal(8, 4, {.causal = true});
  const auto y = causal(x);
  close(y, attention_by_hand(causal, x, x, 4, true));
  // Position t does not depend on later positions: change the last one, the others stay.
  auto later = x.to_vector();
  for (std::size_t i = 4 * 8; i < 5 * 8; ++i) later[i] += 1.0f;  // batch 0, position 4
  const auto moved = causal(xg::tensor<float>(later, {2, 5, 8})).to_vector(), kept = y.to_vector();
  for (std::size_t i = 0; i < 4 * 8; ++i) CHECK(moved[i] == kept[i]);
  CHECK(moved[4 * 8] != kept[4 * 8]);

  // A token at a time through the cache: the same outputs as the whole sequence at once.
  xg::nn::KeyValueCache cache;
  for (std::int64_t t = 0; t < 5; ++t) {
    const auto step = causal.forward_cached(xg::slice(x, {0, t, 0}, {2, 1, 8}), cache);
    close(step, xg::slice(y, {0, t, 0}, {2, 1, 8}));
  }
  CHECK(cache.size() == 5);
  // Two at once after three: causal among the new ones, over all the cached.
  xg::nn::KeyValueCache part;
  causal.forward_cached(xg::slice(x, {0, 0, 0}, {2, 3, 8}), part);
  close(causal.forward_cached(xg::slice(x, {0, 3, 0}, {2, 2, 8}), part), xg::slice(y, {0, 3, 0}, {2, 2, 8}));

  {
    ModeGuard guard;
    xg::set_mode(xg::Mode::graph);
    close(causal(x), y);
  }

  const auto what = xg::testing::message_of<xg::ShapeError>([&] { mha(xg::ones<float>({2, 5, 6})); });
  CHECK(xg::testing::contains(what, "MultiheadAttention: x must be [N, T, 8] (batch first), got Float32[2, 5, 6]"));
  CHECK(xg::testing::contains(xg::testing::message_of<xg::ShapeError>([&] {
                                mha(x, xg::ones<float>({3, 3, 8}));
                              }),
                              "the same batch size"));
  CHECK(xg::testing::contains(xg::testing::message_of<xg::ValueError>([] { xg::nn::MultiheadAttention(8, 3); }),
                              "embed_dim (8) must be a multiple of num_heads (3)"));
  CHECK_THROWS_AS(xg::nn::MultiheadAttention(8, 2, {.dropout = 1.0f}), xg::ValueError);
  CHECK_THROWS_AS(xg::nn::MultiheadAttention(0, 2), xg::ValueError);
}

TEST_CASE("nn: MultiheadAttention's dropout drops in training only") {
  xg::nn::MultiheadAttention mha(4, 2, {.dropout = 0.5f, .seed = 7});
  const auto x = xg::randn<float>({1, 6, 4}, 9);
  const auto a = mha(x).to_vector(), b = mha(x).to_vector();
  CHECK(a != b);  // a new mask each training call
  mha.set_train(false);
  CHECK(mha(x).to_vector() == mha(x).to_vector());
  xg::nn::MultiheadAttention same(4, 2);
  {
    xg::no_grad off;
    same.in_proj_weight.assign(mha.in_proj_weight);
    same.out_proj_weight.assign(mha.out_proj_weight);
  }
  CHECK(mha(x).to_vector() == same(x).to_vector());
}

TEST_CASE("nn: TransformerEncoderLayer is attention and a feed-forward part with residuals and norms") {
  const auto x = xg::randn<float>({2, 4, 8}, 11);
  auto by_hand = [](xg::nn::TransformerEncoderLayer& layer, const Tensor<float>& in, bool norm_first) {
    auto ff = [&](const Tensor<float>& h) {
      const auto rows = xg::reshape(h, {8, 8});
      return xg::reshape(layer.linear2(xg::gelu(layer.linear1(rows))), {2, 4, 8});
    };
    if (norm_first) {
      const auto h = in + layer.attention(layer.norm1(in));
      return h + ff(layer.norm2(h));
    }
    const auto h = layer.norm1(in + layer.attention(in));
    return layer.norm2(h + ff(h));
  };
  for (bool norm_first : {true, false}) {
    CAPTURE(norm_first);
    xg::nn::TransformerEncoderLayer layer(8, 2, {.feedforward = 16, .dropout = 0.0f, .norm_first = norm_first});
    CHECK(layer.linear1.weight.shape() == xg::Shape{16, 8});
    check_values(layer(x), values(by_hand(layer, x, norm_first)), 1e-5);
  }
  xg::nn::TransformerEncoderLayer block(8, 2, {.dropout = 0.0f, .causal = true});
  CHECK(block.linear1.weight.shape() == xg::Shape{32, 8});  // feedforward 4 * width
  CHECK(block.named_parameters().size() == 12);
  check_gradients(block, xg::randn<float>({1, 3, 8}, 12));
  // Decoder-only: a token at a time through the cache gives the whole sequence's outputs.
  const auto whole = block(x);
  xg::nn::KeyValueCache cache;
  for (std::int64_t t = 0; t < 4; ++t)
    check_values(block.forward_cached(xg::slice(x, {0, t, 0}, {2, 1, 8}), cache),
                 values(xg::slice(whole, {0, t, 0}, {2, 1, 8})), 1e-4);
  // Dropout in training only.
  xg::nn::TransformerEncoderLayer dropping(8, 2, {.dropout = 0.5f, .seed = 3});
  CHECK(dropping(x).to_vector() != dropping(x).to_vector());
  dropping.set_train(false);
  CHECK(dropping(x).to_vector() == dropping(x).to_vector());
  CHECK_THROWS_AS(xg::nn::TransformerEncoderLayer(8, 2, {.dropout = 1.0f}), xg::ValueError);
  CHECK(xg::testing::contains(
      xg::testing::message_of<xg::ValueError>([] { xg::nn::TransformerEncoderLayer(8, 2, {.feedforward = -1}); }),
      "TransformerEncoderLayer: feedforward must be >= 0"));
}

TEST_CASE("nn: sinusoidal_positions are sines and cosines of the position over powers of 10000") {
  const auto p = xg::nn::sinusoidal_positions(3, 4).to_vector();
  REQUIRE(p.size() == 12);
  CHECK(p[0] == 0.0f);  // position 0: sin 0, cos 0, ...
  CHECK(p[1] == 1.0f);
  CHECK(p[4] == doctest::Approx(std::sin(1.0)));
  CHECK(p[5] == doctest::Approx(std::cos(1.0)));
  CHECK(p[6] == doctest::Approx(std::sin(1.0 / 100.0)));  // 10000^(2/4)
  CHECK(p[11] == doctest::Approx(std::cos(2.0 / 100.0)));
  CHECK_THROWS_AS(xg::nn::sinusoidal_positions(-1, 4), xg::ValueError);
}

TEST_CASE("nn: LSTM and GRU follow their equations, step by step, eagerly and compiled") {
  const auto x = xg::randn<float>({5, 2, 3}, 21);  // [T, N, input]
  auto rows = [](const Tensor<float>& t, std::int64_t gate, std::int64_t h) {
    return t.ndim() == 2 ? xg::slice(t, {gate * h, 0}, {h, t.shape()[1]}) : xg::slice(t, {gate * h}, {h});
  };
  auto step_of = [&](const xg::nn::Module&, const Tensor<float>& w_ih, const Tensor<float>& w_hh,
                     const Tensor<float>& b_ih, const Tensor<float>& b_hh, std::int64_t gate, std::int64_t h,
                     const Tensor<float>& xt, const Tensor<float>& state) {
    return xg::matmul(xt, rows(w_ih, gate, h), false, true) + rows(b_ih, gate, h) +
           xg::matmul(state, rows(w_hh, gate, h), false, true) + rows(b_hh, gate, h);
  };
  SUBCASE("LSTM") {
    xg::nn::LSTM lstm(3, 4);
    CHECK(lstm.named_parameters().size() == 4);
    CHECK(lstm.weight_ih.shape() == xg::Shape{16, 3});
    const auto h0 = xg::randn<float>({2, 4}, 22), c0 = xg::randn<float>({2, 4}, 23);
    Tensor<float> h = h0, c = c0;
    std::vector<float> expected;
    for (std::int64_t t = 0; t < 5; ++t) {
      const auto xt = xg::reshape(xg::slice(x, {t, 0, 0}, {1, 2, 3}), {2, 3});
      auto gate = [&](std::int64_t g) {
        return step_of(lstm, lstm.weight_ih, lstm.weight_hh, lstm.bias_ih, lstm.bias_hh, g, 4, xt, h);
      };
      const auto i = xg::sigmoid(gate(0)), f = xg::sigmoid(gate(1)), g = xg::tanh(gate(2)), o = xg::sigmoid(gate(3));
      c = f * c + i * g;
      h = o * xg::tanh(c);
      for (float v : h.to_vector()) expected.push_back(v);
    }
    const auto out = lstm.run(x, h0, c0);
    CHECK(out.output.shape() == xg::Shape{5, 2, 4});
    check_values(out.output, expected, 1e-5);
    check_values(out.hidden, values(h), 1e-5);
    check_values(out.cell, values(c), 1e-5);
    check_gradients(lstm, xg::randn<float>({3, 2, 3}, 24));
    const auto eager = lstm(x);
    // Compiled, the steps are one Scan node, not five copies of the step.
    const auto lowered = xg::jit([&lstm](const Tensor<float>& v) { return lstm(v); }).lower(x);
    std::int64_t scans = 0, matmuls = 0;
    for (const auto& node : lowered.graph().nodes) {
      scans += node->op() == "Scan";
      matmuls += node->op() == "MatMul";
    }
    CHECK(scans == 1);
    CHECK(matmuls == 1);  // the input projection of every step; the step's own is in the body
    ModeGuard guard;
    xg::set_mode(xg::Mode::graph);
    check_values(lstm(x), values(eager), 1e-6);
    CHECK(xg::testing::contains(xg::testing::message_of<xg::ShapeError>([&] {
                                  lstm(xg::ones<float>({5, 2, 4}));
                                }),
                                "LSTM: x must be [T, N, 3] (sequence first), got Float32[5, 2, 4]"));
  }
  SUBCASE("GRU") {
    xg::nn::GRU gru(3, 4);
    CHECK(gru.weight_hh.shape() == xg::Shape{12, 4});
    Tensor<float> h = xg::zeros<float>({2, 4});
    std::vector<float> expected;
    for (std::int64_t t = 0; t < 5; ++t) {
      const auto xt = xg::reshape(xg::slice(x, {t, 0, 0}, {1, 2, 3}), {2, 3});
      auto in = [&](std::int64_t g) {
        return xg::matmul(xt, rows(gru.weight_ih, g, 4), false, true) + rows(gru.bias_ih, g, 4);
      };
      auto hid = [&](std::int64_t g) {
        return xg::matmul(h, rows(gru.weight_hh, g, 4), false, true) + rows(gru.bias_hh, g, 4);
      };
      const auto r = xg::sigmoid(in(0) + hid(0)), z = xg::sigmoid(in(1) + hid(1));
      const auto n = xg::tanh(in(2) + r * hid(2));
      h = (1.0f - z) * n + z * h;
      for (float v : h.to_vector()) expected.push_back(v);
    }
    check_values(gru(x), expected, 1e-5);
    check_values(gru.run(x).hidden, values(h), 1e-5);
    check_gradients(gru, xg::randn<float>({3, 2, 3}, 25));
    CHECK(xg::testing::contains(xg::testing::message_of<xg::ShapeError>([&] {
                                  gru.run(x, xg::zeros<float>({3, 4}));
                                }),
                                "GRU: h0 must be [2, 4], got [3, 4]"));
  }
  CHECK_THROWS_AS(xg::nn::LSTM(0, 4), xg::ValueError);
  CHECK_THROWS_AS(xg::nn::GRU(3, 0), xg::ValueError);
}

TEST_CASE("nn: LayerNorm normalizes each row of the last axis, then scales and shifts; GELU is gelu") {
  xg::nn::LayerNorm ln(4);
  CHECK(ln.named_parameters().size() == 2);
  // Rows 1 2 3 4 (mean 2.5, biased variance 1.25) and 2 2 2 6 (3, 3).
  const auto x = xg::tensor<float>({1, 2, 3, 4, 2, 2, 2, 6}, {2, 4});
  const double s0 = 1 / std::sqrt(1.25 + 1e-5), s1 = 1 / std::sqrt(3.0 + 1e-5);
  check_values(ln(x),
               {float(-1.5 * s0), float(-0.5 * s0), float(0.5 * s0), float(1.5 * s0), float(-1 * s1), float(-1 * s1),
                float(-1 * s1), float(3 * s1)},
               1e-5);
  {
    xg::no_grad off;
    ln.gamma.assign(xg::tensor<float>({2, 1, 1, 0.5}));
    ln.beta.assign(xg::tensor<float>({0, 1, 0, -1}));
  }
  const auto y = ln(x);
  CHECK(y.data()[0] == doctest::Approx(2 * -1.5 * s0).epsilon(1e-5));
  CHECK(y.data()[1] == doctest::Approx(-0.5 * s0 + 1).epsilon(1e-5));
  CHECK(y.data()[7] == doctest::Approx(0.5 * 3 * s1 - 1).epsilon(1e-5));
  check_gradients(ln, xg::randn<float>({3, 4}, 8));
  xg::nn::LayerNorm plain(4, {.eps = 1e-3f, .elementwise_affine = false});
  CHECK(plain.named_parameters().empty());
  CHECK(plain(x).data()[7] == doctest::Approx(3 / std::sqrt(3.0 + 1e-3)).epsilon(1e-5));
  // A last axis of another size, or a bad eps, is refused with the layer's name and the shapes.
  const auto what = xg::testing::message_of<xg::ShapeError>([&] { ln(xg::ones<float>({2, 5})); });
  CHECK(xg::testing::contains(what, "LayerNorm"));
  CHECK(xg::testing::contains(what, "[2, 5]"));
  CHECK_THROWS_AS(xg::nn::LayerNorm(4, {.eps = 0.0f}), xg::ValueError);
  CHECK_THROWS_AS(xg::nn::LayerNorm(0), xg::ValueError);

  xg::nn::GELU gelu, gelu_tanh(xg::GeluApproximation::tanh);
  const auto g = xg::tensor<float>({-1, 0, 1});
  check_values(gelu(g), {-0.15865525f, 0.0f, 0.84134475f}, 1e-6);  // x Phi(x)
  check_values(gelu_tanh(g), {-0.15880801f, 0.0f, 0.84119199f}, 1e-6);
}

TEST_CASE("nn: Dropout drops with probability p, scales the rest, and draws the same masks under jit") {
  ModeGuard mode;
  const auto x = xg::ones<float>({100, 100});
  xg::nn::Dropout drop(0.25f, 7);
  const auto y = drop(x);
  int kept = 0;
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    const float v = y.data()[i];
    CHECK((v == 0.0f || v == doctest::Approx(1 / 0.75f)));
    kept += v != 0.0f;
  }
  CHECK(kept > 7300);  // 7500 expected; the binomial's standard deviation is 43
  CHECK(kept < 7700);
  CHECK(values(drop(x)) != values(y));  // the key advances
  // The gradient is the mask of the same call, scaled: w where kept, 0 where dropped.
  const auto w = xg::randn<float>({100, 100}, 4);
  Tensor<float> seen;
  auto input = x.detach().set_requires_grad(true);
  const auto dx = xg::grad([&](const Tensor<float>& in) {
    auto out = drop(in);
    seen = out.detach();
    return xg::sum(out * w);
  })(input);
  for (std::int64_t i = 0; i < dx.numel(); ++i)
    REQUIRE(dx.data()[i] == (seen.data()[i] != 0.0f ? w.data()[i] * (1 / 0.75f) : 0.0f));
  drop.set_train(false);
  CHECK(values(drop(x)) == values(x));
  // The same seed in graph mode: the same sequence of masks.
  xg::set_mode(xg::Mode::graph);
  xg::nn::Dropout compiled(0.25f, 7);
  CHECK(values(compiled(x)) == values(y));
  CHECK(values(compiled(x)) != values(y));
  CHECK_THROWS_WITH_AS(xg::nn::Dropout(1.0f), doctest::Contains("p must be in [0, 1), got 1"), xg::ValueError);
}

TEST_CASE("nn: Sequential runs its layers in order and names them by position") {
  xg::nn::Sequential seq;
  // Weights of order 1: pre-activations far from ReLU's kink compared with the differences' step.
  seq.emplace<xg::nn::Dense>(4, 3, xg::nn::DenseOptions{.weight_init = xg::init::normal(1.0)});
  seq.emplace<xg::nn::ReLU>();
  seq.emplace<xg::nn::Dense>(3, 2, xg::nn::DenseOptions{.weight_init = xg::init::normal(1.0)});
  auto names = seq.named_parameters();
  REQUIRE(names.size() == 4);
  CHECK(names[0].first == "0.weight");
  CHECK(names[3].first == "2.bias");
  const auto x = xg::randn<float>({5, 4}, 2);
  auto& first = dynamic_cast<xg::nn::Dense&>(seq[0]);
  auto& last = dynamic_cast<xg::nn::Dense&>(seq[2]);
  const auto want = last(xg::relu(first(x)));
  CHECK(values(seq(x)) == values(want));
  check_gradients(seq, x);
}

TEST_CASE("nn: recompute() gives the same values, gradients and state updates, eagerly and compiled") {
  ModeGuard mode;
  // Two copies of a block with state (BatchNorm2d's statistics, Dropout's key), one recomputing.
  auto block = [] {
    xg::init::set_seed(11);
    auto seq = std::make_unique<xg::nn::Sequential>();
    seq->emplace<xg::nn::Conv2d>(2, 3, 3);
    seq->emplace<xg::nn::BatchNorm2d>(3);
    seq->emplace<xg::nn::ReLU>();
    seq->emplace<xg::nn::Dropout>(0.3f, 5);
    seq->emplace<xg::nn::Flatten>();
    seq->emplace<xg::nn::Dense>(3 * 6 * 6, 4);  // Conv2d pads to keep 6x6 by default
    return seq;
  };
  for (xg::Mode m : {xg::Mode::eager, xg::Mode::graph}) {
    CAPTURE(m == xg::Mode::graph);
    xg::set_mode(m);
    auto plain = block(), remat = block();
    remat->recompute();
    CHECK(remat->recomputes());
    CHECK_FALSE(plain->recomputes());
    const auto x = xg::randn<float>({2, 2, 6, 6}, 3);
    for (int step = 0; step < 2; ++step) {
      CAPTURE(step);
      auto loss_of = [](xg::nn::Module& net) {
        return [&net](const Tensor<float>& in) { return xg::sum(xg::square(net(in))); };
      };
      const auto [loss, grads] = xg::value_and_grad(loss_of(*plain), plain->parameters())(x);
      const auto [remat_loss, remat_grads] = xg::value_and_grad(loss_of(*remat), remat->parameters())(x);
      CHECK(loss.item() == doctest::Approx(remat_loss.item()).epsilon(1e-6));
      REQUIRE(grads.size() == remat_grads.size());
      for (std::size_t k = 0; k < grads.size(); ++k) {
        CAPTURE(k);
        CHECK(xg::max(xg::abs(grads[k])).item() > 0.0f);  // every parameter gets a gradient
        const auto a = values(grads[k]), b = values(remat_grads[k]);
        for (std::size_t i = 0; i < a.size(); ++i) CHECK(b[i] == doctest::Approx(a[i]).epsilon(1e-5));
      }
      // The state moved once per step, as without recompute.
      const auto state = plain->named_buffers(), remat_state = remat->named_buffers();
      REQUIRE(state.size() == remat_state.size());
      auto& bn = dynamic_cast<xg::nn::BatchNorm2d&>((*remat)[1]);
      auto& plain_bn = dynamic_cast<xg::nn::BatchNorm2d&>((*plain)[1]);
      CHECK(values(bn.moving_mean) == values(plain_bn.moving_mean));
      CHECK(dynamic_cast<xg::nn::Dropout&>((*remat)[3]).key.item() ==
            dynamic_cast<xg::nn::Dropout&>((*plain)[3]).key.item());
    }
  }
}

TEST_CASE("nn: vmap of a module's forward shares its parameters; value_and_grad inside gives per-example gradients") {
  ModeGuard mode;
  xg::init::set_seed(3);
  xg::nn::Sequential net;
  net.emplace<xg::nn::Dense>(4, 3);
  net.emplace<xg::nn::ReLU>();
  net.emplace<xg::nn::Dense>(3, 2);
  const auto xs = xg::randn<float>({5, 1, 4}, 8);  // 5 examples, each a batch of one
  const auto ys = xg::tensor<std::int32_t>({0, 1, 1, 0, 1}, {5, 1});
  const auto params = net.parameters();
  auto example_grads = [&](const Tensor<float>& x, const Tensor<std::int32_t>& y) {
    auto loss = [&](const Tensor<float>& in, const Tensor<std::int32_t>& label) {
      return xg::softmax_cross_entropy(net(in), label);
    };
    const auto grads = xg::value_and_grad(loss, params)(x, y).second;
    return std::tuple{grads[0], grads[1], grads[2], grads[3]};
  };
  const auto row = [](const auto& t, std::int64_t b) {
    std::vector<std::int64_t> begin(static_cast<std::size_t>(t.ndim()), 0), size = t.shape().to_vector();
    begin[0] = b;
    size[0] = 1;
    return xg::reshape(xg::slice(t, begin, size), std::vector<std::int64_t>(size.begin() + 1, size.end()));
  };
  for (xg::Mode m : {xg::Mode::eager, xg::Mode::graph}) {
    CAPTURE(m == xg::Mode::graph);
    xg::set_mode(m);
    const auto outs = xg::vmap([&](const Tensor<float>& x) { return net(x); })(xs);
    REQUIRE(outs.shape() == xg::Shape{5, 1, 2});
    const auto per_example = xg::vmap(example_grads)(xs, ys);
    for (std::int64_t b = 0; b < 5; ++b) {
      CAPTURE(b);
      const auto want = values(net(row(xs, b)));
      const auto got = values(row(outs, b));
      for (std::size_t i = 0; i < want.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-6));
      const auto expected = example_grads(row(xs, b), row(ys, b));
      auto compare = [&](const Tensor<float>& batch, const Tensor<float>& one) {
        const auto a = values(row(batch, b)), e = values(one);
        REQUIRE(a.size() == e.size());
        for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(e[i]).epsilon(1e-5));
      };
      compare(std::get<0>(per_example), std::get<0>(expected));
      compare(std::get<1>(per_example), std::get<1>(expected));
      compare(std::get<2>(per_example), std::get<2>(expected));
      compare(std::get<3>(per_example), std::get<3>(expected));
    }
  }
}

TEST_CASE("nn: initializers draw from the seed sequence and have the stated spread") {
  xg::init::set_seed(3);
  xg::nn::Dense a(100, 50);
  xg::init::set_seed(3);
  xg::nn::Dense b(100, 50);
  CHECK(values(a.weight) == values(b.weight));
  xg::nn::Dense c(100, 50);
  CHECK(values(c.weight) != values(b.weight));
  auto stats = [](const Tensor<float>& t) {
    double s = 0, s2 = 0, most = 0;
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      s += t.data()[i];
      s2 += double(t.data()[i]) * t.data()[i];
      most = std::max(most, std::abs(double(t.data()[i])));
    }
    const double n = double(t.numel());
    return std::tuple{s / n, std::sqrt(s2 / n - s * s / n / n), most};
  };
  const xg::init::Fans fans{200, 100};
  auto [m, sd, most] = stats(xg::init::normal(0.5, 1)({100, 100}, fans));
  CHECK(std::abs(m) < 0.02);
  CHECK(sd == doctest::Approx(0.5).epsilon(0.03));
  const double xavier = std::sqrt(6.0 / 300), he = std::sqrt(6.0 / 200);
  std::tie(m, sd, most) = stats(xg::init::xavier_uniform(1.0, 1)({100, 100}, fans));
  CHECK(most <= xavier);
  CHECK(sd == doctest::Approx(xavier / std::sqrt(3.0)).epsilon(0.03));
  std::tie(m, sd, most) = stats(xg::init::he_uniform(0.0, 1)({100, 100}, fans));
  CHECK(most <= he);
  CHECK(sd == doctest::Approx(he / std::sqrt(3.0)).epsilon(0.03));
  std::tie(m, sd, most) = stats(xg::init::uniform(0.2, 1)({100, 100}, fans));
  CHECK(most <= 0.2);
  CHECK(values(xg::init::zeros()({3}, fans)) == std::vector<float>{0, 0, 0});
  CHECK(values(xg::init::ones()({2}, fans)) == std::vector<float>{1, 1});
  CHECK_THROWS_WITH_AS(xg::init::normal(-1.0), doctest::Contains("sigma must be > 0, got -1"), xg::ValueError);
}

TEST_CASE("nn: losses") {
  const auto logits = xg::tensor<float>({{1, 2, 3}, {1, 1, 1}});
  const auto labels = xg::tensor<std::int32_t>({2, 0});
  const double l0 = -std::log(std::exp(3.0) / (std::exp(1.0) + std::exp(2.0) + std::exp(3.0))), l1 = std::log(3.0);
  xg::nn::SoftmaxCrossEntropy sparse({.sparse = true, .reduction = xg::Reduction::mean});
  CHECK(sparse(logits, labels).item() == doctest::Approx((l0 + l1) / 2));
  xg::nn::SoftmaxCrossEntropy dense;  // MindSpore's defaults: dense targets, no reduction
  check_values(dense(logits, xg::tensor<float>({{0, 0, 1}, {1, 0, 0}})), {float(l0), float(l1)}, 1e-5);
  xg::nn::MSELoss mse;
  CHECK(mse(xg::tensor<float>({1, 2}), xg::tensor<float>({0, 4})).item() == doctest::Approx(2.5));
  CHECK_THROWS_WITH_AS(sparse(logits, xg::tensor<float>({2, 0})),
                       doctest::Contains("SoftmaxCrossEntropy: labels must be Int32, got Float32"), xg::ShapeError);
}

namespace {

/// Runs `steps` optimizer steps on p (initially `start`) with gradients grad_at(step) and returns p.
template <class Make> std::vector<float> optimize(Make make, const std::vector<float>& start, int steps,
                                                  const std::function<std::vector<float>(int)>& grad_at) {
  xg::Parameter<float> p(xg::tensor<float>(start), "p");
  auto opt = make(std::vector<xg::Parameter<float>>{p});
  for (int t = 0; t < steps; ++t) opt->step({xg::tensor<float>(grad_at(t))});
  return values(p);
}

}  // namespace

TEST_CASE("optim: each optimizer follows its update equations") {
  const std::vector<float> start{1.0f, -2.0f, 0.5f};
  auto grad_at = [](int t) { return std::vector<float>{0.3f - 0.1f * t, 1.0f, -0.5f * (t + 1)}; };
  constexpr int steps = 4;
  const double lr = 0.1, wd = 0.01;
  auto reference = [&](auto rule) {
    std::vector<double> p(start.begin(), start.end()), s1(3, 0.0), s2(3, 0.0);
    for (int t = 0; t < steps; ++t) {
      auto g = grad_at(t);
      for (int i = 0; i < 3; ++i) rule(t + 1, p[i], double(g[i]), s1[i], s2[i]);
    }
    return p;
  };
  auto check = [](const std::vector<float>& got, const std::vector<double>& want) {
    for (int i = 0; i < 3; ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
  };
  using Params = std::vector<xg::Parameter<float>>;
  SUBCASE("SGD with weight decay") {
    check(optimize([&](Params ps) { return std::make_unique<xg::optim::SGD>(ps, lr, wd); }, start, steps, grad_at),
          reference([&](int, double& p, double g, double&, double&) { p -= lr * (g + wd * p); }));
  }
  SUBCASE("Momentum") {
    check(
        optimize([&](Params ps) { return std::make_unique<xg::optim::Momentum>(ps, lr, 0.9f); }, start, steps, grad_at),
        reference([&](int, double& p, double g, double& v, double&) {
          v = 0.9 * v + g;
          p -= lr * v;
        }));
  }
  SUBCASE("Momentum, Nesterov, weight decay") {
    check(optimize(
              [&](Params ps) {
                return std::make_unique<xg::optim::Momentum>(
                    ps, lr, 0.9f, xg::optim::MomentumOptions{.weight_decay = float(wd), .nesterov = true});
              },
              start, steps, grad_at),
          reference([&](int, double& p, double g, double& v, double&) {
            g += wd * p;
            v = 0.9 * v + g;
            p -= lr * (g + 0.9 * v);
          }));
  }
  auto adam = [&](bool decoupled) {
    return [&, decoupled](int t, double& p, double g, double& m, double& v) {
      if (decoupled)
        p -= lr * wd * p;
      else
        g += wd * p;
      m = 0.9 * m + 0.1 * g;
      v = 0.999 * v + 0.001 * g * g;
      const double mh = m / (1 - std::pow(0.9, t)), vh = v / (1 - std::pow(0.999, t));
      p -= lr * mh / (std::sqrt(vh) + 1e-8);
    };
  };
  SUBCASE("Adam with L2 weight decay") {
    check(optimize(
              [&](Params ps) {
                return std::make_unique<xg::optim::Adam>(ps, lr, xg::optim::AdamOptions{.weight_decay = float(wd)});
              },
              start, steps, grad_at),
          reference(adam(false)));
  }
  SUBCASE("AdamW") {
    check(optimize(
              [&](Params ps) {
                return std::make_unique<xg::optim::AdamW>(ps, lr, xg::optim::AdamOptions{.weight_decay = float(wd)});
              },
              start, steps, grad_at),
          reference(adam(true)));
  }
  SUBCASE("errors") {
    xg::Parameter<float> p(xg::zeros<float>({3}), "p");
    xg::optim::Momentum opt({p}, 0.1f, 0.9f);
    CHECK_THROWS_WITH_AS(opt.step({xg::zeros<float>({2})}),
                         doctest::Contains("the gradient of parameter 'p' has shape [2], expected [3]"),
                         xg::ShapeError);
    CHECK_THROWS_WITH_AS(opt.step(std::vector<Tensor<float>>{}), doctest::Contains("step got 0 gradients for 1"),
                         xg::ValueError);
    CHECK_THROWS_WITH_AS(xg::optim::Momentum({p}, 0.1f, 1.5f), doctest::Contains("momentum must be in [0, 1)"),
                         xg::ValueError);
    CHECK_THROWS_WITH_AS(xg::optim::SGD({p}, -1.0f), doctest::Contains("learning_rate must be finite and >= 0, got -1"),
                         xg::ValueError);
    opt.set_learning_rate(0.5f);
    CHECK(opt.learning_rate() == 0.5f);
    CHECK(opt.named_state()[1].first == "moments.p");
  }
}

namespace {

struct Batch {
  Tensor<float> images;
  Tensor<std::int32_t> labels;
};

/// A small synthetic classification set: 8x8 images whose class is the quadrant holding a
/// bright square, with noise.
std::vector<Batch> quadrant_batches(int batches, int batch_size, std::uint64_t seed) {
  std::vector<Batch> out;
  for (int b = 0; b < batches; ++b) {
    auto images = xg::randn<float>({batch_size, 1, 8, 8}, seed + b) * 0.3f;
    auto labels = xg::zeros<std::int32_t>({batch_size});
    for (int i = 0; i < batch_size; ++i) {
      const int cls = (b * batch_size + i) % 4;
      labels.data()[i] = cls;
      const int r0 = cls / 2 * 4, c0 = cls % 2 * 4;
      for (int r = r0; r < r0 + 3; ++r)
        for (int c = c0; c < c0 + 3; ++c) images.data()[i * 64 + r * 8 + c] += 1.0f;
    }
    out.push_back({images, labels});
  }
  return out;
}

struct SmallNet : xg::nn::Module {
  xg::nn::Conv2d conv{1, 4, 3, {.pad_mode = xg::PadMode::valid, .has_bias = true}};
  xg::nn::BatchNorm2d bn{4};
  xg::nn::Dropout drop{0.1f};
  xg::nn::Dense fc{4 * 3 * 3, 4, {.weight_init = xg::init::xavier_uniform()}};
  SmallNet() { register_modules({{"conv", &conv}, {"bn", &bn}, {"drop", &drop}, {"fc", &fc}}); }
  Tensor<float> forward(Tensor<float> x) override {
    x = xg::max_pool2d(xg::relu(bn(conv(x))), 2, 2);
    return fc(drop(xg::flatten(x)));
  }
};

struct LossRecorder : xg::callbacks::Callback {
  std::vector<float> losses;
  int epochs_begun = 0, epochs_ended = 0, train_begun = 0, train_ended = 0;
  void on_train_begin(const xg::callbacks::RunContext&) override { ++train_begun; }
  void on_train_end(const xg::callbacks::RunContext&) override { ++train_ended; }
  void on_epoch_begin(const xg::callbacks::RunContext&) override { ++epochs_begun; }
  void on_epoch_end(const xg::callbacks::RunContext&) override { ++epochs_ended; }
  void on_step_end(const xg::callbacks::RunContext& ctx) override { losses.push_back(ctx.loss); }
};

}  // namespace

TEST_CASE("optim: clip_by_global_norm scales every gradient by min(1, max_norm / norm), eagerly and compiled") {
  // Gradients [3] and [4] together: norm 5.
  const std::vector<Tensor<float>> grads{xg::tensor<float>({3}), xg::tensor<float>({0, 4})};
  auto clipped = xg::optim::clip_by_global_norm(grads, 1.0f);
  CHECK(clipped.global_norm.item() == doctest::Approx(5.0f));
  check_values(clipped.grads[0], {0.6f}, 1e-5);
  check_values(clipped.grads[1], {0.0f, 0.8f}, 1e-5);
  // Within the bound, or all zero: unchanged.
  clipped = xg::optim::clip_by_global_norm(grads, 10.0f);
  CHECK(values(clipped.grads[1]) == values(grads[1]));
  clipped = xg::optim::clip_by_global_norm({xg::zeros<float>({3})}, 1.0f);
  CHECK(clipped.global_norm.item() == 0.0f);
  CHECK(values(clipped.grads[0]) == std::vector<float>(3, 0.0f));
  // Traced into a compiled function: the same numbers.
  auto f = xg::jit([](const Tensor<float>& a, const Tensor<float>& b) {
    auto c = xg::optim::clip_by_global_norm({a, b}, 2.0f);
    return c.grads[1] * c.global_norm;
  });
  check_values(f(grads[0], grads[1]), {0.0f, float(4 * 2 / (5 + 1e-6) * 5)}, 1e-5);
  CHECK_THROWS_AS(xg::optim::clip_by_global_norm(grads, 0.0f), xg::ValueError);
  CHECK_THROWS_AS(xg::optim::clip_by_global_norm({Tensor<float>()}, 1.0f), xg::ValueError);
}

TEST_CASE("optim: warmup_cosine and step_decay give the rates of their formulas; set_learning_rate takes them") {
  const auto cosine = xg::optim::warmup_cosine(1.0f, 10, 110, 0.1f);
  CHECK(cosine(0) == doctest::Approx(0.1f));
  CHECK(cosine(4) == doctest::Approx(0.5f));
  CHECK(cosine(9) == doctest::Approx(1.0f));
  CHECK(cosine(10) == doctest::Approx(1.0f));
  CHECK(cosine(60) == doctest::Approx(0.55f));  // halfway down the cosine
  CHECK(cosine(110) == doctest::Approx(0.1f));
  CHECK(cosine(1000) == doctest::Approx(0.1f));
  const auto decay = xg::optim::step_decay(0.5f, 3, 0.1f);
  CHECK(decay(2) == doctest::Approx(0.5f));
  CHECK(decay(3) == doctest::Approx(0.05f));
  CHECK(decay(7) == doctest::Approx(0.005f));
  xg::nn::Dense layer(2, 1);
  xg::optim::SGD sgd(layer.parameters(), 0.3f);
  sgd.set_learning_rate(cosine(60));
  CHECK(sgd.learning_rate() == doctest::Approx(0.55f));
  CHECK_THROWS_AS(xg::optim::warmup_cosine(1.0f, 10, 10), xg::ValueError);
  CHECK_THROWS_AS(xg::optim::warmup_cosine(0.1f, 0, 10, 0.5f), xg::ValueError);
  CHECK_THROWS_AS(xg::optim::step_decay(0.1f, 0, 0.5f), xg::ValueError);
  CHECK_THROWS_AS(xg::optim::step_decay(0.1f, 5, 1.5f), xg::ValueError);
}

TEST_CASE("Model: train gives the same per-step losses eagerly and as one compiled step") {
  ModeGuard mode;
  const auto data = quadrant_batches(10, 8, 40);
  LossRecorder recorded[2];
  std::map<std::string, double> results[2];
  for (int graph = 0; graph < 2; ++graph) {
    xg::set_mode(graph ? xg::Mode::graph : xg::Mode::eager);
    xg::init::set_seed(11);
    SmallNet net;
    xg::nn::SoftmaxCrossEntropy loss({.sparse = true, .reduction = xg::Reduction::mean});
    xg::optim::Momentum opt(net.parameters(), 0.05f, 0.9f);
    xg::Model model(net, loss, opt, {{"Accuracy", xg::metrics::accuracy()}, {"Loss", xg::metrics::loss()}});
    model.train(5, data, {std::ref(recorded[graph])});  // 50 steps
    results[graph] = model.eval(data);
  }
  REQUIRE(recorded[0].losses.size() == 50);
  REQUIRE(recorded[1].losses.size() == 50);
  for (std::size_t i = 0; i < 50; ++i) {
    INFO("step " << i + 1);
    CHECK(recorded[1].losses[i] == doctest::Approx(recorded[0].losses[i]).epsilon(1e-4));
  }
  CHECK(recorded[0].losses.back() < 0.5f * recorded[0].losses.front());  // it learns
  CHECK(results[0]["Accuracy"] > 0.9);
  CHECK(results[1]["Accuracy"] == doctest::Approx(results[0]["Accuracy"]));
  CHECK(results[1]["Loss"] == doctest::Approx(results[0]["Loss"]).epsilon(1e-3));
  CHECK(recorded[0].epochs_begun == 5);
  CHECK(recorded[0].epochs_ended == 5);
  CHECK(recorded[0].train_begun == 1);
  CHECK(recorded[0].train_ended == 1);
}

TEST_CASE("Model: set_jit_config sets the level the train step compiles at; mode_scope nests") {
  xg::mode_scope graph(xg::Mode::graph);
  {
    xg::mode_scope eager(xg::Mode::eager);
    CHECK(xg::get_mode() == xg::Mode::eager);
  }
  CHECK(xg::get_mode() == xg::Mode::graph);
  const Batch batch = quadrant_batches(1, 8, 90).front();
  float first_loss[2] = {};
  std::size_t nodes[2] = {};
  for (int optimized = 0; optimized < 2; ++optimized) {
    xg::init::set_seed(13);
    SmallNet net;
    xg::nn::SoftmaxCrossEntropy loss({.sparse = true, .reduction = xg::Reduction::mean});
    xg::optim::SGD opt(net.parameters(), 0.1f);
    xg::Model model(net, loss, opt);
    model.train_step(batch.images, batch.labels);  // compiled at the default level, O2
    model.set_jit_config({.level = optimized ? xg::JitLevel::O2 : xg::JitLevel::O0, .name = "step"});
    nodes[optimized] = model.lower_train_step(batch.images, batch.labels).num_nodes();
    first_loss[optimized] = model.train_step(batch.images, batch.labels);
  }
  CHECK(nodes[0] > nodes[1]);  // O0 keeps every op; O2 fuses and folds
  CHECK(first_loss[0] == doctest::Approx(first_loss[1]).epsilon(1e-5));
}

TEST_CASE("Model: LossMonitor, TimeMonitor and fit print what MindSpore prints") {
  ModeGuard mode;
  xg::set_mode(xg::Mode::eager);
  const auto data = quadrant_batches(4, 8, 70);
  xg::init::set_seed(5);
  SmallNet net;
  xg::nn::SoftmaxCrossEntropy loss({.sparse = true, .reduction = xg::Reduction::mean});
  xg::optim::Momentum opt(net.parameters(), 0.05f, 0.9f);
  xg::Model model(net, loss, opt, {{"Accuracy", xg::metrics::accuracy()}});
  std::ostringstream out;
  LossRecorder recorded;
  model.fit(2, data, data,
            {xg::callbacks::LossMonitor(2, out), xg::callbacks::TimeMonitor(0, out), std::ref(recorded)});
  std::istringstream lines(out.str());
  std::vector<std::string> got;
  for (std::string line; std::getline(lines, line);) got.push_back(line);
  REQUIRE(got.size() == 8);  // per epoch: steps 2 and 4, the time line, the eval result
  CHECK(got[0].starts_with("epoch: 1 step: 2, loss is "));
  CHECK(std::stof(got[0].substr(got[0].rfind(' ') + 1)) == recorded.losses[1]);
  CHECK(got[1].starts_with("epoch: 1 step: 4, loss is "));
  CHECK(got[2].starts_with("Train epoch time: "));
  CHECK(got[2].find(" ms, per step time: ") != std::string::npos);
  CHECK(got[3].starts_with("Eval result: epoch 1, metrics: {'Accuracy': "));
  CHECK(got[4].starts_with("epoch: 2 step: 2, loss is "));
  CHECK(got[7].starts_with("Eval result: epoch 2, metrics: {'Accuracy': "));
  CHECK_THROWS_WITH_AS(model.train(0, data), doctest::Contains("epochs must be > 0, got 0"), xg::ValueError);
}

TEST_CASE("Model: a callback can stop training; CSVLogger writes a row per step") {
  ModeGuard mode;
  xg::set_mode(xg::Mode::eager);
  const auto data = quadrant_batches(4, 8, 90);
  SmallNet net;
  xg::nn::SoftmaxCrossEntropy loss({.sparse = true, .reduction = xg::Reduction::mean});
  xg::optim::SGD opt(net.parameters(), 0.01f);
  xg::Model model(net, loss, opt);
  struct StopAfter : xg::callbacks::Callback {
    void on_step_end(const xg::callbacks::RunContext& ctx) override { ctx.stop_training = ctx.step == 6; }
  };
  const auto csv = (std::filesystem::temp_directory_path() / "xgrad_test_log.csv").string();
  model.train(3, data, {StopAfter{}, xg::callbacks::CSVLogger(csv)});
  std::ifstream in(csv);
  std::vector<std::string> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(line);
  REQUIRE(rows.size() == 7);
  CHECK(rows[0] == "epoch,step,loss,step_ms");
  CHECK(rows[6].starts_with("2,6,"));
  std::filesystem::remove(csv);
  CHECK_THROWS_WITH_AS(model.eval(data), doctest::Contains("Model::eval: the model has no metrics"), xg::ValueError);
}

TEST_CASE("models: LeNet5 maps 32x32 images to 10 logits and trains the same in both modes") {
  ModeGuard mode;
  const auto images = xg::randn<float>({4, 1, 32, 32}, 21);
  const auto labels = xg::tensor<std::int32_t>({1, 7, 3, 9});
  float losses[2][3];
  for (int graph = 0; graph < 2; ++graph) {
    xg::set_mode(graph ? xg::Mode::graph : xg::Mode::eager);
    xg::init::set_seed(2);
    xg::models::LeNet5 net;
    CHECK(net(images).shape() == xg::Shape{4, 10});
    CHECK(net.named_parameters().size() == 8);  // two bias-free convs, three dense layers with bias
    xg::nn::SoftmaxCrossEntropy loss({.sparse = true, .reduction = xg::Reduction::mean});
    xg::optim::Momentum opt(net.parameters(), 0.01f, 0.9f);
    xg::Model model(net, loss, opt);
    for (auto& l : losses[graph]) l = model.train_step(images, labels);
  }
  for (int i = 0; i < 3; ++i) CHECK(losses[1][i] == doctest::Approx(losses[0][i]).epsilon(1e-5));
  CHECK(losses[0][0] == doctest::Approx(std::log(10.0)).epsilon(2e-2));  // small initial logits
}

TEST_CASE("callbacks: ModelCheckpoint saves every save_steps steps, keeps keep_max files, never overwrites") {
  ModeGuard mode;
  xg::set_mode(xg::Mode::eager);
  const auto data = quadrant_batches(3, 8, 60);
  xg::testing::TempDir dir;
  const auto ckpt_dir = dir.file("ckpt");
  xg::init::set_seed(4);
  SmallNet net;
  xg::nn::SoftmaxCrossEntropy loss({.sparse = true, .reduction = xg::Reduction::mean});
  xg::optim::Momentum opt(net.parameters(), 0.05f, 0.9f);
  xg::Model model(net, loss, opt);
  xg::callbacks::ModelCheckpoint saver("net", ckpt_dir, {.save_steps = 2, .keep_max = 2});
  model.train(2, data, {std::ref(saver)});  // steps 1..6: saves after 2, 4 and 6
  REQUIRE(saver.files().size() == 2);
  CHECK(saver.files()[0].ends_with("net-2_1.ckpt"));  // step 4 is epoch 2's first
  CHECK(saver.files()[1].ends_with("net-2_3.ckpt"));
  auto listing = xg::testing::TempDir::list(ckpt_dir);
  CHECK(listing == std::vector<std::string>{"net-2_1.ckpt", "net-2_3.ckpt"});
  // The last file holds the trained state, optimizer included.
  xg::init::set_seed(99);
  SmallNet fresh;
  xg::optim::Momentum fresh_opt(fresh.parameters(), 0.05f, 0.9f);
  xg::load_checkpoint(fresh, fresh_opt, saver.files().back());
  for (std::size_t i = 0; i < net.parameters().size(); ++i)
    CHECK(values(fresh.parameters()[i]) == values(net.parameters()[i]));
  // A second run with the same prefix writes net_1-*, leaving the first run's files alone.
  xg::callbacks::ModelCheckpoint again("net", ckpt_dir, {.save_steps = 3, .keep_max = 5});
  model.train(1, data, {std::ref(again)});
  REQUIRE(again.files().size() == 1);
  CHECK(again.files()[0].ends_with("net_1-1_3.ckpt"));
  CHECK(xg::testing::TempDir::list(ckpt_dir).size() == 3);
  CHECK_THROWS_WITH_AS(xg::callbacks::ModelCheckpoint("a/b"), doctest::Contains("must be a non-empty file name"),
                       xg::ValueError);
}

TEST_CASE("Model: a run resumed from a checkpoint continues exactly as the uninterrupted run") {
  ModeGuard mode;
  const auto data = quadrant_batches(4, 8, 120);
  xg::testing::TempDir dir;
  for (xg::Mode m : {xg::Mode::eager, xg::Mode::graph}) {
    CAPTURE(m == xg::Mode::graph);
    xg::set_mode(m);
    xg::nn::SoftmaxCrossEntropy loss({.sparse = true, .reduction = xg::Reduction::mean});
    // Uninterrupted: 4 steps, a checkpoint, 4 more. BatchNorm's statistics, Dropout's key and the
    // optimizer's moments all carry over.
    xg::init::set_seed(8);
    SmallNet net;
    xg::optim::Adam opt(net.parameters(), 0.01f);
    xg::Model model(net, loss, opt);
    for (const auto& b : data) model.train_step(b.images, b.labels);
    xg::save_checkpoint(net, opt, dir.file("mid.ckpt"));
    std::vector<float> after;
    for (const auto& b : data) after.push_back(model.train_step(b.images, b.labels));
    // Resumed: a network built from another seed, loaded, then the same 4 steps.
    xg::init::set_seed(9);
    SmallNet resumed;
    xg::optim::Adam resumed_opt(resumed.parameters(), 0.01f);
    xg::load_checkpoint(resumed, resumed_opt, dir.file("mid.ckpt"));
    xg::Model resumed_model(resumed, loss, resumed_opt);
    std::vector<float> again;
    for (const auto& b : data) again.push_back(resumed_model.train_step(b.images, b.labels));
    CHECK(again == after);
  }
}

TEST_CASE("nn: sample draws tokens by temperature and top-k") {
  const auto logits = xg::tensor<float>({1, 3, 2, 0, 0, 5, 5, 1}, {2, 4});
  std::mt19937_64 gen(1);
  // Temperature 0: the most likely token, the first on ties.
  CHECK(xg::nn::sample(logits, {.temperature = 0.0f}, gen).to_vector() == std::vector<std::int32_t>{1, 1});
  // top_k 1 at any temperature: the same.
  CHECK(xg::nn::sample(logits, {.temperature = 5.0f, .top_k = 1}, gen).to_vector() == std::vector<std::int32_t>{1, 1});
  // top_k 2: row 0 draws tokens 1 and 2 only, at rates e^1 : e^0 (temperature 1).
  std::vector<int> counts(4, 0);
  const auto row = xg::tensor<float>({1, 3, 2, 0}, {1, 4});
  for (int i = 0; i < 4000; ++i) ++counts[static_cast<std::size_t>(xg::nn::sample(row, {.top_k = 2}, gen).item())];
  CHECK(counts[0] == 0);
  CHECK(counts[3] == 0);
  const double share = counts[1] / 4000.0, expected = std::exp(1.0) / (std::exp(1.0) + 1.0);  // 0.731
  CHECK(std::abs(share - expected) < 0.03);  // 4.4 standard deviations of 4000 draws
  // Same seed, same draws.
  std::mt19937_64 a(7), b(7);
  CHECK(xg::nn::sample(logits, {}, a).to_vector() == xg::nn::sample(logits, {}, b).to_vector());
  CHECK_THROWS_AS(xg::nn::sample(logits, {.temperature = -1.0f}, gen), xg::ValueError);
  CHECK_THROWS_AS(xg::nn::sample(logits, {.top_k = -1}, gen), xg::ValueError);
  CHECK_THROWS_AS(xg::nn::sample(xg::ones<float>({4}), {}, gen), xg::ValueError);
  CHECK_THROWS_AS(xg::nn::sample(xg::tensor<float>({1, NAN}, {1, 2}), {}, gen), xg::ValueError);
}

TEST_CASE("models: CharTransformer's logits, loss, cache and errors") {
  xg::models::CharTransformer model({.vocab = 11, .context = 8, .width = 16, .heads = 2, .layers = 2});
  CHECK(model.blocks.size() == 2);
  CHECK(model.named_parameters().size() == 2 + 2 * 12 + 2 + 2);  // embeddings, blocks, norm, head
  const auto ids = xg::tensor<std::int32_t>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1}, {2, 6});
  const auto logits = model.logits(ids);
  CHECK(logits.shape() == xg::Shape{12, 11});
  // The loss is the mean cross-entropy of those logits against the targets.
  const auto targets = xg::tensor<std::int32_t>({2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1, 2}, {2, 6});
  CHECK(model.loss(ids, targets).item() ==
        doctest::Approx(xg::softmax_cross_entropy(logits, xg::reshape(targets, {12})).item()));
  // Position by position through the caches: the same logits.
  std::vector<xg::nn::KeyValueCache> caches(2);
  for (std::int32_t t = 0; t < 6; ++t) {
    const auto step = model.logits(xg::slice(ids, {0, t}, {2, 1}), t, &caches);
    for (std::int64_t row = 0; row < 2; ++row)
      check_values(xg::slice(step, {row, 0}, {1, 11}), values(xg::slice(logits, {row * 6 + t, 0}, {1, 11})), 1e-4);
  }
  // A few steps of Adam lower the loss.
  auto params = model.parameters();
  xg::optim::Adam adam(params, 1e-2f);
  const float first = model.loss(ids, targets).item();
  for (int s = 0; s < 20; ++s) {
    auto [loss, grads] = xg::value_and_grad([&] { return model.loss(ids, targets); }, params)();
    adam.step(grads);
  }
  CHECK(model.loss(ids, targets).item() < 0.5f * first);
  CHECK(xg::testing::contains(xg::testing::message_of<xg::ShapeError>([&] { model.logits(ids, 3); }),
                              "CharTransformer: ids must be [N, T] at positions first (3) to first + T <= 8"));
  std::vector<xg::nn::KeyValueCache> wrong(1);
  CHECK_THROWS_AS(model.logits(ids, 0, &wrong), xg::ValueError);
}
