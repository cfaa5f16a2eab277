// scaled_dot_product_attention beyond the op table: values a reader can check by hand, the
// blocked kernel against the naive softmax(q k^T / sqrt(d)) v at double for short and long
// sequences with and without the causal mask, and its gradients against autodiff through that
// naive composite.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include <xgrad/xgrad.hpp>

namespace xg = xgrad;

namespace {

/// The naive form, made of matmul, softmax and where: the [tq, tk] scores in full.
xg::Tensor<double> naive_attention(const xg::Tensor<double>& q, const xg::Tensor<double>& k,
                                   const xg::Tensor<double>& v, bool causal) {
  const std::int64_t tq = q.shape()[q.ndim() - 2], tk = k.shape()[k.ndim() - 2];
  auto scores = xg::matmul(q, k, false, true) * (1 / std::sqrt(static_cast<double>(q.shape()[q.ndim() - 1])));
  if (!causal) return xg::matmul(xg::softmax(scores, -1), v);
  // Query i sees key j when j <= i + tk - tq.
  const auto offset = xg::arange<std::int64_t>(tk) - xg::reshape(xg::arange<std::int64_t>(tq), {tq, 1});
  const auto keep = xg::less(offset, tk - tq + 1);
  const auto p = xg::where(keep, xg::softmax(xg::where(keep, scores, -1e300), -1), 0.0);
  return xg::matmul(p, v);
}

double max_difference(const xg::Tensor<double>& a, const xg::Tensor<double>& b) {
  REQUIRE(a.shape() == b.shape());
  const auto x = a.to_vector(), y = b.to_vector();
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

struct Case {
  std::int64_t batch, tq, tk, d, dv;
};

// Around the cpu kernel's 64 x 64 blocks, and well past them.
const std::array<Case, 7> k_cases{{{2, 1, 1, 4, 4},
                                   {1, 63, 64, 8, 8},
                                   {2, 65, 65, 16, 8},
                                   {1, 1, 200, 8, 8},
                                   {1, 200, 130, 4, 12},
                                   {1, 257, 257, 32, 32},
                                   {1, 517, 517, 8, 8}}};

}  // namespace

TEST_CASE("attention: values a reader can check") {
  const auto v = xg::tensor<double>({1, 2, 3, 4, 5, 6}, {3, 2});
  SUBCASE("queries orthogonal to every key weigh the keys alike: the mean of v") {
    const auto q = xg::zeros<double>({4, 2});
    const auto k = xg::tensor<double>({1, 0, 0, 1, 1, 1}, {3, 2});
    const auto out = xg::scaled_dot_product_attention(q, k, v).to_vector();
    for (std::int64_t i = 0; i < 4; ++i) {
      CHECK(out[static_cast<std::size_t>(2 * i)] == doctest::Approx(3.0));
      CHECK(out[static_cast<std::size_t>(2 * i + 1)] == doctest::Approx(4.0));
    }
  }
  SUBCASE("causal: the first query sees the first key only, the last sees all") {
    const auto q = xg::zeros<double>({3, 2});
    const auto out = xg::scaled_dot_product_attention(q, xg::zeros<double>({3, 2}), v, {.causal = true}).to_vector();
    CHECK(out == std::vector<double>{1, 2, 2, 3, 3, 4});
  }
  SUBCASE("causal with more queries than keys: the first queries see none and get zeros") {
    const auto q = xg::ones<double>({5, 2});
    const auto out = xg::scaled_dot_product_attention(q, xg::zeros<double>({3, 2}), v, {.causal = true}).to_vector();
    CHECK(out == std::vector<double>{0, 0, 0, 0, 1, 2, 2, 3, 3, 4});
  }
  SUBCASE("two keys: the weights are a logistic function of the score difference") {
    // q . k0 = 0, q . k1 = 2 * scale: weight of key 1 = 1 / (1 + exp(-2 * scale)).
    const auto q = xg::tensor<double>({1, 1}, {1, 2});
    const auto k = xg::tensor<double>({1, -1, 1, 1}, {2, 2});
    const auto vv = xg::tensor<double>({0, 10}, {2, 1});
    const double scale = 0.5;
    const double w1 = 1 / (1 + std::exp(-2 * scale));
    CHECK(xg::scaled_dot_product_attention(q, k, vv, {.scale = scale}).item() == doctest::Approx(10 * w1));
  }
}

TEST_CASE("attention: the blocked kernel equals the naive form at double, short and long, with and without the mask") {
  for (const Case& c : k_cases)
    for (bool causal : {false, true}) {
      CAPTURE(c.batch);
      CAPTURE(c.tq);
      CAPTURE(c.tk);
      CAPTURE(causal);
      const auto seed = static_cast<std::uint64_t>(c.tq * 1000 + c.tk);
      const auto q = xg::randn<double>({c.batch, c.tq, c.d}, seed),
                 k = xg::randn<double>({c.batch, c.tk, c.d}, seed + 1);
      const auto v = xg::randn<double>({c.batch, c.tk, c.dv}, seed + 2);
      CHECK(max_difference(xg::scaled_dot_product_attention(q, k, v, {.causal = causal}),
                           naive_attention(q, k, v, causal)) < 1e-12);
    }
}

TEST_CASE("attention: gradients equal autodiff through the naive form at double") {
  for (const Case& c : k_cases)
    for (bool causal : {false, true}) {
      CAPTURE(c.tq);
      CAPTURE(c.tk);
      CAPTURE(causal);
      const auto seed = static_cast<std::uint64_t>(c.tq * 7 + c.tk);
      std::vector<xg::Tensor<double>> in{xg::randn<double>({c.batch, c.tq, c.d}, seed).set_requires_grad(true),
                                         xg::randn<double>({c.batch, c.tk, c.d}, seed + 1).set_requires_grad(true),
                                         xg::randn<double>({c.batch, c.tk, c.dv}, seed + 2).set_requires_grad(true)};
      const auto w = xg::randn<double>({c.batch, c.tq, c.dv}, seed + 3);
      const auto fused = xg::value_and_grad(
          [&] { return xg::sum(xg::scaled_dot_product_attention(in[0], in[1], in[2], {.causal = causal}) * w); }, in)();
      const auto naive =
          xg::value_and_grad([&] { return xg::sum(naive_attention(in[0], in[1], in[2], causal) * w); }, in)();
      CHECK(std::abs(fused.first.item() - naive.first.item()) < 1e-10);
      for (std::size_t i = 0; i < 3; ++i) {
        CAPTURE(i);
        CHECK(max_difference(fused.second[i], naive.second[i]) < 1e-11);
      }
    }
}

TEST_CASE("thrust: attention in blocks of scores equals the naive form at double, with its gradients") {
  // The device computes a block of scores at a time (thrust/attention.hpp: at most 2^22): every
  // query of up to 4 items of 1024 x 1024 (6 items: blocks of 4 and 2), or one query row at a
  // time of an item with 2.2 million keys, whose dk and dv then add up over two blocks.
  if constexpr (xg::thrust_available()) {
    std::vector<Case> cases(k_cases.begin(), k_cases.end());
    cases.push_back({6, 1024, 1024, 4, 2});
    cases.push_back({1, 2, 2'200'000, 2, 3});
    for (const Case& c : cases)
      for (bool causal : {false, true}) {
        CAPTURE(c.batch);
        CAPTURE(c.tq);
        CAPTURE(c.tk);
        CAPTURE(causal);
        const auto seed = static_cast<std::uint64_t>(c.tq * 31 + c.tk);
        const std::vector<xg::Tensor<double>> in{xg::randn<double>({c.batch, c.tq, c.d}, seed),
                                                 xg::randn<double>({c.batch, c.tk, c.d}, seed + 1),
                                                 xg::randn<double>({c.batch, c.tk, c.dv}, seed + 2)};
        const auto w = xg::randn<double>({c.batch, c.tq, c.dv}, seed + 3);
        const auto on_device = [](const xg::Tensor<double>& x) { return x.to(xg::Device::thrust); };
        const auto out =
            xg::scaled_dot_product_attention(on_device(in[0]), on_device(in[1]), on_device(in[2]), {.causal = causal});
        CHECK(out.device() == xg::Device::thrust);
        CHECK(max_difference(out.to(xg::Device::cpu), naive_attention(in[0], in[1], in[2], causal)) < 1e-12);
        const auto want =
            xg::grad([&](const xg::Tensor<double>& q, const xg::Tensor<double>& k,
                         const xg::Tensor<double>& v) { return xg::sum(naive_attention(q, k, v, causal) * w); },
                     xg::argnums<0, 1, 2>)(in[0], in[1], in[2]);
        const auto w_device = on_device(w);
        const auto got = xg::grad(
            [&](const xg::Tensor<double>& q, const xg::Tensor<double>& k, const xg::Tensor<double>& v) {
              return xg::sum(xg::scaled_dot_product_attention(q, k, v, {.causal = causal}) * w_device);
            },
            xg::argnums<0, 1, 2>)(on_device(in[0]), on_device(in[1]), on_device(in[2]));
        CHECK(max_difference(std::get<0>(got).to(xg::Device::cpu), std::get<0>(want)) < 1e-11);
        CHECK(max_difference(std::get<1>(got).to(xg::Device::cpu), std::get<1>(want)) < 1e-11);
        CHECK(max_difference(std::get<2>(got).to(xg::Device::cpu), std::get<2>(want)) < 1e-11);
      }
  }
}

TEST_CASE("attention: the eager gradient, from the log-denominators its forward kept, has the compiled one's bits") {
  // Eagerly the recorded forward keeps each query's log-denominator for its gradient; compiled at
  // O0 the gradient works them out again, at O2 the pair of ops passes them along (JIT.md). The
  // three must agree bit for bit, in the blocks of T = 600.
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    const auto q = xg::randn<float>({2, 600, 16}, 1), k = xg::randn<float>({2, 600, 16}, 2),
               v = xg::randn<float>({2, 600, 8}, 3), w = xg::randn<float>({2, 600, 8}, 4);
    const auto gradients = xg::grad(
        [&](const xg::Tensor<float>& a, const xg::Tensor<float>& b, const xg::Tensor<float>& c) {
          return xg::sum(xg::scaled_dot_product_attention(a, b, c, {.causal = causal}) * w);
        },
        xg::argnums<0, 1, 2>);
    const auto eager = gradients(q, k, v);
    for (const xg::JitLevel level : {xg::JitLevel::O0, xg::JitLevel::O2}) {
      CAPTURE(static_cast<int>(level));
      const auto compiled = xg::jit(gradients, {.level = level, .strict = true})(q, k, v);
      CHECK(std::get<0>(compiled).to_vector() == std::get<0>(eager).to_vector());
      CHECK(std::get<1>(compiled).to_vector() == std::get<1>(eager).to_vector());
      CHECK(std::get<2>(compiled).to_vector() == std::get<2>(eager).to_vector());
    }
  }
}

