// Tests for reverse-mode autodiff: backward, grad, value_and_grad, vjp, no_grad, custom_vjp, version checks.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <xgrad/xgrad.hpp>

#include "test_support.hpp"

namespace xg = xgrad;
using xgrad::testing::contains;
using xgrad::testing::here;
using xgrad::testing::message_of;

namespace {

using Dims = std::vector<std::int64_t>;

template <class T>
void check_close(const xg::Tensor<T>& actual, const std::vector<double>& expected, double tol = 1e-5) {
  REQUIRE(actual.defined());
  auto v = actual.to_vector();
  REQUIRE(v.size() == expected.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    CHECK_MESSAGE(std::abs(static_cast<double>(v[i]) - expected[i]) <= tol * (1.0 + std::abs(expected[i])),
                  "element " << i << ": got " << v[i] << ", expected " << expected[i]);
  }
}

template <class T> std::vector<double> doubles(const xg::Tensor<T>& t) {
  const auto v = t.to_vector();
  return {v.begin(), v.end()};
}

}  // namespace

TEST_CASE("autograd seeds: Add and Mul forward values and gradients") {
  auto x = xg::tensor<float>({1, 2, 3});
  auto y = xg::tensor<float>({4, 5, 6});
  auto sum = x + y;
  CHECK(sum.to_vector() == std::vector<float>{5, 7, 9});
  auto prod = x * y;
  CHECK(prod.to_vector() == std::vector<float>{4, 10, 18});

  auto add = [](xg::Tensor<float> a, xg::Tensor<float> b) { return a + b; };
  auto mul = [](xg::Tensor<float> a, xg::Tensor<float> b) { return a * b; };
  auto [ga, gb] = xg::grad(add, xg::argnums<0, 1>)(x, y);
  CHECK(ga.to_vector() == std::vector<float>{1, 1, 1});
  CHECK(gb.to_vector() == std::vector<float>{1, 1, 1});
  // d(x*y)/dx = y and d(x*y)/dy = x, elementwise.
  auto [mx, my] = xg::grad(mul, xg::argnums<0, 1>)(x, y);
  CHECK(mx.to_vector() == std::vector<float>{4, 5, 6});
  CHECK(my.to_vector() == std::vector<float>{1, 2, 3});
}

TEST_CASE("autograd seeds: GradNetWrtX, matmul(x * z, y) differentiated w.r.t. x") {
  auto x = xg::tensor<float>({{0.8, 0.6, 0.2}, {1.8, 1.3, 1.1}});
  auto y = xg::tensor<float>({{0.11, 3.3, 1.1}, {1.1, 0.2, 1.4}, {1.1, 2.2, 0.3}});
  xg::Parameter<float> z(xg::tensor<float>({1.0}), "z");
  auto net = [z](xg::Tensor<float> a, xg::Tensor<float> b) { return xg::matmul(a * z, b); };

  auto gx = xg::grad(net)(x, y);
  CHECK(gx.shape() == Dims{2, 3});
  // With a sensitivity of ones, dx[i][k] = z * sum_j y[k][j]: the row sums of y.
  check_close(gx, {4.51, 2.7, 3.6, 4.51, 2.7, 3.6});

  // The same from a plain loop over y's values.
  auto yv = y.to_vector();
  std::vector<double> expected;
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 3; ++k) expected.push_back(double(yv[k * 3]) + yv[k * 3 + 1] + yv[k * 3 + 2]);
  check_close(gx, expected);

  // grad() returns gradients; it does not accumulate into the Parameter it passed through.
  CHECK_FALSE(z.grad().defined());
}

TEST_CASE("autograd seeds: a for-loop net x = x + z three times") {
  auto x = xg::tensor<float>({1, 2, 3});
  xg::Parameter<float> z(xg::tensor<float>({1.0}), "z");
  auto net = [z](xg::Tensor<float> a) {
    for (int i = 0; i < 3; ++i) a = a + z;
    return a;
  };
  std::vector<xg::Parameter<float>> params{z};
  auto [value, grads] = xg::value_and_grad(net, params)(x);
  CHECK(value.to_vector() == std::vector<float>{4, 5, 6});
  REQUIRE(grads.size() == 1);
  CHECK(grads[0].shape() == Dims{1});
  // z reaches each of the 3 outputs once per iteration: 3 iterations x 3 elements.
  CHECK(grads[0].item() == doctest::Approx(9.0));

  // The same through backward() and the accumulated grad().
  auto out = net(x);
  out.backward();
  REQUIRE(z.grad().defined());
  CHECK(z.grad().item() == doctest::Approx(9.0));
}

TEST_CASE("autograd: backward: accumulates across calls until zero_grad") {
  auto x = xg::tensor<float>({1, -2, 3});
  x.set_requires_grad(true);
  auto loss = xg::sum(x * x);
  loss.backward();
  check_close(x.grad(), {2, -4, 6});
  loss.backward();
  check_close(x.grad(), {4, -8, 12});

  x.zero_grad();
  CHECK_FALSE(x.grad().defined());
  xg::sum(x * 3.0f).backward();
  check_close(x.grad(), {3, 3, 3});
}

TEST_CASE("autograd: backward: the output and intermediate tensors are not leaves and keep no grad") {
  auto x = xg::tensor<double>({1, 2});
  x.set_requires_grad(true);
  auto h = x * 2.0;
  auto y = xg::sum(h);
  CHECK(x.is_leaf());
  CHECK_FALSE(h.is_leaf());
  CHECK(h.requires_grad());
  y.backward();
  check_close(x.grad(), {2, 2});
  CHECK_FALSE(h.grad().defined());
}

TEST_CASE("autograd: backward: a non-scalar output uses a sensitivity of ones") {
  auto x = xg::tensor<float>({{1, 2}, {3, 4}});
  x.set_requires_grad(true);
  auto y = x * x;  // shape [2, 2]
  y.backward();
  // The same as backward on sum(y): d/dx sum(x^2) = 2x.
  check_close(x.grad(), {2, 4, 6, 8});

  auto w = xg::tensor<float>({1, 2, 3});
  w.set_requires_grad(true);
  auto m = xg::matmul(xg::ones<float>({4, 3}), xg::reshape(w, Dims{3, 1}));  // [4, 1]
  m.backward();
  // Each of the 4 outputs is sum(w): each w[i] gets 4.
  check_close(w.grad(), {4, 4, 4});
}

TEST_CASE("autograd: backward: a broadcast input gets its gradient summed back to its shape") {
  auto a = xg::tensor<float>({{1, 2, 3}, {4, 5, 6}});
  auto row = xg::tensor<float>({10, 20, 30});
  auto col = xg::tensor<float>(std::vector<float>{7, 8}, {2, 1});
  auto s = xg::scalar<float>(2.0f);
  a.set_requires_grad(true);
  row.set_requires_grad(true);
  col.set_requires_grad(true);
  s.set_requires_grad(true);

  auto y = (a * row + col) * s;
  y.backward();
  REQUIRE(row.grad().defined());
  CHECK(row.grad().shape() == Dims{3});
  CHECK(col.grad().shape() == Dims{2, 1});
  CHECK(s.grad().shape() == Dims{});
  CHECK(a.grad().shape() == Dims{2, 3});

  // Plain-loop reference: y[i][j] = (a[i][j] * row[j] + col[i]) * s.
  auto av = a.to_vector(), rv = row.to_vector(), cv = col.to_vector();
  const double sv = 2.0;
  std::vector<double> g_a(6), g_row(3, 0.0), g_col(2, 0.0);
  double g_s = 0.0;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) {
      g_a[i * 3 + j] = rv[j] * sv;
      g_row[j] += av[i * 3 + j] * sv;
      g_col[i] += sv;
      g_s += av[i * 3 + j] * rv[j] + cv[i];
    }
  check_close(a.grad(), g_a);
  check_close(row.grad(), g_row);
  check_close(col.grad(), g_col);
  check_close(s.grad(), {g_s});
}

