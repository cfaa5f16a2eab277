// Inputs the fuzz targets (tests/fuzz, docs/FUZZING.md) found crashing or undefined, each kept
// as a test: the fix must hold in every build, not only while fuzzing.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <xgrad/xgrad.hpp>

#include "test_support.hpp"

namespace xg = xgrad;
using xgrad::testing::contains;
using xgrad::testing::message_of;

TEST_CASE("fuzz regression: a scalar has no axis 0 to reduce, normalize or concatenate along") {
  const auto s = xg::scalar<float>(1.0f);
  CHECK_THROWS_AS(xg::sum(s, {0}), xg::ShapeError);
  CHECK_THROWS_AS(xg::mean(s, {0}), xg::ShapeError);
  CHECK_THROWS_AS(xg::max(s, {0}), xg::ShapeError);
  CHECK_THROWS_AS(xg::min(s, {0}), xg::ShapeError);
  CHECK_THROWS_AS(xg::softmax(s, 0), xg::ShapeError);
  CHECK_THROWS_AS(xg::log_softmax(s, 0), xg::ShapeError);
  CHECK_THROWS_AS(xg::squeeze(s, {0}), xg::ShapeError);
  CHECK_THROWS_AS(xg::concat<float>({s, s}, 0), xg::ShapeError);
  // Reducing over every axis of a scalar (no axes given) is still the scalar; argmax of one is 0.
  CHECK(xg::argmax(s).item() == 0);
  CHECK(xg::sum(s).item() == 1.0f);
  CHECK(xg::stack<float>({s, s}, 0).shape() == xg::Shape{2});
}

TEST_CASE("fuzz regression: slice_backward checks that the gradient fits inside the input") {
  CHECK_THROWS_AS(xg::slice_backward(xg::ones<float>({2}), xg::Shape{3}, {}), xg::ShapeError);
  const auto what = message_of<xg::ShapeError>([] { xg::slice_backward(xg::ones<float>({4}), xg::Shape{2}, {0}); });
  CHECK(contains(what, "SliceGrad"));
  CHECK_THROWS_AS(xg::slice_backward(xg::ones<float>({2}), xg::Shape{3}, {2}), xg::ShapeError);
  CHECK_THROWS_AS(xg::slice_backward(xg::ones<float>({2}), xg::Shape{3}, {-1}), xg::ShapeError);
  CHECK(xg::slice_backward(xg::ones<float>({2}), xg::Shape{3}, {1}).to_vector() == std::vector<float>{0, 1, 1});
}

TEST_CASE("fuzz regression: slice_backward checks the input shape's size before its strides") {
  // An empty input shape whose non-zero extents multiply past int64: its strides would overflow.
  const auto what = message_of<xg::ValueError>([] {
    xg::slice_backward(xg::zeros<float>({0, 1, 1}), xg::Shape{0, 4198819178854351296, 6}, {0, 0, 0});
  });
  CHECK(contains(what, "SliceGrad"));
}

TEST_CASE("fuzz regression: double exp, tanh, sigmoid and pow are defined for huge and NaN inputs") {
  // Sixteen lanes, so the batch code runs whatever the SIMD width.
  constexpr double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  auto repeat = [](std::vector<double> v) {
    std::vector<double> out;
    while (out.size() < 16) out.insert(out.end(), v.begin(), v.end());
    return xg::tensor<double>(out);
  };
  auto check = [](const xg::Tensor<double>& got, std::vector<double> want) {
    const auto v = got.to_vector();
    for (std::size_t i = 0; i < v.size(); ++i) {
      const double w = want[i % want.size()];
      CAPTURE(i);
      if (std::isnan(w))
        CHECK(std::isnan(v[i]));
      else
        CHECK(v[i] == w);
    }
  };
  check(xg::exp(repeat({-1e30, 1e30, nan, 0.0})), {0.0, inf, nan, 1.0});
  check(xg::tanh(repeat({1e277, -1e277, nan, 0.0})), {1.0, -1.0, nan, 0.0});
  check(xg::sigmoid(repeat({6e71, -6e71, nan, 0.0})), {1.0, 0.0, nan, 0.5});
  check(xg::pow(repeat({1e300, 0.5, -2.0, 2.0}), repeat({1e300, 1e300, inf, -1e300})), {inf, 0.0, inf, 0.0});
  check(xg::pow(repeat({nan, 2.0, -8.0, 1.0}), repeat({2.0, nan, 1.0 / 3.0, 7.0})), {nan, nan, nan, 1.0});
}

TEST_CASE("fuzz regression: reducing an empty tensor over a huge axis returns at once") {
  const std::int64_t huge = std::int64_t{1} << 40;
  const auto x = xg::zeros<std::int32_t>({huge, 0});
  CHECK(xg::sum(x, {0}).shape() == xg::Shape{0});
  CHECK(xg::max(xg::zeros<float>({huge, 0}), {0}, true).shape() == xg::Shape{1, 0});
  CHECK(xg::sum(xg::zeros<float>({0, 3}), {0}).to_vector() == std::vector<float>{0, 0, 0});
}

TEST_CASE("fuzz regression: a broadcasting op with an empty output walks no rows") {
  // [2^40, 0] broadcast against [1, 1]: no elements, but 2^40 outer rows of none each.
  const std::int64_t huge = std::int64_t{1} << 40;
  const auto c = xg::zeros<bool>({huge, 0});
  const auto a = xg::ones<float>({huge, 0}), b = xg::ones<float>({1, 1});
  CHECK(xg::where(c, a, b).shape() == xg::Shape{huge, 0});
  CHECK(xg::add(a, b).shape() == xg::Shape{huge, 0});
  CHECK(xg::fma(a, b, b).shape() == xg::Shape{huge, 0});
  CHECK(xg::jit([](const xg::Tensor<float>& x, const xg::Tensor<float>& y) { return x * y + y; })(a, b).numel() == 0);
}