TEST_CASE("attention: heads of size 0 (d or dv) give empty or zero results, with their gradients") {
  // The products of a block with v (or of ds with k) have no columns then (found by the fuzzer).
  for (const bool causal : {false, true}) {
    CAPTURE(causal);
    const auto q = xg::randn<float>({2, 5, 3}, 1), k = xg::randn<float>({2, 5, 3}, 2);
    const auto no_values = xg::zeros<float>({2, 5, 0});
    CHECK(xg::scaled_dot_product_attention(q, k, no_values, {.causal = causal}).shape() == xg::Shape{2, 5, 0});
    // d = 0: every score is 0, so each query averages the values it sees.
    const auto empty = xg::zeros<float>({2, 5, 0});
    const auto v = xg::randn<float>({2, 5, 2}, 3);
    const auto out = xg::scaled_dot_product_attention(empty, empty, v, {.causal = causal}).to_vector();
    const auto values = v.to_vector();
    for (std::int64_t i = 0; i < 5; ++i) {
      const std::int64_t seen = causal ? i + 1 : 5;
      double mean = 0;
      for (std::int64_t j = 0; j < seen; ++j) mean += values[(5 + j) * 2 + 1];
      CHECK(out[(5 + i) * 2 + 1] == doctest::Approx(mean / seen).epsilon(1e-6));
    }
    const auto grads = xg::grad(
        [&](const xg::Tensor<float>& a, const xg::Tensor<float>& b, const xg::Tensor<float>& c) {
          return xg::sum(xg::scaled_dot_product_attention(a, b, c, {.causal = causal}));
        },
        xg::argnums<0, 1, 2>)(empty, empty, v);
    CHECK(std::get<0>(grads).shape() == xg::Shape{2, 5, 0});
    CHECK(std::get<1>(grads).shape() == xg::Shape{2, 5, 0});
    // d(sum of the means)/dv_j: the sum over the queries that see key j of 1 / (keys they see).
    for (std::int64_t j = 0; j < 5; ++j) {
      double want = 0;
      for (std::int64_t i = causal ? j : 0; i < 5; ++i) want += 1.0 / (causal ? i + 1 : 5);
      CHECK(std::get<2>(grads).to_vector()[j * 2] == doctest::Approx(want).epsilon(1e-6));
    }
  }
}