TEST_CASE("autograd: grad: of a one-argument function") {
  auto f = [](xg::Tensor<float> x) { return xg::sum(x * x * x); };
  auto x = xg::tensor<float>({-1, 0.5, 2});
  auto g = xg::grad(f)(x);
  check_close(g, {3, 0.75, 12});
  // grad() neither marks its argument nor leaves a gradient behind on it.
  CHECK_FALSE(x.requires_grad());
  CHECK_FALSE(x.grad().defined());

  auto fd = [](xg::Tensor<double> x) { return xg::mean(xg::exp(x)); };
  auto xd = xg::tensor<double>({0.0, 1.0});
  check_close(xg::grad(fd)(xd), {0.5, std::exp(1.0) / 2}, 1e-12);
}

TEST_CASE("autograd: grad: argnums<0, 1> returns a tuple of gradients") {
  auto f = [](xg::Tensor<float> x, xg::Tensor<float> w) { return xg::matmul(x, w); };
  auto x = xg::tensor<float>({{1, 2}, {3, 4}, {5, 6}});  // [3, 2]
  auto w = xg::tensor<float>({{1, -1, 2}, {0, 3, 1}});   // [2, 3]
  std::tuple<xg::Tensor<float>, xg::Tensor<float>> both = xg::grad(f, xg::argnums<0, 1>)(x, w);
  auto [gx, gw] = both;
  CHECK(gx.shape() == Dims{3, 2});
  CHECK(gw.shape() == Dims{2, 3});
  // d sum(x w) / dx[i][k] = sum_j w[k][j]; / dw[k][j] = sum_i x[i][k].
  auto xv = x.to_vector(), wv = w.to_vector();
  std::vector<double> ex(6), ew(6);
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < 2; ++k) ex[i * 2 + k] = double(wv[k * 3]) + wv[k * 3 + 1] + wv[k * 3 + 2];
  for (int k = 0; k < 2; ++k)
    for (int j = 0; j < 3; ++j) ew[k * 3 + j] = double(xv[k]) + xv[2 + k] + xv[4 + k];
  check_close(gx, ex);
  check_close(gw, ew);

  // argnums picks arguments by position, in the order given.
  auto gw_only = xg::grad(f, xg::argnums<1>)(x, w);
  check_close(gw_only, ew);
  auto [gw2, gx2] = xg::grad(f, xg::argnums<1, 0>)(x, w);
  check_close(gw2, ew);
  check_close(gx2, ex);
}

TEST_CASE("autograd: grad: w.r.t. an argument the function does not use gives zeros") {
  auto f = [](xg::Tensor<float> x, xg::Tensor<float>) { return xg::sum(x * 2.0f); };
  auto x = xg::tensor<float>({1, 2, 3});
  auto unused = xg::tensor<float>({{5, 6}, {7, 8}});

  auto [gx, gu] = xg::grad(f, xg::argnums<0, 1>)(x, unused);
  check_close(gx, {2, 2, 2});
  CHECK(gu.shape() == Dims{2, 2});
  CHECK(gu.to_vector() == std::vector<float>(4, 0.0f));

  // Only the unused argument differentiated: the output does not depend on it at all.
  auto g_only = xg::grad(f, xg::argnums<1>)(x, unused);
  CHECK(g_only.shape() == Dims{2, 2});
  CHECK(g_only.to_vector() == std::vector<float>(4, 0.0f));
}

TEST_CASE("autograd: value_and_grad tells each gradient as soon as the backward pass has finished it") {
  // loss = sum((w2 @ mark(tanh(x @ w1)))^2): w2's gradient is final once the last matmul's rule
  // ran, before mark's rule (which counts) and long before w1's. w2 is the matmul's first input,
  // so the pass reaches w2's own entry only at its end: telling early is what this checks.
  xg::Parameter<float> w1(xg::tensor<float>({{1, 2}, {3, 4}}), "w1");
  xg::Parameter<float> w2(xg::tensor<float>({{0.5, -1}, {2, 1}}), "w2");
  xg::Parameter<float> unused(xg::tensor<float>({7}), "unused");
  std::vector<xg::Parameter<float>> params{w1, w2, unused};
  const auto x = xg::tensor<float>({{1, -1}, {2, 0.5}});
  std::int64_t marks_run = 0;
  auto mark =
      xg::custom_vjp([](const xg::Tensor<float>& a) { return a * 1.0f; },
                     [&marks_run](const xg::Tensor<float>&, const xg::Tensor<float>&, const xg::Tensor<float>& g) {
                       ++marks_run;
                       return g;
                     });
  auto loss_fn = [&](const xg::Tensor<float>& in) {
    return xg::sum(xg::square(xg::matmul(w2, mark(xg::tanh(xg::matmul(in, w1))))));
  };
  std::vector<std::size_t> order;
  std::vector<std::vector<float>> told(3);
  std::vector<std::int64_t> marks_at_tell(3, -1);
  auto on_gradient = [&](std::size_t i, const xg::TensorBase& g) {
    order.push_back(i);
    told[i] = xg::Tensor<float>(g).to_vector();
    marks_at_tell[i] = marks_run;
  };
  auto [value, grads] = xg::value_and_grad(loss_fn, params, on_gradient)(x);
  CHECK(order == std::vector<std::size_t>{1, 0, 2});  // w2, w1, then the one no gradient reaches
  for (std::size_t i = 0; i < 3; ++i) CHECK(told[i] == grads[i].to_vector());
  CHECK(told[2] == std::vector<float>{0.0f});
  CHECK(marks_at_tell[1] == 0);  // w2: before mark's rule ran
  CHECK(marks_at_tell[0] == 1);  // w1: after it
  CHECK(value.item() == xg::value_and_grad(loss_fn, params)(x).first.item());
}

