// scan: the same values and gradients eagerly, under jit (one Scan node, one ScanGrad node for
// its gradient) and as the unrolled loop; reverse scans, tree carries, vmap and jvp, and the
// errors a user can meet.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <xgrad/xgrad.hpp>

#include "jit/jit_support.hpp"
#include "test_support.hpp"

namespace xg = xgrad;
using xgrad::testing::message_of;
namespace xgt = xgrad::testing;

namespace {

using T = xg::Tensor<double>;
using I32 = xg::Tensor<std::int32_t>;

/// The primitives of a jitted function's graph and of its subgraphs.
template <class F, class... Args> std::set<std::string, std::less<>> primitives_of(F f, const Args&... args) {
  std::set<std::string, std::less<>> seen;
  auto collect = [&seen](const xg::ir::Graph& g, auto& self) -> void {
    for (const auto& node : g.nodes) {
      seen.emplace(node->op());
      for (const auto& sub : node->subgraphs) self(*sub, self);
    }
  };
  collect(xg::jit(f).lower(args...).graph(), collect);
  return seen;
}

/// x[t] along the leading axis.
T row(const T& x, std::int64_t t) {
  auto begin = std::vector<std::int64_t>(static_cast<std::size_t>(x.ndim()), 0), size = x.shape().to_vector();
  begin[0] = t;
  size[0] = 1;
  return xg::reshape(xg::slice(x, begin, size), std::vector<std::int64_t>(size.begin() + 1, size.end()));
}

/// h_t = tanh(W x_t + U h_{t-1}) for a batch of rows: x_t [B, D] @ w [D, H], h [B, H] @ u [H, H].
T cell(const T& w, const T& u, const T& h, const T& x) { return xg::tanh(xg::matmul(x, w) + xg::matmul(h, u)); }

/// The RNN over xs [T, B, D] from h0 [B, H] with scan: the last state and every state [T, B, H].
std::pair<T, T> rnn_scan(const T& w, const T& u, const T& h0, const T& xs, bool reverse = false) {
  return xg::scan(
      [w, u](const T& h, const T& x) {
        auto next = cell(w, u, h, x);
        return std::pair{next, next};
      },
      h0, xs, {.reverse = reverse});
}

/// The same RNN as a C++ loop.
std::pair<T, T> rnn_unrolled(const T& w, const T& u, const T& h0, const T& xs, bool reverse = false) {
  const std::int64_t steps = xs.shape()[0];
  T h = h0;
  std::vector<T> hs(static_cast<std::size_t>(steps));
  for (std::int64_t k = 0; k < steps; ++k) {
    const std::int64_t t = reverse ? steps - 1 - k : k;
    h = cell(w, u, h, row(xs, t));
    hs[static_cast<std::size_t>(t)] = h;
  }
  return {h, xg::stack(hs, 0)};
}

/// A loss reading both outputs, so that the gradient flows from the last carry and from ys.
template <class Rnn> auto rnn_loss(Rnn rnn, bool reverse = false) {
  return [rnn, reverse](const T& w, const T& u, const T& h0, const T& xs) {
    auto [h, ys] = rnn(w, u, h0, xs, reverse);
    const auto steps = static_cast<double>(xs.shape()[0]);
    auto weights = xg::reshape(xg::arange<double>(1.0, steps + 1.0), {-1, 1, 1});  // each row its own cotangent
    return xg::sum(ys * ys * weights) + xg::sum(h * 0.5);
  };
}

struct RnnCase {
  T w = xg::tensor<double>({0.5, -0.3, 0.8, 0.1, -0.6, 0.4}, {2, 3});
  T u = xg::tensor<double>({0.2, -0.5, 0.3, 0.7, 0.1, -0.2, -0.4, 0.6, 0.25}, {3, 3});
  T h0 = xg::tensor<double>({0.1, -0.2, 0.3, 0.0, 0.5, -0.1}, {2, 3});
  T xs;
  explicit RnnCase(std::int64_t steps) {
    std::vector<double> v(static_cast<std::size_t>(steps * 4));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.3 * std::sin(1.7 * static_cast<double>(i) + 0.4);
    xs = xg::tensor<double>(v, {steps, 2, 2});
  }
};

void check_rnn(std::int64_t steps, bool reverse) {
  CAPTURE(steps);
  CAPTURE(reverse);
  RnnCase c(steps);
  auto scanned = [reverse](const T& w, const T& u, const T& h0, const T& xs) {
    return rnn_scan(w, u, h0, xs, reverse);
  };
  auto [h, ys] = scanned(c.w, c.u, c.h0, c.xs);
  auto [uh, uys] = rnn_unrolled(c.w, c.u, c.h0, c.xs, reverse);
  xgt::check_close(h, uh);
  xgt::check_close(ys, uys);
  auto [jh, jys] = xg::jit(scanned)(c.w, c.u, c.h0, c.xs);
  xgt::check_close(jh, uh);
  xgt::check_close(jys, uys);
  CHECK(primitives_of(scanned, c.w, c.u, c.h0, c.xs).count("Scan") == 1);

  const auto all = xg::argnums<0, 1, 2, 3>;
  auto expected = xg::grad(rnn_loss(rnn_unrolled, reverse), all)(c.w, c.u, c.h0, c.xs);
  auto eager = xg::grad(rnn_loss(rnn_scan, reverse), all)(c.w, c.u, c.h0, c.xs);
  auto jitted_grad = xg::jit(xg::grad(rnn_loss(rnn_scan, reverse), all));
  auto traced = jitted_grad(c.w, c.u, c.h0, c.xs);
  auto check_all = [](const auto& got, const auto& want) {
    xgt::check_close(std::get<0>(got), std::get<0>(want));
    xgt::check_close(std::get<1>(got), std::get<1>(want));
    xgt::check_close(std::get<2>(got), std::get<2>(want));
    xgt::check_close(std::get<3>(got), std::get<3>(want));
  };
  check_all(eager, expected);
  check_all(traced, expected);
  auto grad_ops = primitives_of(xg::grad(rnn_loss(rnn_scan, reverse), all), c.w, c.u, c.h0, c.xs);
  CHECK(grad_ops.count("Scan") == 1);
  CHECK(grad_ops.count("ScanGrad") == 1);
  // The gradient of a jitted function (one op on the tape) goes through ScanGrad too.
  check_all(xg::grad(xg::jit(rnn_loss(rnn_scan, reverse)), all)(c.w, c.u, c.h0, c.xs), expected);
}

}  // namespace

