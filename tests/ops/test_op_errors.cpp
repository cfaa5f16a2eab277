// Bad input to ops: every ShapeError / ValueError names the op, the inputs' shapes and the
// caller's file:line.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <xgrad/xgrad.hpp>

#include "test_support.hpp"

namespace xg = xgrad;
using xgrad::testing::here;
using xgrad::testing::message_of;

TEST_CASE("op errors: the seeds' BiasAdd mismatch names the op, both shapes and the call site") {
  auto x = xg::ones<float>({3, 32});
  auto w = xg::ones<float>({32, 8});
  auto b = xg::ones<float>({4});
  int line = 0;
  auto msg = message_of<xg::ShapeError>([&] {
    auto h = xg::matmul(x, w);
    line = __LINE__ + 1;
    xg::bias_add(h, b);
  });
  CHECK(msg.find("BiasAdd") != std::string::npos);
  CHECK(msg.find("Float32[3, 8]") != std::string::npos);
  CHECK(msg.find("Float32[4]") != std::string::npos);
  CHECK(msg.find(here(line)) != std::string::npos);
}

TEST_CASE("op errors: operators report the user's line") {
  auto a = xg::ones<float>({2, 3});
  auto b = xg::ones<float>({4});
  int line = __LINE__ + 1;
  auto msg = message_of<xg::ShapeError>([&] { return a * b; });
  CHECK(msg.find("Mul") != std::string::npos);
  CHECK(msg.find("[2, 3]") != std::string::npos);
  CHECK(msg.find("[4]") != std::string::npos);
  CHECK(msg.find(here(line)) != std::string::npos);
  line = __LINE__ + 1;
  msg = message_of<xg::ShapeError>([&] { return 1.0f - (a + b); });
  CHECK(msg.find("Add") != std::string::npos);
  CHECK(msg.find(here(line)) != std::string::npos);
  bool derived = std::is_base_of_v<std::invalid_argument, xg::ShapeError>;
  CHECK(derived);
}

TEST_CASE("op errors: matmul, conv2d, pooling, reductions and shape ops") {
  auto m23 = xg::ones<float>({2, 3});
  int line = __LINE__ + 1;
  auto msg = message_of<xg::ShapeError>([&] { return xg::matmul(m23, m23); });
  CHECK(msg.find("MatMul") != std::string::npos);
  CHECK(msg.find("3 vs 2") != std::string::npos);
  CHECK(msg.find(here(line)) != std::string::npos);
  CHECK_THROWS_AS(xg::matmul(xg::ones<float>({3}), m23), xg::ShapeError);
  CHECK_THROWS_AS(xg::matmul(xg::ones<float>({2, 2, 3}), xg::ones<float>({3, 3, 1})), xg::ShapeError);

  auto x = xg::ones<float>({1, 3, 8, 8});
  line = __LINE__ + 1;
  msg = message_of<xg::ShapeError>([&] { return xg::conv2d(x, xg::ones<float>({4, 2, 3, 3})); });
  CHECK(msg.find("Conv2D") != std::string::npos);
  CHECK(msg.find("Float32[4, 2, 3, 3]") != std::string::npos);
  CHECK(msg.find(here(line)) != std::string::npos);
  CHECK_THROWS_AS(xg::conv2d(x, xg::ones<float>({4, 3, 9, 9}), {.pad_mode = xg::PadMode::valid}), xg::ShapeError);
  CHECK_THROWS_AS(xg::conv2d(x, xg::ones<float>({4, 3, 3, 3}), {.stride = 0}), xg::ValueError);
  CHECK_THROWS_AS(xg::max_pool2d(m23, 2, 2), xg::ShapeError);
  CHECK_THROWS_AS(xg::max_pool2d(x, 9, 1), xg::ShapeError);

  line = __LINE__ + 1;
  msg = message_of<xg::ShapeError>([&] { return xg::sum(m23, {2}); });
  CHECK(msg.find("ReduceSum") != std::string::npos);
  CHECK(msg.find("axis 2") != std::string::npos);
  CHECK(msg.find(here(line)) != std::string::npos);
  CHECK_THROWS_AS(xg::sum(m23, {0, -2}), xg::ShapeError);  // the same axis twice
  CHECK_THROWS_AS(xg::max(xg::zeros<float>({0, 3}), {0}), xg::ShapeError);
  CHECK_THROWS_AS(xg::argmax(xg::zeros<float>({2, 0}), 1), xg::ShapeError);

  CHECK_THROWS_AS(xg::transpose(m23, {0, 0}), xg::ShapeError);
  CHECK_THROWS_AS(xg::transpose(m23, {1, 0, 2}), xg::ShapeError);
  CHECK_THROWS_AS(xg::broadcast_to(m23, {3, 3}), xg::ShapeError);
  CHECK_THROWS_AS(xg::squeeze(m23, {0}), xg::ShapeError);
  CHECK_THROWS_AS(xg::slice(m23, {1, 0}, {2, 3}), xg::ShapeError);
  CHECK_THROWS_AS(xg::slice(m23, {0}, {1}), xg::ShapeError);
  CHECK_THROWS_AS(xg::concat(std::vector<xg::Tensor<float>>{m23, xg::ones<float>({3, 3})}, 1), xg::ShapeError);
  CHECK_THROWS_AS(xg::stack(std::vector<xg::Tensor<float>>{m23, xg::ones<float>({3, 2})}), xg::ShapeError);
  CHECK_THROWS_AS(xg::where(xg::ones<float>({2}) > 0.0f, m23, m23), xg::ShapeError);
  CHECK_THROWS_AS(xg::fma(m23, xg::ones<float>({4}), m23), xg::ShapeError);
}