TEST_CASE("autograd: value_and_grad: one gradient per Parameter, in order") {
  xg::Parameter<float> w(xg::tensor<float>({{1, 2}, {3, 4}}), "w");
  xg::Parameter<float> b(xg::tensor<float>({0.5, -0.5}), "b");
  xg::Parameter<float> unused(xg::tensor<float>({9, 9, 9}), "unused");
  std::vector<xg::Parameter<float>> params{w, b, unused};
  auto loss_fn = [w, b](xg::Tensor<float> x) { return xg::sum(xg::square(xg::matmul(x, w) + b)); };
  auto x = xg::tensor<float>({{1, 1}, {2, -1}});

  auto [value, grads] = xg::value_and_grad(loss_fn, params)(x);
  REQUIRE(grads.size() == 3);

  // Plain-loop reference: r = x w + b, loss = sum r^2, dw[k][j] = sum_i 2 r[i][j] x[i][k], db[j] = sum_i 2 r[i][j].
  auto xv = x.to_vector(), wv = w.to_vector(), bv = b.to_vector();
  double loss = 0;
  std::vector<double> gw(4, 0.0), gb(2, 0.0);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      double r = double(xv[i * 2]) * wv[j] + double(xv[i * 2 + 1]) * wv[2 + j] + bv[j];
      loss += r * r;
      gb[j] += 2 * r;
      for (int k = 0; k < 2; ++k) gw[k * 2 + j] += 2 * r * xv[i * 2 + k];
    }
  CHECK(value.item() == doctest::Approx(loss).epsilon(1e-6));
  check_close(grads[0], gw);
  check_close(grads[1], gb);
  CHECK(grads[2].shape() == Dims{3});
  CHECK(grads[2].to_vector() == std::vector<float>(3, 0.0f));

  // The value is a plain result, and nothing accumulates on the parameters.
  CHECK_FALSE(value.requires_grad());
  CHECK_FALSE(w.grad().defined());
  CHECK_FALSE(b.grad().defined());
}

TEST_CASE("autograd: value_and_grad: a non-scalar loss is differentiated as its sum") {
  xg::Parameter<double> p(xg::tensor<double>({1, 2, 3}), "p");
  std::vector<xg::Parameter<double>> params{p};
  auto f = [p](xg::Tensor<double> x) { return p * x; };
  auto [value, grads] = xg::value_and_grad(f, params)(xg::tensor<double>({4, 5, 6}));
  check_close(value, {4, 10, 18}, 1e-12);
  check_close(grads[0], {4, 5, 6}, 1e-12);
}

TEST_CASE("autograd: vjp: the outputs and a pullback giving each primal's cotangent, as often as asked") {
  auto f = [](const xg::Tensor<double>& x, const xg::Tensor<double>& w) { return xg::tanh(xg::matmul(x, w)); };
  const auto x = xg::randn<double>({2, 3}, 1), w = xg::randn<double>({3, 4}, 2);
  auto [y, pullback] = xg::vjp(f, x, w);
  CHECK_FALSE(y.requires_grad());
  check_close(y, doubles(f(x, w)), 1e-12);
  for (std::uint64_t seed : {3, 4}) {
    const auto u = xg::randn<double>({2, 4}, seed);
    auto [gx, gw] = pullback(u);
    // The cotangents are the gradients of <f(x, w), u>.
    auto [rx, rw] =
        xg::grad([&](const auto& a, const auto& b) { return xg::sum(f(a, b) * u); }, xg::argnums<0, 1>)(x, w);
    check_close(gx, doubles(rx), 1e-12);
    check_close(gw, doubles(rw), 1e-12);
    // Linear in the cotangent.
    auto [gx2, gw2] = pullback(u * 2.0);
    check_close(gx2, doubles(gx * 2.0), 1e-12);
    check_close(gw2, doubles(gw * 2.0), 1e-12);
  }
}

TEST_CASE("autograd: vjp: a function of several outputs takes a cotangent for each; unused primals get zeros") {
  auto f = [](const xg::Tensor<float>& x, const xg::Tensor<float>& unused) {
    (void)unused;
    return std::tuple{xg::sin(x) * 3.0f, x * x};
  };
  const auto x = xg::tensor<float>({0.5f, -1.0f, 2.0f});
  auto [ys, pullback] = xg::vjp(f, x, xg::ones<float>({2}));
  CHECK(std::get<1>(ys).to_vector() == std::vector<float>{0.25f, 1.0f, 4.0f});
  const auto u1 = xg::tensor<float>({1, 2, 3}), u2 = xg::tensor<float>({-1, 0, 1});
  auto [gx, gunused] = pullback(u1, u2);
  std::vector<double> expected;
  for (int i = 0; i < 3; ++i) {
    const double xi = x.to_vector()[i];
    expected.push_back(3 * std::cos(xi) * u1.to_vector()[i] + 2 * xi * u2.to_vector()[i]);
  }
  check_close(gx, expected);
  CHECK(gunused.to_vector() == std::vector<float>{0, 0});
  // An output that depends on no primal: zero cotangents.
  auto [c, constant_pullback] = xg::vjp([](const xg::Tensor<float>&) { return xg::ones<float>({2}); }, x);
  CHECK(std::get<0>(constant_pullback(c)).to_vector() == std::vector<float>{0, 0, 0});
}

TEST_CASE("autograd: vjp: a cotangent of another shape is a ShapeError naming it") {
  const auto pullback = xg::vjp([](const xg::Tensor<float>& x) { return xg::exp(x); }, xg::ones<float>({2, 4})).second;
  const std::string what = message_of<xg::ShapeError>([&] { (void)pullback(xg::ones<float>({4, 2})); });
  CHECK(contains(what, "vjp: cotangent 0 must have output 0's shape [2, 4], got [4, 2]"));
}

TEST_CASE("autograd: vjp: composes with grad (the pullback is differentiable) and with jit") {
  auto cube = [](const xg::Tensor<double>& x) { return x * x * x; };
  const auto x = xg::tensor<double>({1.0, -2.0, 0.5}), u = xg::tensor<double>({2.0, 1.0, -1.0});
  // d/dx sum(pullback(u)) = d/dx sum(3 x^2 u) = 6 x u.
  auto g = xg::grad([&](const xg::Tensor<double>& a) {
    auto [y, pullback] = xg::vjp(cube, a);
    return xg::sum(std::get<0>(pullback(u)));
  })(x);
  check_close(g, {12.0, -12.0, -3.0}, 1e-12);
  auto cotangent = [&](const xg::Tensor<double>& a, const xg::Tensor<double>& v) {
    auto [y, pullback] = xg::vjp(cube, a);
    return std::get<0>(pullback(v));
  };
  const auto eager = cotangent(x, u);
  check_close(eager, {6.0, 12.0, -0.75}, 1e-12);
  for (xg::JitLevel level : {xg::JitLevel::O0, xg::JitLevel::O1, xg::JitLevel::O2}) {
    CAPTURE(static_cast<int>(level));
    check_close(xg::jit(cotangent, {.level = level})(x, u), doubles(eager), 1e-12);
  }
}