TEST_CASE("scan: a running sum equals cumsum, forwards and in reverse, eagerly and under jit") {
  auto xs = xg::tensor<double>({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2});
  for (bool reverse : {false, true}) {
    CAPTURE(reverse);
    auto running = [reverse](const T& x) {
      return xg::scan(
          [](const T& total, const T& x_t) {
            auto next = total + x_t;
            return std::pair{next, next};
          },
          xg::zeros<double>({2}), x, {.reverse = reverse});
    };
    const auto expected = xg::cumsum(xs, 0, reverse).to_vector();
    auto [total, ys] = running(xs);
    CHECK(ys.to_vector() == expected);
    CHECK(total.to_vector() == std::vector<double>{16, 20});
    auto [jtotal, jys] = xg::jit(running)(xs);
    CHECK(jys.to_vector() == expected);
    CHECK(jtotal.to_vector() == std::vector<double>{16, 20});
    const auto ir = xg::jit(running).lower(xs).ir();
    CHECK(ir.find("= Scan(") != std::string::npos);
    CHECK(ir.find(reverse ? "reverse=true" : "reverse=false") != std::string::npos);
    // The gradient of sum(ys) with respect to x_t counts the rows of ys that hold it.
    auto loss = [&running](const T& x) { return xg::sum(running(x).second); };
    const auto counts =
        reverse ? std::vector<double>{1, 1, 2, 2, 3, 3, 4, 4} : std::vector<double>{4, 4, 3, 3, 2, 2, 1, 1};
    CHECK(xg::grad(loss)(xs).to_vector() == counts);
    CHECK(xg::jit(xg::grad(loss))(xs).to_vector() == counts);
  }
}

TEST_CASE("scan: an RNN's states and gradients equal the unrolled loop's, eagerly and under jit") {
  check_rnn(5, false);
  check_rnn(5, true);
  check_rnn(1, false);  // one step
}