TEST_CASE("attention: the fused gradient is one op, and the second derivative comes from the composite") {
  auto q = xg::randn<double>({2, 5, 4}, 1).set_requires_grad(true);
  const auto k = xg::randn<double>({2, 6, 4}, 2), v = xg::randn<double>({2, 6, 3}, 3);
  auto loss = [&](const xg::Tensor<double>& x) {
    return xg::sum(xg::square(xg::scaled_dot_product_attention(x, k, v)));
  };
  auto naive_loss = [&](const xg::Tensor<double>& x) { return xg::sum(xg::square(naive_attention(x, k, v, false))); };
  auto second = [](auto f) {
    return [f](const xg::Tensor<double>& x) { return xg::sum(xg::grad(f)(x) * xg::grad(f)(x)); };
  };
  CHECK(max_difference(xg::grad(second(loss))(q), xg::grad(second(naive_loss))(q)) < 1e-10);
  // A first gradient under jit: the graph holds the fused gradient op (reading the forward's
  // log-denominators), no softmax.
  const auto lowered = xg::jit(xg::grad(loss)).lower(q);
  const auto& graph = lowered.graph();
  bool fused = false, softmax_parts = false;
  for (const auto& node : graph.nodes) {
    fused = fused || node->op() == "ScaledDotProductAttentionGradWithLse";
    softmax_parts = softmax_parts || node->op() == "Exp";
  }
  CHECK(fused);
  CHECK_FALSE(softmax_parts);
}