TEST_CASE("op errors: losses and value errors") {
  auto logits = xg::zeros<float>({2, 3});
  auto labels = xg::tensor<std::int32_t>({0, 3});
  int line = __LINE__ + 1;
  auto msg = message_of<xg::ValueError>([&] { return xg::softmax_cross_entropy(logits, labels); });
  CHECK(msg.find("label 3") != std::string::npos);
  CHECK(msg.find(here(line)) != std::string::npos);
  CHECK_THROWS_AS(xg::softmax_cross_entropy(logits, xg::tensor<std::int32_t>({0, 1, 2})), xg::ShapeError);
  CHECK_THROWS_AS(xg::clip(logits, 1.0f, -1.0f), xg::ValueError);
  CHECK_THROWS_AS(xg::resize_bilinear(xg::zeros<float>({1, 1, 2, 2}), 0, 3), xg::ValueError);
  CHECK(message_of<xg::ShapeError>([] {
          return xg::random_uniform<float>(xg::tensor<std::int64_t>({1, 2}), {3});
        }).find("RandomUniform: key must hold one value, got shape [2]") != std::string::npos);
  CHECK_THROWS_AS(xg::random_uniform<float>(xg::scalar<std::int64_t>(1), {-1}), xg::ValueError);
}

TEST_CASE("op errors: take refuses indices outside the axis, eagerly and compiled, and names them") {
  const auto x = xg::ones<float>({4, 3});
  const auto bad = xg::tensor<std::int32_t>({1, 4, 0});
  int line = __LINE__ + 1;
  auto msg = message_of<xg::ValueError>([&] { return xg::take(x, bad); });
  CHECK(msg.find("Take") != std::string::npos);
  CHECK(msg.find("index 4 at position 1") != std::string::npos);
  CHECK(msg.find("[0, 4)") != std::string::npos);
  CHECK(msg.find(here(line)) != std::string::npos);
  CHECK(message_of<xg::ValueError>([&] {
          return xg::take(x, xg::tensor<std::int32_t>({-1}), 1);
        }).find("index -1 at position 0") != std::string::npos);
  // Compiled: the same check runs on each call's indices, not only the traced ones.
  auto f = xg::jit([](const xg::Tensor<float>& t, const xg::Tensor<std::int32_t>& i) { return xg::take(t, i); });
  CHECK(f(x, xg::tensor<std::int32_t>({3, 0})).shape() == xg::Shape{2, 3});
  CHECK(message_of<xg::ValueError>([&] { return f(x, bad); }).find("index 4 at position 1") != std::string::npos);
  // The axis, a scalar x, and a gradient of the wrong shape.
  CHECK(message_of<xg::ShapeError>([&] { return xg::take(x, bad, 2); }).find("Take") != std::string::npos);
  CHECK(message_of<xg::ShapeError>([] {
          return xg::take(xg::scalar<float>(1), xg::tensor<std::int32_t>({0}));
        }).find("scalar") != std::string::npos);
  CHECK(message_of<xg::ShapeError>([&] {
          return xg::take_backward(xg::ones<float>({2, 3}), bad, x.shape(), 0);
        }).find("TakeGrad: the gradient Float32[2, 3] must have the shape") != std::string::npos);
}