TEST_CASE("autograd: jvp: the outputs and J·t in one pass, for one tensor, a tuple and several outputs") {
  auto f = [](const xg::Tensor<double>& x) { return xg::sin(x) * x; };
  const auto x = xg::tensor<double>({0.5, -1.0, 2.0}), t = xg::tensor<double>({1.0, 2.0, -0.5});
  auto [y, ty] = xg::jvp(f, x, t);
  check_close(y, doubles(f(x)), 1e-15);
  std::vector<double> expected;
  for (int i = 0; i < 3; ++i) {
    const double xi = x.to_vector()[i];
    expected.push_back((std::cos(xi) * xi + std::sin(xi)) * t.to_vector()[i]);
  }
  check_close(ty, expected, 1e-14);
  CHECK(ty.impl()->tangents.empty());

  // Two primals and two outputs; an output that depends on neither gets a zero tangent.
  auto g = [](const xg::Tensor<double>& a, const xg::Tensor<double>& w) {
    return std::tuple{xg::matmul(a, w), xg::ones<double>({2})};
  };
  const auto a = xg::randn<double>({2, 3}, 1), w = xg::randn<double>({3, 2}, 2);
  const auto ta = xg::randn<double>({2, 3}, 3), tw = xg::randn<double>({3, 2}, 4);
  auto [outs, tangents] = xg::jvp(g, std::tuple{a, w}, std::tuple{ta, tw});
  check_close(std::get<0>(tangents), doubles(xg::matmul(ta, w) + xg::matmul(a, tw)), 1e-14);
  CHECK(std::get<1>(tangents).to_vector() == std::vector<double>{0, 0});
}

TEST_CASE("autograd: jvp: composes with grad, with itself and with jit") {
  auto cube = [](const xg::Tensor<double>& x) { return xg::sum(x * x * x); };
  const auto x = xg::tensor<double>({1.0, -2.0, 0.5}), v = xg::tensor<double>({2.0, 1.0, -1.0});
  // Forward over reverse: the Hessian-vector product, H = diag(6 x).
  check_close(xg::jvp(xg::grad(cube), x, v).second, {12.0, -12.0, -3.0}, 1e-12);
  // Reverse over forward: the gradient of J v = sum(3 x^2 v) is 6 x v as well.
  auto directional = [&](const xg::Tensor<double>& a) { return xg::jvp(cube, a, v).second; };
  check_close(xg::grad(directional)(x), {12.0, -12.0, -3.0}, 1e-12);
  // Forward over forward: v^T H v = sum(6 x v^2).
  auto second = xg::jvp(directional, x, v).second;
  check_close(second, {6.0 * (1 * 4 - 2 * 1 + 0.5 * 1)}, 1e-12);
  // Through a rule that reads its output: u^T H v of sum(exp(x)) is sum(exp(x) u v).
  const auto u = xg::tensor<double>({0.5, 3.0, -2.0});
  auto exp_sum = [](const xg::Tensor<double>& a) { return xg::sum(xg::exp(a)); };
  auto inner = [&](const xg::Tensor<double>& a) { return xg::jvp(exp_sum, a, v).second; };
  check_close(xg::jvp(inner, x, u).second, {xg::sum(xg::exp(x) * u * v).item()}, 1e-12);
  // Compiled, at every level, and through a jitted function.
  const auto hvp = [&](const xg::Tensor<double>& a, const xg::Tensor<double>& t) {
    return xg::jvp(xg::grad(cube), a, t).second;
  };
  for (xg::JitLevel level : {xg::JitLevel::O0, xg::JitLevel::O1, xg::JitLevel::O2}) {
    CAPTURE(static_cast<int>(level));
    check_close(xg::jit(hvp, {.level = level})(x, v), {12.0, -12.0, -3.0}, 1e-12);
  }
  auto jitted = xg::jit([](const xg::Tensor<double>& a) { return xg::exp(a) * 2.0; });
  check_close(xg::jvp(jitted, x, v).second, doubles(xg::exp(x) * 2.0 * v), 1e-14);
}

TEST_CASE("autograd: linearize: the outputs, and a compiled linear function of the tangent with no primal work") {
  auto w = xg::tensor<double>({0.5, -1.0, 2.0, 0.25, 1.5, -0.75}, {3, 2});
  auto f = [&w](const xg::Tensor<double>& x) { return xg::sum(xg::exp(xg::matmul(x, w)), {1}); };
  auto x = xg::tensor<double>({0.1, 0.2, -0.3, 0.4, 0.0, -0.5}, {2, 3});
  auto [y, f_jvp] = xg::linearize(f, x);
  check_close(y, doubles(f(x)), 1e-15);
  for (auto t : {xg::ones<double>({2, 3}), xg::tensor<double>({1.0, -2.0, 0.5, 3.0, 0.0, 1.0}, {2, 3})}) {
    check_close(f_jvp(t), doubles(xg::jvp(f, x, t).second), 1e-14);
    check_close(f_jvp(t * 3.0), doubles(f_jvp(t) * 3.0), 1e-13);  // linear
  }
  // The primal work (matmul of x, exp) ran once while tracing: the graph has the tangent's
  // matmul and the product with exp's value, which it reads as a constant.
  const std::string ir = f_jvp.lower(x).ir();
  CHECK(ir.find("Exp(") == std::string::npos);
  CHECK(ir.find("MatMul(") != std::string::npos);
  CHECK(f_jvp.cache_size() == 1);

  // Several primals and outputs.
  auto g = [](const xg::Tensor<double>& a, const xg::Tensor<double>& b) { return std::tuple{a * b, xg::sin(a)}; };
  auto a = xg::tensor<double>({0.3, -1.2}), b = xg::tensor<double>({2.0, 0.5});
  auto [outs, g_jvp] = xg::linearize(g, a, b);
  check_close(std::get<0>(outs), doubles(a * b), 1e-15);
  auto ta = xg::tensor<double>({1.0, 2.0}), tb = xg::tensor<double>({-1.0, 0.5});
  auto [t0, t1] = g_jvp(ta, tb);
  check_close(t0, doubles(ta * b + a * tb), 1e-15);
  check_close(t1, doubles(xg::cos(a) * ta), 1e-15);
}

TEST_CASE("autograd: jvp: errors name what is wrong") {
  auto f = [](const xg::Tensor<float>& x) { return x * 2.0f; };
  CHECK(contains(message_of<xg::ShapeError>([&] {
                   (void)xg::jvp(f, xg::ones<float>({2, 3}), xg::ones<float>({3}));
                 }),
                 "jvp: tangent 0 must have primal 0's shape [2, 3], got [3]"));
  // A custom_vjp has a reverse rule only.
  auto ste =
      xg::custom_vjp([](const xg::Tensor<float>& x) { return xg::sign(x); },
                     [](const xg::Tensor<float>&, const xg::Tensor<float>&, const xg::Tensor<float>& g) { return g; });
  const std::string what =
      message_of<xg::AutogradError>([&] { (void)xg::jvp(ste, xg::ones<float>({2}), xg::ones<float>({2})); });
  CHECK(contains(what, "jvp: CustomVjp"));
  CHECK(contains(what, "has no forward-mode rule"));
  CHECK(contains(what, "test_autograd.cpp"));
}