TEST_CASE("attention: special scores and values, in the cpu kernel's blocks") {
  // 70 keys whose scores are -inf (a whole 64-key block of them first), then 30 finite ones.
  const std::int64_t tk = 100;
  std::vector<double> keys(static_cast<std::size_t>(tk), 1.0);
  std::fill_n(keys.begin(), 70, -std::numeric_limits<double>::infinity());
  const auto q = xg::ones<double>({2, 1});
  const auto k = xg::tensor<double>(keys, {tk, 1});
  const auto v = xg::arange<double>(tk) * 1.0;
  const auto vv = xg::reshape(v, {tk, 1});
  SUBCASE("-inf scores weigh nothing, even a whole block of them") {
    // The finite keys tie: the mean of values 70..99.
    const auto out = xg::scaled_dot_product_attention(q, k, vv).to_vector();
    CHECK(out[0] == doctest::Approx(84.5));
    CHECK(out[1] == doctest::Approx(84.5));
  }
  SUBCASE("a query whose every score is -inf gets NaN, as softmax gives") {
    const auto out = xg::scaled_dot_product_attention(q, xg::slice(k, {0, 0}, {70, 1}), xg::slice(vv, {0, 0}, {70, 1}));
    CHECK(std::isnan(out.to_vector()[0]));
  }
  SUBCASE("a key hidden by the causal mask does not reach a query, even holding inf") {
    auto values = v.to_vector();
    values[1] = std::numeric_limits<double>::infinity();
    const auto out = xg::scaled_dot_product_attention(xg::zeros<double>({tk, 1}), xg::zeros<double>({tk, 1}),
                                                      xg::tensor<double>(values, {tk, 1}), {.causal = true})
                         .to_vector();
    CHECK(out[0] == 0.0);  // sees key 0 only
    CHECK(std::isinf(out[1]));
    CHECK(std::isinf(out[tk - 1]));
  }
}