TEST_CASE("op errors: cumsum, split, tril, triu and masked_fill name the op and the shapes") {
  const auto x = xg::ones<float>({2, 3});
  CHECK(message_of<xg::ShapeError>([] { return xg::cumsum(xg::scalar<float>(1), 0); }).find("CumSum") !=
        std::string::npos);
  CHECK(message_of<xg::ShapeError>([&] { return xg::cumsum(x, 2); }).find("CumSum") != std::string::npos);
  auto msg = message_of<xg::ShapeError>([&] { return xg::split(x, {1, 1}, 1); });
  CHECK(msg.find("Split: sizes [1, 1] must be non-negative and add up to 3") != std::string::npos);
  CHECK(message_of<xg::ShapeError>([&] { return xg::split(x, {4, -1}, 1); }).find("Split") != std::string::npos);
  CHECK(message_of<xg::ShapeError>([&] { return xg::split(x, {-1, 4}, 1); }).find("Split") != std::string::npos);
  CHECK(message_of<xg::ShapeError>([&] {
          return xg::split(x, {2, std::numeric_limits<std::int64_t>::max() - 1}, 1);
        }).find("Split") != std::string::npos);
  CHECK(message_of<xg::ShapeError>([] { return xg::tril(xg::ones<float>({3})); }).find("Tril") != std::string::npos);
  CHECK(message_of<xg::ShapeError>([] { return xg::triu(xg::ones<float>({3})); }).find("Triu") != std::string::npos);
  const auto mask = xg::tensor<bool>({true, false}, {2, 1, 1});
  int line = __LINE__ + 1;
  msg = message_of<xg::ShapeError>([&] { return xg::masked_fill(x, mask, 0.0f); });
  CHECK(msg.find("MaskedFill") != std::string::npos);
  CHECK(msg.find("[2, 1, 1]") != std::string::npos);
  CHECK(msg.find(here(line)) != std::string::npos);
}

TEST_CASE("op errors: scaled_dot_product_attention names the op, what it expected and the shapes") {
  const auto q = xg::ones<float>({2, 3, 4}), k = xg::ones<float>({2, 5, 4}), v = xg::ones<float>({2, 5, 6});
  CHECK(xg::scaled_dot_product_attention(q, k, v).shape() == xg::Shape{2, 3, 6});
  const auto narrow = xg::ones<float>({2, 5, 3});
  int line = __LINE__ + 1;
  auto msg = message_of<xg::ShapeError>([&] { return xg::scaled_dot_product_attention(q, narrow, v); });
  CHECK(msg.find("ScaledDotProductAttention: k's last axis must equal q's (4)") != std::string::npos);
  CHECK(msg.find("k: Float32[2, 5, 3]") != std::string::npos);
  CHECK(msg.find(here(line)) != std::string::npos);
  CHECK(message_of<xg::ShapeError>([&] {
          return xg::scaled_dot_product_attention(q, k, xg::ones<float>({2, 4, 6}));
        }).find("v must have one row per key") != std::string::npos);
  CHECK(message_of<xg::ShapeError>([&] {
          return xg::scaled_dot_product_attention(q, xg::ones<float>({3, 5, 4}), v);
        }).find("same leading (batch) axes; axis 0 differs") != std::string::npos);
  CHECK(message_of<xg::ShapeError>([&] {
          return xg::scaled_dot_product_attention(xg::ones<float>({4}), k, v);
        }).find("at least 2") != std::string::npos);
  CHECK(message_of<xg::ValueError>([&] {
          return xg::scaled_dot_product_attention(q, k, v, {.scale = std::numeric_limits<double>::infinity()});
        }).find("scale must be finite, got inf") != std::string::npos);
  // A shape error while tracing names the op in the trace's report too.
  auto f = xg::jit(
      [](const xg::Tensor<float>& a, const xg::Tensor<float>& b) { return xg::scaled_dot_product_attention(a, b, b); });
  CHECK(message_of<xg::ShapeError>([&] {
          return f(q, xg::ones<float>({2, 5, 3}));
        }).find("ScaledDotProductAttention") != std::string::npos);
}