TEST_CASE("autograd: jacrev and jacfwd give the Jacobian, shaped output + input, for any argnums") {
  // y = tanh(W x): dy_i/dx_j = (1 - y_i^2) W_ij, dy_i/dW_jk = (1 - y_i^2) [i == j] x_k.
  const auto w = xg::randn<double>({2, 3}, 1), x = xg::randn<double>({3}, 2);
  auto f = [](const xg::Tensor<double>& a, const xg::Tensor<double>& m) {
    return xg::tanh(xg::squeeze(xg::matmul(m, xg::expand_dims(a, 1)), {1}));
  };
  const auto y = f(x, w).to_vector(), wv = w.to_vector(), xv = x.to_vector();
  std::vector<double> dx, dw;
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) dx.push_back((1 - y[i] * y[i]) * wv[i * 3 + j]);
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 3; ++k) dw.push_back(i == j ? (1 - y[i] * y[i]) * xv[k] : 0.0);
  }
  const auto rev = xg::jacrev(f)(x, w), fwd = xg::jacfwd(f)(x, w);
  CHECK(rev.shape() == xg::Shape{2, 3});
  CHECK(fwd.shape() == xg::Shape{2, 3});
  check_close(rev, dx, 1e-12);
  check_close(fwd, dx, 1e-12);
  auto [rx, rw] = xg::jacrev(f, xg::argnums<0, 1>)(x, w);
  auto [fx, fw] = xg::jacfwd(f, xg::argnums<0, 1>)(x, w);
  CHECK(rw.shape() == xg::Shape{2, 2, 3});
  CHECK(fw.shape() == xg::Shape{2, 2, 3});
  check_close(rx, dx, 1e-12);
  check_close(rw, dw, 1e-12);
  check_close(fx, dx, 1e-12);
  check_close(fw, dw, 1e-12);
}

TEST_CASE("autograd: hessian is jacfwd of jacrev, eagerly and compiled") {
  // f(x) = sum(x^3) + x0 x1: H = diag(6 x) + the coupling of x0 and x1.
  auto f = [](const xg::Tensor<double>& x) {
    return xg::sum(x * x * x) + xg::sum(xg::slice(x, {0}, {1}) * xg::slice(x, {1}, {1}));
  };
  const auto x = xg::tensor<double>({1.0, -2.0, 0.5});
  const std::vector<double> expected{6.0, 1.0, 0.0, 1.0, -12.0, 0.0, 0.0, 0.0, 3.0};
  const auto h = xg::hessian(f)(x);
  CHECK(h.shape() == xg::Shape{3, 3});
  check_close(h, expected, 1e-12);
  // Through rules that read their output (exp's gradient is g * exp(x)): H = diag(exp(x)).
  const auto he = xg::hessian([](const xg::Tensor<double>& a) { return xg::sum(xg::exp(a)); })(x);
  const auto ex = xg::exp(x).to_vector();
  check_close(he, {ex[0], 0, 0, 0, ex[1], 0, 0, 0, ex[2]}, 1e-12);
  for (xg::JitLevel level : {xg::JitLevel::O0, xg::JitLevel::O2}) {
    CAPTURE(static_cast<int>(level));
    check_close(xg::jit([&](const xg::Tensor<double>& a) { return xg::hessian(f)(a); }, {.level = level})(x), expected,
                1e-12);
  }
}

TEST_CASE("autograd: vmap maps a function over a batch axis of its arguments") {
  auto f = [](const xg::Tensor<double>& x, const xg::Tensor<double>& w) { return xg::tanh(xg::matmul(w, x)) + x; };
  const auto xs = xg::randn<double>({4, 3, 2}, 1), w = xg::randn<double>({3, 3}, 2);
  const auto batched = xg::vmap(f, xg::in_axes{0, xg::none})(xs, w);
  REQUIRE(batched.shape() == xg::Shape{4, 3, 2});
  std::vector<xg::Tensor<double>> loop;
  for (std::int64_t i = 0; i < 4; ++i) loop.push_back(f(xg::squeeze(xg::slice(xs, {i, 0, 0}, {1, 3, 2}), {0}), w));
  check_close(batched, doubles(xg::stack(loop, 0)), 1e-14);
  // The batch along axis 2 of the argument and axis 1 of the result.
  const auto moved = xg::vmap(f, xg::in_axes{2, xg::none}, 1)(xg::transpose(xs, {1, 2, 0}), w);
  check_close(moved, doubles(xg::transpose(xg::stack(loop, 0), {1, 0, 2})), 1e-14);
  // Nested: an outer product of two batches.
  const auto a = xg::tensor<double>({1, 2, 3}), b = xg::tensor<double>({10, 20});
  auto times = [](const xg::Tensor<double>& p, const xg::Tensor<double>& q) { return p * q; };
  const auto outer = xg::vmap([&](const xg::Tensor<double>& p) {
    return xg::vmap(times, xg::in_axes{xg::none, 0})(p, b);
  })(a);
  CHECK(outer.shape() == xg::Shape{3, 2});
  CHECK(outer.to_vector() == std::vector<double>{10, 20, 20, 40, 30, 60});
}

TEST_CASE("autograd: vmap of grad gives per-example gradients; vmap composes with jit and jvp") {
  auto loss = [](const xg::Tensor<double>& w, const xg::Tensor<double>& x, const xg::Tensor<std::int32_t>& y) {
    return xg::softmax_cross_entropy(xg::matmul(xg::expand_dims(x, 0), w), xg::reshape(y, {1}));
  };
  const auto w = xg::randn<double>({5, 3}, 1), xs = xg::randn<double>({6, 5}, 2);
  const auto ys = xg::tensor<std::int32_t>({0, 2, 1, 1, 0, 2});
  auto per_example = xg::vmap(xg::grad(loss), xg::in_axes{xg::none, 0, 0});
  const auto grads = per_example(w, xs, ys);
  REQUIRE(grads.shape() == xg::Shape{6, 5, 3});
  std::vector<xg::Tensor<double>> loop;
  for (std::int64_t i = 0; i < 6; ++i)
    loop.push_back(xg::grad(loss)(w, xg::squeeze(xg::slice(xs, {i, 0}, {1, 5}), {0}), xg::slice(ys, {i}, {1})));
  const auto expected = doubles(xg::stack(loop, 0));
  check_close(grads, expected, 1e-13);
  for (xg::JitLevel level : {xg::JitLevel::O0, xg::JitLevel::O2}) {
    CAPTURE(static_cast<int>(level));
    check_close(xg::jit(per_example, {.level = level})(w, xs, ys), expected, 1e-13);
  }
  check_close(xg::vmap(xg::jit(xg::grad(loss)), xg::in_axes{xg::none, 0, 0})(w, xs, ys), expected, 1e-13);
  // Reverse mode through vmap: the gradient of the examples' total loss is the per-example
  // gradients' sum.
  auto total = [&](const xg::Tensor<double>& weights) {
    return xg::sum(xg::vmap(loss, xg::in_axes{xg::none, 0, 0})(weights, xs, ys));
  };
  check_close(xg::grad(total)(w), doubles(xg::sum(xg::stack(loop, 0), {0})), 1e-13);
  // Forward mode inside vmap: each example's directional derivative.
  const auto v = xg::randn<double>({6, 5}, 3);
  auto tangent = [](const xg::Tensor<double>& x, const xg::Tensor<double>& t) {
    return xg::jvp([](const xg::Tensor<double>& a) { return xg::sum(xg::sin(a)); }, x, t).second;
  };
  check_close(xg::vmap(tangent)(xs, v), doubles(xg::sum(xg::cos(xs) * v, {1})), 1e-14);
}