TEST_CASE("scan: the gradients against central differences") {
  RnnCase c(3);
  auto loss = rnn_loss(rnn_scan);
  auto jitted = xg::jit(xg::grad(loss, xg::argnums<1, 3>));
  auto [gu, gxs] = jitted(c.w, c.u, c.h0, c.xs);
  xgt::check_close(gu, xgt::numeric_grad([&](const T& v) { return loss(c.w, v, c.h0, c.xs); }, c.u), 1e-6);
  xgt::check_close(gxs, xgt::numeric_grad([&](const T& v) { return loss(c.w, c.u, c.h0, v); }, c.xs), 1e-6);
}

TEST_CASE("scan: no steps give the initial carry and ys with a leading axis of 0") {
  RnnCase c(0);
  auto [h, ys] = rnn_scan(c.w, c.u, c.h0, c.xs);
  CHECK(h.to_vector() == c.h0.to_vector());
  CHECK(ys.shape() == xg::Shape{0, 2, 3});
  auto [jh, jys] = xg::jit([](const T& w, const T& u, const T& h0, const T& xs) { return rnn_scan(w, u, h0, xs); })(
      c.w, c.u, c.h0, c.xs);
  CHECK(jh.to_vector() == c.h0.to_vector());
  CHECK(jys.shape() == xg::Shape{0, 2, 3});
  const auto all = xg::argnums<0, 1, 2, 3>;
  for (auto [gw, gu, gh, gxs] : {xg::grad(rnn_loss(rnn_scan), all)(c.w, c.u, c.h0, c.xs),
                                 xg::jit(xg::grad(rnn_loss(rnn_scan), all))(c.w, c.u, c.h0, c.xs)}) {
    CHECK(gw.to_vector() == std::vector<double>(6, 0.0));
    CHECK(gu.to_vector() == std::vector<double>(9, 0.0));
    CHECK(gh.to_vector() == std::vector<double>(6, 0.5));
    CHECK(gxs.shape() == xg::Shape{0, 2, 2});
  }
}

TEST_CASE("scan: carries, xs and y_t can be tuples; integer parts go along") {
  // carry (sum of a * b, step count), xs (a, b), y_t (a * b, count so far)
  using Carry = std::tuple<T, I32>;
  auto run = [](const T& a, const T& b) {
    return xg::scan(
        [](const Carry& c, const std::pair<T, T>& x) {
          auto product = x.first * x.second;
          auto count = std::get<1>(c) + 1;
          return std::pair{Carry{std::get<0>(c) + product, count}, std::tuple{product, count}};
        },
        Carry{xg::zeros<double>({2}), xg::zeros<std::int32_t>({})}, std::pair{a, b});
  };
  auto a = xg::tensor<double>({1, 2, 3, 4, 5, 6}, {3, 2}), b = xg::tensor<double>({2, 1, 0.5, -1, 1, 3}, {3, 2});
  for (const auto& [carry, ys] : {run(a, b), xg::jit(run)(a, b)}) {
    CHECK(std::get<0>(carry).to_vector() == std::vector<double>{8.5, 16});
    CHECK(std::get<1>(carry).item() == 3);
    CHECK(std::get<0>(ys).to_vector() == std::vector<double>{2, 2, 1.5, -4, 5, 18});
    CHECK(std::get<1>(ys).to_vector() == std::vector<std::int32_t>{1, 2, 3});
  }
  auto loss = [&run](const T& x, const T& y) {
    auto [carry, ys] = run(x, y);
    return xg::sum(std::get<0>(carry) * std::get<0>(carry)) + xg::sum(std::get<0>(ys));
  };
  auto [ga, gb] = xg::grad(loss, xg::argnums<0, 1>)(a, b);
  auto [ja, jb] = xg::jit(xg::grad(loss, xg::argnums<0, 1>))(a, b);
  xgt::check_close(ja, ga);
  xgt::check_close(jb, gb);
  // d/da_t of sum(total^2) + sum(a * b) is (2 total + 1) b_t.
  xgt::check_close(ga, (xg::reshape(xg::tensor<double>({8.5, 16}), {1, 2}) * 2.0 + 1.0) * b);
}

