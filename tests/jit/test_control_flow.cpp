// cond, while_loop and fori_loop: the same values and gradients eagerly and under jit,
// gradients against central differences, and the errors a user can meet.
#include <doctest/doctest.h>

#include <cmath>

#include <xgrad/xgrad.hpp>

#include "jit/jit_support.hpp"
#include "test_support.hpp"

namespace xg = xgrad;
using xgrad::testing::message_of;
namespace xgt = xgrad::testing;

namespace {

using T = xg::Tensor<double>;

constexpr auto program = &xgrad::testing::control_flow_program;

}  // namespace

TEST_CASE("control flow: values and gradients agree eagerly, under jit, and with central differences") {
  auto w = xg::tensor<double>({1.5, 0.5, -0.7});
  auto jitted = xg::jit(program);
  auto jitted_grad = xg::jit(xg::grad(program, xg::argnums<0, 1>));
  for (auto x : {xg::tensor<double>({0.3, -0.1, 0.5}), xg::tensor<double>({-0.3, -0.1, -0.5})}) {
    CAPTURE(x.to_vector());
    xgt::check_close(jitted(x, w), program(x, w));
    auto [gx, gw] = xg::grad(program, xg::argnums<0, 1>)(x, w);
    auto [jx, jw] = jitted_grad(x, w);
    xgt::check_close(jx, gx);
    xgt::check_close(jw, gw);
    xgt::check_close(gx, xgt::numeric_grad([&](const T& v) { return program(v, w); }, x), 1e-6);
    xgt::check_close(gw, xgt::numeric_grad([&](const T& v) { return program(x, v); }, w), 1e-6);
  }
  CHECK(jitted_grad.cache_size() == 1);  // both branches live in one graph
  auto ir = jitted.lower(xg::ones<double>({3}), w).ir();
  CHECK(ir.find("= Cond(") != std::string::npos);
  CHECK(ir.find("= ForiLoop(") != std::string::npos);
  CHECK(ir.find("= While(") != std::string::npos);
}

TEST_CASE("control flow: carries can be tuples, and loops run their trip count") {
  auto body = [](xg::Tensor<std::int32_t> i, std::pair<T, xg::Tensor<std::int32_t>> c) {
    return std::pair{c.first + xg::cast<double>(i), c.second + 1};
  };
  auto run = [&](const T& x) { return xg::fori_loop(2, 6, body, std::pair{x, xg::zeros<std::int32_t>({})}); };
  auto [sum, count] = xg::jit(run)(xg::zeros<double>({2}));
  CHECK(sum.to_vector() == std::vector<double>{14, 14});  // 2 + 3 + 4 + 5
  CHECK(count.item() == 4);
  auto [esum, ecount] = run(xg::zeros<double>({2}));
  CHECK(esum.to_vector() == sum.to_vector());

  auto halve = [](const T& x) {
    return xg::while_loop([](const T& v) { return xg::sum(v) > 1.0; }, [](const T& v) { return v * 0.5; }, x);
  };
  CHECK(xg::jit(halve)(xg::tensor<double>({8.0})).item() == 1.0);
  CHECK(halve(xg::tensor<double>({8.0})).item() == 1.0);
  // max_iters stops the loop even while the condition holds.
  auto bounded = [](const T& x) {
    return xg::while_loop([](const T&) { return xg::scalar<bool>(true); }, [](const T& v) { return v + 1.0; }, x,
                          {.max_iters = 7});
  };
  CHECK(xg::jit(bounded)(xg::tensor<double>({0.0})).item() == 7.0);
  CHECK(bounded(xg::tensor<double>({0.0})).item() == 7.0);
}

TEST_CASE("control flow: a gradient flows to what a loop body reads from outside, summed over iterations") {
  auto w = xg::tensor<double>({0.9, -0.4});
  auto f = [](const T& x, const T& v) {
    return xg::fori_loop(
        0, 4, [&v](xg::Tensor<std::int32_t>, const T& c) { return xg::sin(c * v) + c; }, x);
  };
  auto x = xg::tensor<double>({0.2, 0.7});
  auto eager = xg::grad(f, xg::argnums<1>)(x, w);
  xgt::check_close(xg::jit(xg::grad(f, xg::argnums<1>))(x, w), eager);
  xgt::check_close(eager, xgt::numeric_grad([&](const T& v) { return f(x, v); }, w), 1e-6);
}

TEST_CASE("control flow: the errors say what is wrong") {
  auto x = xg::ones<double>({3});
  auto mismatch = message_of<xg::TraceError>([&] {
    xg::jit([](const T& a) {
      return xg::cond(
          xg::sum(a) > 0.0, [](const T& v) { return v; }, [](const T& v) { return xg::sum(v, {0}, true); }, a);
    })(x);
  });
  CHECK(mismatch.find("Cond: the branches return different types: then (f64[3]), else (f64[1])") != std::string::npos);

  auto carry = message_of<xg::TraceError>([&] {
    xg::jit([](const T& a) {
      return xg::fori_loop(
          0, 2, [](xg::Tensor<std::int32_t>, const T& c) { return xg::sum(c); }, a);
    })(x);
  });
  CHECK(carry.find("ForiLoop: the body returns (f64[]) for a carry of (f64[3])") != std::string::npos);

  auto unbounded = [](const T& a) {
    return xg::sum(xg::while_loop([](const T& v) { return xg::sum(v) < 10.0; }, [](const T& v) { return v * 2.0; }, a));
  };
  auto msg = message_of<xg::AutogradError>([&] { xg::jit(xg::grad(unbounded))(x); });
  CHECK(msg.find("max_iters") != std::string::npos);
  // Eagerly the tape sees every iteration, so no bound is needed.
  xgt::check_close(xg::grad(unbounded)(x), xg::full<double>({3}, 4.0));  // two doublings: 3 -> 6 -> 12

  auto pred = message_of<xg::ShapeError>([&] {
    xg::cond(
        x > 0.0, [](const T& v) { return v; }, [](const T& v) { return v; }, x);
  });
  CHECK(pred.find("Cond: the predicate must be a bool tensor with one element, got Bool[3]") != std::string::npos);
}