TEST_CASE("autograd: vmap's errors name the argument or the op") {
  auto id = [](const xg::Tensor<float>& x, const xg::Tensor<float>& y) { return x + y; };
  CHECK(contains(message_of<xg::ShapeError>([&] {
                   (void)xg::vmap(id)(xg::ones<float>({3, 2}), xg::ones<float>({4, 2}));
                 }),
                 "vmap: argument 1 has 4 values along its mapped axis, argument 0 has 3"));
  CHECK(contains(message_of<xg::ShapeError>([&] {
                   (void)xg::vmap(id, xg::in_axes{2, 0})(xg::ones<float>({3, 2}), xg::ones<float>({3, 2}));
                 }),
                 "argument 0 (Float32[3, 2]) has no axis 2 to map over"));
  CHECK(contains(message_of<xg::ValueError>(
                     [&] { (void)xg::vmap(id, xg::in_axes{0})(xg::ones<float>({3}), xg::ones<float>({3})); }),
                 "in_axes has 1 entries for 2 arguments"));
  CHECK(contains(message_of<xg::ValueError>([&] {
                   (void)xg::vmap([](const xg::Tensor<float>& x) { return xg::full<float>({1}, x.item()); })(
                       xg::ones<float>({3}));
                 }),
                 "stands for each value of a batch"));
}

TEST_CASE("autograd: vmap folds a convolution's batch into its samples, and loops, counted, over batched weights") {
  auto conv = [](const xg::Tensor<double>& x, const xg::Tensor<double>& w) { return xg::conv2d(x, w); };
  const auto xs = xg::randn<double>({3, 2, 1, 5, 5}, 1), ws = xg::randn<double>({3, 4, 1, 3, 3}, 2);
  auto value = [](const xg::Tensor<double>& batch, std::int64_t i) {
    std::vector<std::int64_t> begin(static_cast<std::size_t>(batch.ndim()), 0), size = batch.shape().to_vector();
    begin[0] = i;
    size[0] = 1;
    return xg::squeeze(xg::slice(batch, begin, size), {0});
  };
  auto loop = [&](bool each_weight) {
    std::vector<xg::Tensor<double>> out;
    for (std::int64_t i = 0; i < 3; ++i) out.push_back(conv(value(xs, i), value(ws, each_weight ? i : 0)));
    return doubles(xg::stack(out, 0));
  };
  auto loops = [] {
    const auto counts = xg::vmap_loop_fallbacks();
    const auto it = counts.find("Conv2D");
    return it == counts.end() ? std::int64_t{0} : it->second;
  };
  const std::int64_t before = loops();
  check_close(xg::vmap(conv, xg::in_axes{0, xg::none})(xs, value(ws, 0)), loop(false), 1e-13);
  CHECK(loops() == before);  // one convolution of 3 x 2 samples
  check_close(xg::vmap(conv)(xs, ws), loop(true), 1e-13);
  CHECK(loops() == before + 1);  // per-example weights: one convolution per value, counted
}

namespace {

/// The buffers the tape from `out` keeps for its backward pass (saved inputs and outputs).
std::set<const xg::Storage*> kept_buffers(const xg::TensorBase& out) {
  std::set<const xg::Storage*> kept;
  std::set<const xg::autograd::Node*> seen;
  std::vector<std::shared_ptr<xg::autograd::Node>> pending{out.impl()->autograd->grad_fn};
  while (!pending.empty()) {
    const auto node = pending.back();
    pending.pop_back();
    if (!node || !seen.insert(node.get()).second) continue;
    for (const auto& saved : node->saved)
      if (saved.storage) kept.insert(saved.storage.get());
    if (node->out_storage) kept.insert(node->out_storage.get());
    for (const auto& in : node->inputs)
      if (in.meta) pending.push_back(in.meta->grad_fn);
  }
  return kept;
}

}  // namespace

TEST_CASE("autograd: checkpoint keeps only its inputs for the backward pass and recomputes the rest") {
  int calls = 0;
  auto block = [&calls](const xg::Tensor<double>& x, const xg::Tensor<double>& w) {
    ++calls;
    const auto h = xg::tanh(xg::matmul(x, w));
    return xg::sigmoid(h) * h;
  };
  auto loss = [&](bool remat) {
    return [&block, remat](const xg::Tensor<double>& x, const xg::Tensor<double>& w) {
      return xg::sum(remat ? xg::checkpoint(block)(x, w) : block(x, w));
    };
  };
  const auto x0 = xg::randn<double>({4, 3}, 1), w0 = xg::randn<double>({3, 5}, 2);
  const auto plain = xg::grad(loss(false), xg::argnums<0, 1>)(x0, w0);
  calls = 0;
  const auto remat = xg::grad(loss(true), xg::argnums<0, 1>)(x0, w0);
  CHECK(calls == 2);  // the forward pass, then again in the backward pass
  check_close(std::get<0>(remat), doubles(std::get<0>(plain)), 1e-14);
  check_close(std::get<1>(remat), doubles(std::get<1>(plain)), 1e-14);

  // The tape of the checkpointed block keeps its two inputs; the plain one its intermediates too.
  const auto x = x0.detach().set_requires_grad(true), w = w0.detach().set_requires_grad(true);
  const auto kept = kept_buffers(loss(true)(x, w));
  CHECK(kept == std::set<const xg::Storage*>{x.impl()->storage.get(), w.impl()->storage.get()});
  CHECK(kept_buffers(loss(false)(x, w)).size() > kept.size());

  // Second order (the recomputation is recorded), compiled, and forward mode through it.
  const auto v = xg::randn<double>({4, 3}, 3);
  auto hvp = [&](bool remat) {
    return xg::jvp(xg::grad(loss(remat)), std::tuple{x0, w0}, std::tuple{v, xg::zeros_like(w0)}).second;
  };
  check_close(hvp(true), doubles(hvp(false)), 1e-12);
  check_close(xg::jit(xg::grad(loss(true)))(x0, w0), doubles(std::get<0>(plain)), 1e-14);
  auto second = [&](bool remat) {
    return xg::grad([&](const xg::Tensor<double>& a) { return xg::sum(xg::grad(loss(remat))(a, w0) * v); })(x0);
  };
  check_close(second(true), doubles(second(false)), 1e-12);

  // A weight read from outside the arguments would get no gradient through the checkpoint:
  // the backward pass says so rather than leave it out.
  auto weight = xg::Parameter<double>(w0.detach(), "block.weight");
  auto reads_weight = xg::checkpoint([&](const xg::Tensor<double>& a) { return block(a, weight); });
  const std::string what = message_of<xg::AutogradError>(
      [&] { (void)xg::grad([&](const xg::Tensor<double>& a) { return xg::sum(reads_weight(a)); })(x0); });
  CHECK(contains(what, "Checkpoint"));
  CHECK(contains(what, "'block.weight'"));
  CHECK(contains(what, "from outside its arguments"));
}