TEST_CASE("scan: inside vmap and jvp it runs as ops, with the values and derivatives of the loop") {
  RnnCase c(4);
  std::vector<double> v(3 * 16);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.4 * std::cos(0.9 * static_cast<double>(i));
  auto batch = xg::tensor<double>(v, {3, 4, 2, 2});  // three sequences
  auto states = [&c](const T& xs) { return rnn_scan(c.w, c.u, c.h0, xs).second; };
  auto mapped = xg::vmap(states);
  auto eager = mapped(batch);
  for (std::int64_t k = 0; k < 3; ++k) {
    CAPTURE(k);
    xgt::check_close(row(eager, k), rnn_unrolled(c.w, c.u, c.h0, row(batch, k)).second);
  }
  xgt::check_close(xg::jit(mapped)(batch), eager);
  CHECK(primitives_of(mapped, batch).count("Scan") == 0);
  // Per-sequence gradients with respect to W.
  auto loss_w = [&c](const T& w, const T& xs) { return rnn_loss(rnn_scan)(w, c.u, c.h0, xs); };
  auto per_sequence = xg::vmap(xg::grad(loss_w), xg::in_axes{xg::none, 0});
  auto grads = per_sequence(c.w, batch);
  xgt::check_close(xg::jit(per_sequence)(c.w, batch), grads);
  for (std::int64_t k = 0; k < 3; ++k) {
    auto unrolled = [&c](const T& w, const T& xs) { return rnn_loss(rnn_unrolled)(w, c.u, c.h0, xs); };
    xgt::check_close(row(grads, k), xg::grad(unrolled)(c.w, row(batch, k)));
  }

  // Forward mode along a direction of xs, against the unrolled loop and central differences.
  auto tangent = xg::full<double>({4, 2, 2}, 0.3) - c.xs;
  auto along = [&states](const T& xs, const T& t) { return xg::jvp(states, xs, t).second; };
  auto unrolled_states = [&c](const T& xs) { return rnn_unrolled(c.w, c.u, c.h0, xs).second; };
  auto expected = xg::jvp(unrolled_states, c.xs, tangent).second;
  xgt::check_close(along(c.xs, tangent), expected);
  xgt::check_close(xg::jit(along)(c.xs, tangent), expected);
  CHECK(primitives_of(along, c.xs, tangent).count("Scan") == 0);
  xgt::check_close(expected, (states(c.xs + tangent * 1e-6) - states(c.xs - tangent * 1e-6)) / 2e-6, 1e-6);
}

TEST_CASE("scan: the errors name Scan and say what is wrong") {
  auto step = [](const T& c, const T& x) { return std::pair{c + x, c}; };
  auto scalar = message_of<xg::ShapeError>([&] { xg::scan(step, xg::zeros<double>({}), xg::scalar<double>(1.0)); });
  CHECK(scalar.find("Scan: xs must have a leading axis to scan over, got a scalar f64[]") != std::string::npos);

  auto pair_step = [](const T& c, const std::pair<T, T>& x) { return std::pair{c + x.first + x.second, c}; };
  auto mismatched = message_of<xg::ShapeError>([&] {
    xg::scan(pair_step, xg::zeros<double>({}), std::pair{xg::zeros<double>({3}), xg::zeros<double>({4})});
  });
  CHECK(mismatched.find("Scan: the tensors of xs must have one leading axis (the number of steps): tensor 0 is "
                        "f64[3], tensor 1 is f64[4]") != std::string::npos);

  // A carry of another dtype or shape, eagerly and while tracing.
  auto to_float = [](const T& c, const T& x) { return std::pair{xg::cast<float>(c + x), c}; };
  auto xs = xg::ones<double>({3, 2});
  for (const auto& message :
       {message_of<xg::ShapeError>([&] { xg::scan(to_float, xg::zeros<double>({2}), xs); }),
        message_of<xg::TraceError>(
            [&] { xg::jit([&](const T& x) { return xg::scan(to_float, xg::zeros<double>({2}), x).second; })(xs); })})
    CHECK(message.find("Scan: the body returns (f32[2]) for a carry of (f64[2])") != std::string::npos);
  auto summed = message_of<xg::ShapeError>([&] {
    xg::scan([](const T& c, const T& x) { return std::pair{xg::sum(c + x), c}; }, xg::zeros<double>({2}), xs);
  });
  CHECK(summed.find("Scan: the body returns (f64[]) for a carry of (f64[2])") != std::string::npos);
  auto two = message_of<xg::ShapeError>([&] {
    xg::scan([](const T& c, const T& x) { return std::pair{std::pair{c, x}, c}; }, xg::zeros<double>({2}), xs);
  });
  CHECK(two.find("Scan: the body returns a carry of 2 tensors for a carry of 1") != std::string::npos);

  // A second-order gradient traced whole would differentiate the ScanGrad node.
  auto loss = [](const T& x) {
    return xg::sum(xg::scan(
                       [](const T& c, const T& x_t) {
                         auto next = xg::sin(c * x_t);
                         return std::pair{next, next};
                       },
                       xg::ones<double>({2}), x)
                       .second);
  };
  auto second = [loss](const T& x) { return xg::grad([loss](const T& y) { return xg::sum(xg::grad(loss)(y)); })(x); };
  auto msg = message_of<xg::AutogradError>([&] { xg::jit(second)(xs); });
  CHECK(msg.find("Scan: gradients of gradients through a traced loop are not supported") != std::string::npos);
  // Eagerly the tape sees every step, so the second gradient exists.
  CHECK(second(xs).shape() == xs.shape());
}