TEST_CASE("control flow under vmap: a batched predicate picks value by value, eagerly and under jit") {
  auto w = xg::tensor<double>({1.5, 0.5, -0.7});
  // Rows take different branches and their while loops run different counts.
  auto xs = xg::tensor<double>({0.3, -0.1, 0.5, -0.3, -0.1, -0.5, 2.0, 1.0, 0.5}, {3, 3});
  auto mapped = xg::vmap(program, xg::in_axes{0, xg::none});
  auto eager = mapped(xs, w);
  for (std::int64_t b = 0; b < 3; ++b) {
    CAPTURE(b);
    auto row = xg::reshape(xg::slice(xs, {b, 0}, {1, 3}), {3});
    xgt::check_close(xg::reshape(xg::slice(eager, {b, 0}, {1, 3}), {3}), program(row, w), 1e-12);
  }
  xgt::check_close(xg::jit(mapped)(xs, w), eager, 1e-12);
  xgt::check_close(xg::vmap(xg::jit(program), xg::in_axes{0, xg::none})(xs, w), eager, 1e-12);
  // Traced inside vmap, control flow runs as ops of the graph: no Cond node, a select instead.
  auto ir = xg::jit(mapped).lower(xs, w).ir();
  CHECK(ir.find("= Cond(") == std::string::npos);
  CHECK(ir.find("= Select(") != std::string::npos);

  // A while loop whose condition depends on the value stops each value at its own count.
  auto halve = [](const T& x) {
    return xg::while_loop([](const T& v) { return xg::sum(v) > 1.0; }, [](const T& v) { return v * 0.5; }, x,
                          {.max_iters = 20});
  };
  auto starts = xg::tensor<double>({8.0, 0.5, 3.0}, {3, 1});
  const std::vector<double> halved{1.0, 0.5, 0.75};
  CHECK(xg::vmap(halve)(starts).to_vector() == halved);
  CHECK(xg::jit(xg::vmap(halve))(starts).to_vector() == halved);
}

TEST_CASE("control flow: per-example gradients, jvp, Jacobians and Hessians agree eagerly and under jit") {
  auto w = xg::tensor<double>({1.5, 0.5, -0.7});
  auto xs = xg::tensor<double>({0.3, -0.1, 0.5, -0.3, -0.1, -0.5}, {2, 3});
  auto loss = [](const T& x, const T& v) { return xg::sum(program(x, v)); };
  auto per_example = xg::vmap(xg::grad(loss, xg::argnums<1>), xg::in_axes{0, xg::none});
  auto eager = per_example(xs, w);
  xgt::check_close(xg::jit(per_example)(xs, w), eager, 1e-12);
  for (std::int64_t b = 0; b < 2; ++b) {
    auto row = xg::reshape(xg::slice(xs, {b, 0}, {1, 3}), {3});
    xgt::check_close(xg::reshape(xg::slice(eager, {b, 0}, {1, 3}), {3}), xg::grad(loss, xg::argnums<1>)(row, w), 1e-12);
  }

  for (auto x : {xg::tensor<double>({0.3, -0.1, 0.5}), xg::tensor<double>({-0.3, -0.1, -0.5})}) {
    CAPTURE(x.to_vector());
    auto of_x = [&w](const T& a) { return program(a, w); };
    auto v = xg::tensor<double>({0.2, -1.0, 0.4});
    auto tangent = [&](const T& a, const T& t) { return xg::jvp(of_x, a, t).second; };
    auto expected = (of_x(x + v * 1e-6) - of_x(x - v * 1e-6)) / 2e-6;
    xgt::check_close(tangent(x, v), expected, 1e-6);
    xgt::check_close(xg::jit(tangent)(x, v), tangent(x, v), 1e-12);

    auto jac = xg::jacrev(of_x)(x);
    xgt::check_close(xg::jacfwd(of_x)(x), jac, 1e-12);
    xgt::check_close(xg::jit(xg::jacrev(of_x))(x), jac, 1e-12);
    xgt::check_close(xg::jit(xg::jacfwd(of_x))(x), jac, 1e-12);
    auto scalar_f = [&w](const T& a) { return xg::sum(program(a, w)); };
    auto hess = xg::hessian(scalar_f)(x);
    xgt::check_close(xg::jit(xg::hessian(scalar_f))(x), hess, 1e-12);
    // Forward over reverse: the Hessian-vector product is the Hessian times v.
    auto hvp = [&](const T& a, const T& t) { return xg::jvp(xg::grad(scalar_f), a, t).second; };
    xgt::check_close(xg::jit(hvp)(x, v), xg::sum(hess * xg::reshape(v, {1, 3}), {1}), 1e-12);
  }

  auto unbounded = [](const T& a) {
    return xg::while_loop([](const T& v) { return xg::sum(v) < 10.0; }, [](const T& v) { return v * 2.0; }, a);
  };
  auto msg = message_of<xg::ValueError>([&] { xg::jit(xg::vmap(unbounded))(xg::ones<double>({2, 3})); });
  CHECK(msg.find("While") != std::string::npos);
  CHECK(msg.find("max_iters") != std::string::npos);
  // Eagerly a batched condition needs no bound: the loop runs while some value's holds.
  CHECK(xg::vmap(unbounded)(xg::tensor<double>({1.0, 4.0}, {2, 1})).to_vector() == std::vector<double>{16.0, 16.0});
}