TEST_CASE("autograd: checkpoint in a compiled gradient recomputes each block in the backward pass, at a smaller peak") {
  // Three blocks of two 128 x 128 matmuls: uncheckpointed, every block's intermediates wait for
  // the backward pass; checkpointed, only the blocks' inputs do, and each block's are remade
  // just before its gradient.
  auto block = [](const xg::Tensor<float>& x, const xg::Tensor<float>& w) {
    return xg::tanh(xg::matmul(xg::relu(xg::matmul(x, w)), w));
  };
  auto loss = [&](bool remat) {
    return [&block, remat](const xg::Tensor<float>& x, const xg::Tensor<float>& w) {
      auto h = x;
      for (int i = 0; i < 3; ++i) h = remat ? xg::checkpoint(block)(h, w) : block(h, w);
      return xg::sum(h);
    };
  };
  const auto x = xg::randn<float>({128, 128}, 1), w = xg::randn<float>({128, 128}, 2) * 0.05f;
  auto compiled = [&](bool remat) {
    return xg::jit(xg::grad(loss(remat), xg::argnums<1>), {.level = xg::JitLevel::O2});
  };
  const auto plain = compiled(false).lower(x, w), remat = compiled(true).lower(x, w);
  auto matmuls = [](const std::string& ir) {
    std::size_t n = 0;
    for (auto at = ir.find("MatMul"); at != std::string::npos; at = ir.find("MatMul", at + 1)) ++n;
    return n;
  };
  CHECK(matmuls(remat.ir()) == matmuls(plain.ir()) + 6);  // each block's two matmuls again
  INFO("arena: " << plain.peak_arena_bytes() << " bytes plain, " << remat.peak_arena_bytes() << " checkpointed");
  CHECK(remat.peak_arena_bytes() < plain.peak_arena_bytes());
  check_close(compiled(true)(x, w), doubles(compiled(false)(x, w)), 1e-5);
  for (xg::JitLevel level : {xg::JitLevel::O0, xg::JitLevel::O1, xg::JitLevel::O2}) {
    CAPTURE(static_cast<int>(level));
    const auto eager = xg::grad(loss(false), xg::argnums<1>)(x, w);
    check_close(xg::jit(xg::grad(loss(true), xg::argnums<1>), {.level = level})(x, w), doubles(eager), 1e-4);
    check_close(xg::jit(xg::grad(loss(false), xg::argnums<1>), {.level = level})(x, w), doubles(eager), 1e-4);
    check_close(xg::grad(loss(true), xg::argnums<1>)(x, w), doubles(eager), 1e-4);
  }
}

TEST_CASE("autograd: no_grad: nothing is recorded and results do not require grad") {
  auto x = xg::tensor<float>({1, 2, 3});
  x.set_requires_grad(true);
  CHECK(xg::is_grad_enabled());
  xg::Tensor<float> y;
  {
    xg::no_grad guard;
    CHECK_FALSE(xg::is_grad_enabled());
    y = xg::sum(xg::exp(x) * x);
    CHECK_FALSE(y.requires_grad());
    CHECK(y.is_leaf());
    {
      // enable_grad inside no_grad records again, and restores no_grad on exit.
      xg::enable_grad on;
      CHECK(xg::is_grad_enabled());
      CHECK((x * 2.0f).requires_grad());
    }
    CHECK_FALSE(xg::is_grad_enabled());
  }
  CHECK(xg::is_grad_enabled());
  CHECK_THROWS_AS(y.backward(), xg::AutogradError);
  CHECK_FALSE(x.grad().defined());
  // Outside the scope, the same op records.
  CHECK((x * 2.0f).requires_grad());
}

TEST_CASE("autograd: grad of grad: second derivatives") {
  // d2/dx2 x^3 = 6x
  auto cube = [](xg::Tensor<float> x) { return x * x * x; };
  auto x = xg::tensor<float>({-2, 0.5, 1, 3});
  auto d1 = xg::grad(cube)(x);
  check_close(d1, {12, 0.75, 3, 27});
  auto d2 = xg::grad(xg::grad(cube))(x);
  check_close(d2, {-12, 3, 6, 18});
  // And the third derivative is 6 everywhere.
  auto d3 = xg::grad(xg::grad(xg::grad(cube)))(x);
  check_close(d3, {6, 6, 6, 6});

  // d2/dx2 sin(x) = -sin(x)
  auto sine = [](xg::Tensor<double> t) { return xg::sin(t); };
  auto t = xg::tensor<double>({-1.0, 0.0, 0.3, 2.0});
  auto s2 = xg::grad(xg::grad(sine))(t);
  std::vector<double> expected;
  for (double v : t.to_vector()) expected.push_back(-std::sin(v));
  check_close(s2, expected, 1e-9);
  auto c1 = xg::grad(sine)(t);
  expected.clear();
  for (double v : t.to_vector()) expected.push_back(std::cos(v));
  check_close(c1, expected, 1e-9);
}

TEST_CASE("autograd: grad of grad: mixed and pure second derivatives of a two-input function") {
  // f(x, y) = sum(x^2 * y^3): df/dx = 2 x y^3.
  auto f = [](xg::Tensor<float> x, xg::Tensor<float> y) { return xg::sum(x * x * y * y * y); };
  auto dfdx = xg::grad(f);
  auto x = xg::tensor<float>({1, 2});
  auto y = xg::tensor<float>({3, -1});

  check_close(dfdx(x, y), {54, -4});
  // d/dx (2 x y^3) = 2 y^3
  check_close(xg::grad(dfdx)(x, y), {54, -2});
  // d/dy (2 x y^3) = 6 x y^2
  check_close(xg::grad(dfdx, xg::argnums<1>)(x, y), {54, 12});
  auto [dxx, dxy] = xg::grad(dfdx, xg::argnums<0, 1>)(x, y);
  check_close(dxx, {54, -2});
  check_close(dxy, {54, 12});
}

TEST_CASE("autograd: grad of grad: softmax_cross_entropy's one-op gradient is differentiable too") {
  // h(logits, u) = sum(w * d/dlogits sum(u * losses(logits))): its gradient runs through the
  // gradient op's own rule, w.r.t. the logits and w.r.t. the incoming gradient u.
  auto labels = xg::tensor<std::int32_t>({2, 0, 1});
  auto w = xg::reshape(xg::tensor<double>({0.3, -1.2, 0.7, 2.0, -0.4, 0.9, 1.1, -0.6, 0.2, 0.5, -1.5, 0.8}), {3, 4});
  auto inner = [&](xg::Tensor<double> logits, xg::Tensor<double> u) {
    return xg::sum(u * xg::softmax_cross_entropy(logits, labels, xg::Reduction::none));
  };
  auto h = [&](xg::Tensor<double> logits, xg::Tensor<double> u) { return xg::sum(w * xg::grad(inner)(logits, u)); };
  std::vector<double> l0 = {0.1, 1.3, -0.7, 0.4, 2.2, -1.0, 0.0, 0.6, -0.3, 0.8, 1.7, -2.1}, u0 = {0.5, -1.5, 2.0};
  auto tensors = [](const std::vector<double>& l, const std::vector<double>& u) {
    return std::pair{xg::reshape(xg::tensor<double>(l), {3, 4}), xg::tensor<double>(u)};
  };
  auto [logits, u] = tensors(l0, u0);
  auto [dl, du] = xg::grad(h, xg::argnums<0, 1>)(logits, u);
  // Central difference of h in element i of the logits (of_logits) or of u.
  auto numeric = [&](bool of_logits, std::size_t i) {
    const double step = 1e-6;
    auto at = [&](double delta) {
      auto l = l0, v = u0;
      (of_logits ? l : v)[i] += delta;
      auto [lt, vt] = tensors(l, v);
      return h(lt, vt).item();
    };
    return (at(step) - at(-step)) / (2 * step);
  };
  std::vector<double> want_dl, want_du;
  for (std::size_t i = 0; i < l0.size(); ++i) want_dl.push_back(numeric(true, i));
  for (std::size_t i = 0; i < u0.size(); ++i) want_du.push_back(numeric(false, i));
  check_close(dl, want_dl, 1e-6);
  check_close(du, want_du, 1e-6);
}