TEST_CASE("fuzz regression: a matmul with an empty output multiplies no matrices") {
  // 2^40 products of matrices without rows (fuzz_ops' regress-matmul-empty-huge-batch).
  const std::int64_t huge = std::int64_t{1} << 40;
  const auto a = xg::ones<float>({huge, 0, 4}), b = xg::ones<float>({4, 3});
  CHECK(xg::matmul(a, b).shape() == xg::Shape{huge, 0, 3});
  // A sum over nothing is zero.
  CHECK(xg::matmul(xg::ones<float>({2, 3, 0}), xg::ones<float>({0, 5})).to_vector() == std::vector<float>(30, 0.0f));
}

TEST_CASE("fuzz regression: cumsum, take, slice and its gradient with an empty result touch no data") {
  // cumsum over 2^40 empty columns (a fuzz_ops timeout), and a slice gradient whose begin lies
  // 2^62 elements into an empty tensor (regress-slice-backward-empty-far-begin: the offset
  // overflowed the pointer).
  const std::int64_t huge = std::int64_t{1} << 40, far = std::int64_t{1} << 62;
  CHECK(xg::cumsum(xg::ones<float>({huge, 0}), 0).shape() == xg::Shape{huge, 0});
  CHECK(xg::take(xg::ones<float>({huge, 2, 0}), xg::tensor<std::int32_t>({1, 0, 1}), 1).shape() ==
        xg::Shape{huge, 3, 0});
  CHECK(xg::slice_backward(xg::zeros<std::int64_t>({0, 0}), xg::Shape{0, far}, {0, far}).shape() == xg::Shape{0, far});
  CHECK(xg::slice(xg::zeros<std::int64_t>({0, far}), {0, far}, {0, 0}).numel() == 0);
  // split's sizes add up without overflowing (UBSan under fuzz_ops).
  CHECK_THROWS_AS(xg::split(xg::ones<float>({3}), {2, std::numeric_limits<std::int64_t>::max() - 1}), xg::ShapeError);
}

TEST_CASE("fuzz regression: sampling no rows, and position tables of no or wide extent, allocate nothing extra") {
  // regress-sample-no-rows-huge-vocab: logits [0, 2^40] have no row to draw for.
  std::mt19937_64 gen(1);
  CHECK(xg::nn::sample(xg::zeros<float>({0, std::int64_t{1} << 40}), {}, gen).shape() == xg::Shape{0});
  // regress-sinusoidal-positions-wide: no scratch the size of a row; an empty table at once.
  CHECK(xg::nn::sinusoidal_positions(0, std::int64_t{1} << 40).shape() == xg::Shape{0, std::int64_t{1} << 40});
  const auto wide = xg::nn::sinusoidal_positions(2, 1 << 16).to_vector();
  CHECK(wide[1] == 1.0f);  // cos 0
  CHECK(wide[(1 << 16) + 0] == doctest::Approx(std::sin(1.0)));
  // regress-lstm-empty-input-far-steps is a fuzz-harness bound (a loop of 2^31 empty steps is
  // slow, not wrong): fuzz_ops_nn.cpp's few_steps.
}

TEST_CASE("fuzz regression: attention refuses operands whose gradient row cannot be counted, batch or none") {
  // No batch item, but rows of 2^61 elements: the gradient's row, tq * d + tk * (d + dv) with
  // two keys, would overflow (fuzz_ops' regress-attention-no-items-huge-rows).
  const std::int64_t huge = std::int64_t{1} << 61;
  const auto q = xg::zeros<float>({0, 1, huge}), k = xg::zeros<float>({0, 2, huge}), v = xg::zeros<float>({0, 2, huge});
  const auto msg = message_of<xg::ValueError>([&] { xg::scaled_dot_product_attention(q, k, v); });
  CHECK(contains(msg, "ScaledDotProductAttention"));
  CHECK(contains(msg, "the gradient's row"));
  // Rows that fit are fine with no items, and so is their gradient, even 2^62 empty rows
  // (regress-attention-empty-rows-far-apart: the gradient's parts began at (tq + tk) d).
  for (const std::int64_t rows : {std::int64_t{3}, std::int64_t{1} << 62}) {
    const auto small = xg::zeros<float>({0, rows, 0}).set_requires_grad(true);
    xg::sum(xg::scaled_dot_product_attention(small, small, small)).backward();
    CHECK(small.grad().shape() == xg::Shape{0, rows, 0});
  }
}

TEST_CASE("fuzz regression: a convolution making one output row takes any stride") {
  // A stride of 2^62 over 3 x 3 images: one output row and column, whatever the stride
  // (fuzz_ops' regress-conv2d-huge-stride-one-row); the kernels stepped rows by stride * width.
  const auto x = xg::reshape(xg::arange<float>(18), {2, 1, 3, 3}).set_requires_grad(true);
  const auto w = xg::ones<float>({1, 1, 2, 2});
  const auto y = xg::conv2d(x, w, {.stride = std::int64_t{1} << 62});
  CHECK(y.to_vector() == std::vector<float>{0 + 1 + 3 + 4, 9 + 10 + 12 + 13});
  xg::sum(y).backward();
  CHECK(x.grad().to_vector() == std::vector<float>{1, 1, 0, 1, 1, 0, 0, 0, 0, 1, 1, 0, 1, 1, 0, 0, 0, 0});
}