TEST_CASE("scan: vector carries, integer xs, a scan inside fori_loop, and no steps under vmap") {
  // carry {product, sum}, xs ({a, b}, integers k), y_t {2 product}
  auto run = [](const std::vector<T>& init, const std::vector<T>& xs, const I32& ks) {
    return xg::scan(
        [](const std::vector<T>& c, const std::pair<std::vector<T>, I32>& x) {
          std::vector<T> next{c[0] * x.first[0] + xg::cast<double>(x.second), c[1] + x.first[1]};
          return std::pair{next, std::vector<T>{next[0] * 2.0}};
        },
        init, std::pair{xs, ks});
  };
  auto a = xg::tensor<double>({1, 2, 3, 4, 5, 6}, {3, 2}), b = xg::ones<double>({3, 2});
  auto ks = xg::tensor<std::int32_t>({1, 2, 3});
  const std::vector<T> init{xg::ones<double>({2}), xg::zeros<double>({2})}, xs{a, b};
  for (const auto& [carry, ys] : {run(init, xs, ks), xg::jit(run)(init, xs, ks)}) {
    CHECK(carry[0].to_vector() == std::vector<double>{43, 87});  // ((1 a0 + 1) a1 + 2) a2 + 3
    CHECK(carry[1].to_vector() == std::vector<double>{3, 3});
    CHECK(ys.size() == 1);
    CHECK(ys[0].to_vector() == std::vector<double>{4, 6, 16, 28, 86, 174});
  }
  auto loss = [&run, ks](const T& x, const T& y) {
    auto [carry, ys] = run({x, x}, {y, y}, ks);
    return xg::sum(carry[0]) + xg::sum(ys[0] * ys[0]);
  };
  auto [gx, gy] = xg::grad(loss, xg::argnums<0, 1>)(xg::ones<double>({2}), a);
  auto [jx, jy] = xg::jit(xg::grad(loss, xg::argnums<0, 1>))(xg::ones<double>({2}), a);
  xgt::check_close(jx, gx);
  xgt::check_close(jy, gy);

  // The inner Scan node sits in the ForiLoop's body; its gradient in the ForiLoopGrad's pullback.
  auto nested = [](const T& w, const T& xs) {
    return xg::sum(xg::fori_loop(
        0, 2,
        [w, xs](I32, const T& h) {
          auto step = [w](const T& c, const T& x) {
            auto next = xg::tanh(c * w + x);
            return std::pair{next, next};
          };
          return xg::scan(step, h, xs).first;
        },
        xg::ones<double>({2})));
  };
  auto w = xg::tensor<double>({0.3, -0.7});
  xgt::check_close(xg::jit(xg::grad(nested))(w, a * 0.1), xg::grad(nested)(w, a * 0.1));
  CHECK(primitives_of(xg::grad(nested), w, a).count("ScanGrad") == 1);

  // No steps, each value of a vmap: ys still has its type.
  auto doubled = [](const T& x) {
    auto step = [](const T& c, const T& x_t) { return std::pair{c + x_t, c * 2.0}; };
    return xg::scan(step, xg::zeros<double>({2}), x).second;
  };
  auto empty = xg::zeros<double>({4, 0, 2});
  CHECK(xg::vmap(doubled)(empty).shape() == xg::Shape{4, 0, 2});
  CHECK(xg::jit(xg::vmap(doubled))(empty).shape() == xg::Shape{4, 0, 2});
}