TEST_CASE("autograd: custom_vjp: a straight-through estimator uses the custom gradient") {
  // sign() has a zero gradient; the straight-through estimator passes the incoming one on.
  auto ste =
      xg::custom_vjp([](const xg::Tensor<float>& x) { return xg::sign(x); },
                     [](const xg::Tensor<float>&, const xg::Tensor<float>&, const xg::Tensor<float>& g) { return g; });
  auto x = xg::tensor<float>({-1.5, 0.2, 3});
  auto plain = xg::grad([](xg::Tensor<float> v) { return xg::sum(xg::sign(v) * v); })(x);
  // d/dx sum(sign(x) x) with sign's zero gradient is sign(x).
  check_close(plain, {-1, 1, 1});

  auto f = [ste](xg::Tensor<float> v) { return xg::sum(ste(v) * v); };
  CHECK(ste(x).to_vector() == std::vector<float>{-1, 1, 1});
  // With the straight-through gradient: sign(x) + x.
  check_close(xg::grad(f)(x), {-2.5, 1.2, 4});

  // Through backward() as well.
  auto leaf = xg::tensor<float>({-1.5, 0.2, 3});
  leaf.set_requires_grad(true);
  ste(leaf * 2.0f).backward();
  check_close(leaf.grad(), {2, 2, 2});
}

TEST_CASE("autograd: custom_vjp: several inputs get their gradients in order") {
  auto weighted = xg::custom_vjp(
      [](const xg::Tensor<float>& a, const xg::Tensor<float>& b) { return a * b; },
      [](const xg::Tensor<float>&, const xg::Tensor<float>&, const xg::Tensor<float>&, const xg::Tensor<float>& g) {
        return std::tuple{g * 2.0f, g * 5.0f};
      });
  auto a = xg::tensor<float>({1, 2});
  auto b = xg::tensor<float>({3, 4});
  CHECK(weighted(a, b).to_vector() == std::vector<float>{3, 8});
  auto [ga, gb] = xg::grad([weighted](xg::Tensor<float> p, xg::Tensor<float> q) { return weighted(p, q); },
                           xg::argnums<0, 1>)(a, b);
  check_close(ga, {2, 2});
  check_close(gb, {5, 5});
}

TEST_CASE("autograd: custom_vjp: the custom gradient works under grad of grad") {
  // Forward x^2, but the backward claims 3 x^2 (the derivative of x^3): second derivative 6x.
  auto odd = xg::custom_vjp([](const xg::Tensor<double>& x) { return x * x; },
                            [](const xg::Tensor<double>& x, const xg::Tensor<double>&, const xg::Tensor<double>& g) {
                              return g * 3.0 * x * x;
                            });
  auto f = [odd](xg::Tensor<double> x) { return odd(x); };
  auto x = xg::tensor<double>({-1, 0.5, 2});
  check_close(f(x), {1, 0.25, 4}, 1e-12);
  check_close(xg::grad(f)(x), {3, 0.75, 12}, 1e-12);
  check_close(xg::grad(xg::grad(f))(x), {-6, 3, 12}, 1e-12);
}

TEST_CASE("autograd: version counter: a saved tensor changed in place makes backward throw, naming the op") {
  auto x = xg::tensor<float>({1, 2, 3});
  auto y = xg::tensor<float>({4, 5, 6});
  x.set_requires_grad(true);
  const int line = __LINE__ + 1;
  auto z = xg::mul(x, y);  // Mul saves y for x's gradient
  {
    xg::no_grad guard;
    y += 1.0f;
  }
  auto msg = message_of<xg::AutogradError>([&] { z.backward(); });
  CHECK(contains(msg, "Mul"));
  CHECK(contains(msg, here(line)));
  CHECK(contains(msg, "in place"));

  // Written with the operator, the op's line is still the user's.
  auto w = xg::tensor<float>({1, 1, 1});
  const int op_line = __LINE__ + 1;
  auto p = xg::sum(x * w);
  w.assign(xg::tensor<float>({2, 2, 2}));
  auto msg2 = message_of<xg::AutogradError>([&] { p.backward(); });
  CHECK(contains(msg2, "Mul"));
  CHECK(contains(msg2, here(op_line)));

  // A leaf that requires grad, changed under no_grad after being saved, also trips the check.
  auto q = xg::sum(xg::square(x));
  {
    xg::no_grad guard;
    x -= 0.5f;
  }
  auto msg3 = message_of<xg::AutogradError>([&] { q.backward(); });
  CHECK(contains(msg3, "Square"));
}

TEST_CASE("autograd: version counter: changes to tensors the gradient does not read are fine") {
  auto x = xg::tensor<float>({1, 2, 3});
  auto y = xg::tensor<float>({4, 5, 6});
  x.set_requires_grad(true);
  auto z = xg::sum(x + y);  // Add reads neither input for its gradient
  {
    xg::no_grad guard;
    y += 100.0f;
  }
  z.backward();
  check_close(x.grad(), {1, 1, 1});
}

TEST_CASE("autograd: in-place update of a tensor that requires grad outside no_grad throws") {
  auto x = xg::tensor<float>({1, 2, 3});
  x.set_requires_grad(true);
  {
    const int line = __LINE__ + 1;
    auto msg = message_of<xg::AutogradError>([&] { x += 1.0f; });
    CHECK(contains(msg, "AssignAdd"));
    CHECK(contains(msg, here(line)));
  }
  CHECK_THROWS_AS(x *= xg::tensor<float>({2, 2, 2}), xg::AutogradError);
  CHECK_THROWS_AS(x.assign(xg::zeros<float>({3})), xg::AutogradError);
  // Nothing was written.
  CHECK(x.to_vector() == std::vector<float>{1, 2, 3});

  xg::Parameter<float> w(xg::ones<float>({2}), "w");
  CHECK_THROWS_AS(w -= 0.1f, xg::AutogradError);
  {
    xg::no_grad guard;
    w -= 0.25f;
  }
  CHECK(w.to_vector() == std::vector<float>{0.75f, 0.75f});
}

TEST_CASE("autograd: backward on a tensor that does not require grad throws a clear error") {
  auto x = xg::tensor<float>({1, 2, 3});
  {
    const int line = __LINE__ + 1;
    auto msg = message_of<xg::AutogradError>([&] { xg::sum(x * x).backward(); });
    CHECK(contains(msg, "backward"));
    CHECK(contains(msg, "requires grad"));
    CHECK(contains(msg, here(line)));
  }
  // Integer tensors carry no gradient.
  auto i = xg::tensor<std::int32_t>({1, 2});
  auto msg = message_of<xg::AutogradError>([&] { i.backward(); });
  CHECK(contains(msg, "Int32"));
  // AutogradError is a runtime_error.
  CHECK_THROWS_AS(x.backward(), std::runtime_error);
}
