// Generic tests over the op table: values against plain loops at float and double, analytic
// gradients against central differences in double, second gradients (Hessian-vector products)
// against central differences of the analytic gradient, and forward mode (jvp) against central
// differences and reverse mode. Tolerances are the row's.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "ops/op_table.hpp"

namespace xg = xgrad;
using namespace xgrad::testing;

namespace {

std::vector<Ref> sample_inputs(const OpCase& c, std::uint64_t seed) {
  std::vector<Ref> in;
  for (std::size_t k = 0; k < c.shapes.size(); ++k)
    in.push_back(random_input(c.shapes[k], c.domains[k], seed + 97 * k));
  return in;
}

template <class T> std::vector<xg::Tensor<T>> to_tensors(const std::vector<Ref>& in) {
  std::vector<xg::Tensor<T>> out;
  for (const auto& r : in) out.push_back(to_tensor<T>(r));
  return out;
}

template <class T> void check_values(const OpCase& c, const std::vector<Ref>& in, double tolerance) {
  Ref expected = c.reference(in);
  auto got = [&] {
    if constexpr (std::is_same_v<T, float>)
      return c.f32(to_tensors<T>(in));
    else
      return c.f64(to_tensors<T>(in));
  }();
  REQUIRE(got.shape() == xg::Shape(expected.shape));
  auto values = got.to_vector();
  for (std::size_t i = 0; i < values.size(); ++i) {
    double e = expected.data[i];
    INFO("element " << i << ": got " << values[i] << ", expected " << e);
    CHECK(std::abs(static_cast<double>(values[i]) - e) <= tolerance * (1 + std::abs(e)));
  }
}

/// L(inputs) = sum(op(inputs) * weights): random weights make every output element count
/// differently, so a gradient routed to the wrong element cannot pass.
double weighted_loss(const OpCase& c, const std::vector<xg::Tensor<double>>& in, const xg::Tensor<double>& weights) {
  xg::no_grad off;
  return xg::sum(c.f64(in) * weights).item();
}

/// How far an analytic derivative is from its central-difference estimate, over one input.
struct Discrepancy {
  double diff = 0;  // |analytic - numeric|
  double norm = 0;  // the larger of |analytic| and |numeric|, element by element

  double relative() const { return diff / std::max(norm, 1e-30); }
  /// Within tolerance relative to the norm, and absolutely where the norm is below 1 (a zero
  /// derivative: both sides must be close to zero).
  bool within(double tolerance) const { return diff <= tolerance * std::max(norm, 1.0); }
};

Discrepancy discrepancy(const std::vector<double>& analytic, const std::vector<double>& numeric) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < analytic.size(); ++i) {
    diff += (analytic[i] - numeric[i]) * (analytic[i] - numeric[i]);
    norm += std::max(analytic[i] * analytic[i], numeric[i] * numeric[i]);
  }
  return {std::sqrt(diff), std::sqrt(norm)};
}

}  // namespace

TEST_CASE("op table: values match plain-loop references at float and double") {
  for (const auto& c : op_table()) {
    SUBCASE(c.name.c_str()) {
      auto in = sample_inputs(c, 11);
      check_values<float>(c, in, c.tol.f32);
      check_values<double>(c, in, c.tol.f64);
    }
  }
}

TEST_CASE("op table: analytic gradients match central differences in double") {
  for (const auto& c : op_table()) {
    if (!c.differentiable) continue;
    SUBCASE(c.name.c_str()) {
      auto refs = sample_inputs(c, 23);
      auto inputs = to_tensors<double>(refs);
      for (auto& x : inputs) x.set_requires_grad(true);
      auto out = c.f64(inputs);
      auto weights = to_tensor<double>(random_input(out.shape().to_vector(), Domain::any, 5));
      xg::sum(out * weights).backward();

      const double h = 1e-6;
      for (std::size_t k = 0; k < inputs.size(); ++k) {
        if (!c.covers(k)) continue;
        // No gradient reached an input (say, one only compared): its gradient is zero.
        auto analytic = inputs[k].grad().defined() ? inputs[k].grad() : xg::zeros_like(inputs[k]);
        REQUIRE(analytic.shape() == inputs[k].shape());
        std::vector<double> numeric(refs[k].data.size());
        for (std::size_t i = 0; i < numeric.size(); ++i) {
          auto probe = [&](double delta) {
            auto moved = refs;
            moved[k].data[i] += delta;
            return weighted_loss(c, to_tensors<double>(moved), weights);
          };
          numeric[i] = (probe(h) - probe(-h)) / (2 * h);
        }
        const Discrepancy d = discrepancy(analytic.to_vector(), numeric);
        INFO("input " << k << ": |analytic - numeric| / |gradient| = " << d.relative());
        CHECK(d.within(c.tol.grad));
      }
    }
  }
}

TEST_CASE("op table: Hessian-vector products match central differences of the gradient in double") {
  // With L(x) = sum(op(x) * w) and a random direction v (one tensor per covered input), autodiff
  // differentiates sum_k sum(dL/dx_k * v_k) once more, through the gradient rules' own
  // gradients: that is H v. Central differences of the analytic gradient along v estimate the
  // same: (grad L(x + h v) - grad L(x - h v)) / 2h. Piecewise-linear ops (relu, abs, max
  // pooling, ...) have H = 0 away from their kinks: both sides must then be zero.
  for (const auto& c : op_table()) {
    if (!c.differentiable) continue;
    SUBCASE(c.name.c_str()) {
      const auto x = to_tensors<double>(sample_inputs(c, 29));
      const auto weights = to_tensor<double>(random_input(c.f64(x).shape().to_vector(), Domain::any, 5));
      std::vector<xg::Tensor<double>> v, leaves, covered;
      for (std::size_t k = 0; k < x.size(); ++k) {
        v.push_back(c.covers(k) ? to_tensor<double>(random_input(c.shapes[k], Domain::any, 41 + 97 * k))
                                : xg::zeros_like(x[k]));
        leaves.push_back(x[k].detach().set_requires_grad(true));
        if (c.covers(k)) covered.push_back(leaves.back());
      }
      auto directional = [&] {  // sum_k sum(dL/dx_k * v_k), its graph recorded (nested transforms)
        const auto grads = loss_and_grads<double>(c.f64, leaves, weights).second;
        auto total = xg::zeros<double>(xg::Shape{});
        for (std::size_t k = 0; k < x.size(); ++k)
          if (c.covers(k)) total = total + xg::sum(grads[k] * v[k]);
        return total;
      };
      const auto hv = xg::value_and_grad(directional, covered)().second;  // H v, one per covered input

      // h near the cube root of double's epsilon, where the truncation error (~h^2) and the
      // rounding error (~eps / h) of the difference balance: over the table the largest relative
      // error measured 8e-11 at h = 2e-6, 1.3e-9 at h = 1e-5 (div, whose third derivative is large).
      const double h = 2e-6;
      auto gradient_at = [&](double step) {
        auto moved = x;
        for (std::size_t k = 0; k < x.size(); ++k) moved[k] = x[k] + v[k] * step;
        return loss_and_grads<double>(c.f64, moved, weights).second;
      };
      const auto plus = gradient_at(h), minus = gradient_at(-h);
      std::size_t j = 0;  // index into hv, which holds the covered inputs only
      for (std::size_t k = 0; k < x.size(); ++k) {
        if (!c.covers(k)) continue;
        const auto analytic = hv[j++];
        REQUIRE(analytic.shape() == x[k].shape());
        const auto p = plus[k].to_vector(), m = minus[k].to_vector();
        std::vector<double> numeric(p.size());
        for (std::size_t i = 0; i < p.size(); ++i) numeric[i] = (p[i] - m[i]) / (2 * h);
        const Discrepancy d = discrepancy(analytic.to_vector(), numeric);
        INFO("input " << k << ": |H v - numeric| / |H v| = " << d.relative() << " (|H v| = " << d.norm << ")");
        CHECK(d.within(c.tol.second_grad));
      }
    }
  }
}

TEST_CASE("op table: jvp matches central differences and the vjp, at float and double, eagerly and compiled") {
  // For random tangents v (one per covered input; zero for the others) forward mode gives J v.
  // Central differences of the op along v estimate the same, and for a random cotangent u the
  // reverse mode's J^T u must satisfy <u, J v> = sum_k <(J^T u)_k, v_k>.
  for (const auto& c : op_table()) {
    if (!c.differentiable) continue;
    SUBCASE(c.name.c_str()) {
      const auto x = to_tensors<double>(sample_inputs(c, 31));
      std::vector<xg::Tensor<double>> v;
      for (std::size_t k = 0; k < x.size(); ++k)
        v.push_back(c.covers(k) ? to_tensor<double>(random_input(c.shapes[k], Domain::any, 53 + 97 * k))
                                : xg::zeros_like(x[k]));
      const auto [y, jv] = xg::jvp(c.f64, x, v);
      REQUIRE(jv.shape() == y.shape());
      CHECK(y.to_vector() == c.f64(x).to_vector());

      const double h = 1e-6;
      auto at = [&](double step) {
        std::vector<xg::Tensor<double>> moved;
        for (std::size_t k = 0; k < x.size(); ++k) moved.push_back(x[k] + v[k] * step);
        return c.f64(moved).to_vector();
      };
      const auto plus = at(h), minus = at(-h);
      std::vector<double> numeric(plus.size());
      for (std::size_t i = 0; i < plus.size(); ++i) numeric[i] = (plus[i] - minus[i]) / (2 * h);
      const Discrepancy d = discrepancy(jv.to_vector(), numeric);
      INFO("|J v - numeric| / |J v| = " << d.relative());
      CHECK(d.within(c.tol.grad));

      // At float: the same tangent to float's precision.
      std::vector<xg::Tensor<float>> x32, v32;
      for (std::size_t k = 0; k < x.size(); ++k) {
        x32.push_back(xg::cast<float>(x[k]));
        v32.push_back(xg::cast<float>(v[k]));
      }
      const auto jv32 = xg::jvp(c.f32, x32, v32).second.to_vector();
      const Discrepancy d32 = discrepancy(std::vector<double>(jv32.begin(), jv32.end()), jv.to_vector());
      INFO("float: |J v - J v (double)| / |J v| = " << d32.relative());
      CHECK(d32.within(1e-4));

      const auto u = to_tensor<double>(random_input(y.shape().to_vector(), Domain::any, 7));
      const auto jtu = loss_and_grads<double>(c.f64, x, u).second;
      double forward = xg::sum(u * jv).item(), reverse = 0;
      for (std::size_t k = 0; k < x.size(); ++k)
        if (c.covers(k)) reverse += xg::sum(jtu[k] * v[k]).item();
      INFO("<u, J v> = " << forward << ", <J^T u, v> = " << reverse);
      CHECK(std::abs(forward - reverse) <= 1e-10 * std::max(1.0, std::abs(forward)));

      for (xg::JitLevel level : {xg::JitLevel::O0, xg::JitLevel::O1, xg::JitLevel::O2}) {
        CAPTURE(static_cast<int>(level));
        const OpFn<double>& f = c.f64;
        auto compiled = xg::jit([&f](std::vector<xg::Tensor<double>> xs,
                                     std::vector<xg::Tensor<double>> vs) { return xg::jvp(f, xs, vs).second; },
                                {.level = level});
        const Discrepancy dj = discrepancy(compiled(x, v).to_vector(), jv.to_vector());
        CHECK(dj.within(1e-12));
      }
    }
  }
}

namespace {

/// The row's op mapped by vmap over axis 0 of every input.
template <class T> xg::Tensor<T> vmapped(const OpFn<T>& f, const std::vector<xg::Tensor<T>>& xs) {
  using X = xg::Tensor<T>;
  switch (xs.size()) {
    case 1:
      return xg::vmap([&f](const X& a) { return f({a}); })(xs[0]);
    case 2:
      return xg::vmap([&f](const X& a, const X& b) { return f({a, b}); })(xs[0], xs[1]);
    case 3:
      return xg::vmap([&f](const X& a, const X& b, const X& c) { return f({a, b, c}); })(xs[0], xs[1], xs[2]);
  }
  throw std::logic_error("op table: a row with more than 3 inputs");
}

/// vmap of the row at T over a batch of 3 against the row applied to each of them, eagerly and
/// compiled at every level.
template <class T> void check_batching(const OpCase& c, double tolerance) {
  constexpr std::int64_t batch = 3;
  std::vector<xg::Tensor<T>> stacked;
  std::vector<std::vector<xg::Tensor<T>>> each(batch);
  for (std::size_t k = 0; k < c.shapes.size(); ++k) {
    std::vector<xg::Tensor<T>> samples;
    for (std::int64_t j = 0; j < batch; ++j) {
      samples.push_back(to_tensor<T>(random_input(c.shapes[k], c.domains[k], 61 + 97 * k + 13 * j)));
      each[j].push_back(samples.back());
    }
    stacked.push_back(xg::stack(samples, 0));
  }
  std::vector<xg::Tensor<T>> loop;
  for (const auto& in : each) loop.push_back(row_fn<T>(c)(in));
  const auto expected = xg::stack(loop, 0).to_vector();
  auto close = [&](const xg::Tensor<T>& got) {
    REQUIRE(got.numel() == static_cast<std::int64_t>(expected.size()));
    const auto values = got.to_vector();
    for (std::size_t i = 0; i < values.size(); ++i) {
      const double e = static_cast<double>(expected[i]);
      INFO("element " << i << ": got " << values[i] << ", the loop gave " << e);
      if (std::isnan(e))
        CHECK(std::isnan(static_cast<double>(values[i])));
      else
        CHECK(std::abs(static_cast<double>(values[i]) - e) <= tolerance * (1 + std::abs(e)));
    }
  };
  const auto got = vmapped<T>(row_fn<T>(c), stacked);
  CHECK(got.shape() == xg::stack(loop, 0).shape());
  close(got);
  for (xg::JitLevel level : {xg::JitLevel::O0, xg::JitLevel::O1, xg::JitLevel::O2}) {
    CAPTURE(static_cast<int>(level));
    const OpFn<T>& f = row_fn<T>(c);
    close(xg::jit([&f](std::vector<xg::Tensor<T>> xs) { return vmapped<T>(f, xs); }, {.level = level})(stacked));
  }
}

}  // namespace

TEST_CASE("op table: vmap matches a loop over the batch, at float and double, eagerly and compiled") {
  // Every input batched: the convolutions' batched weights take vmap's counted loop
  // (autograd: vmap's tests check the count); every other op its batching rule.
  for (const auto& c : op_table()) {
    SUBCASE(c.name.c_str()) {
      check_batching<float>(c, c.tol.f32);
      check_batching<double>(c, 1e-13);
    }
  }
}

TEST_CASE("op table: NaN, ±inf, ±0 and denormal inputs give the reference's values at float and double") {
  // Each phase puts special values at other places (special_input); the reference, plain loops
  // in double, says what IEEE 754 and NaN propagation (docs/NUMERICS.md) make of them.
  for (const auto& c : op_table()) {
    SUBCASE(c.name.c_str()) {
      for (int phase = 0; phase < kSpecialPhases; ++phase) {
        CAPTURE(phase);
        std::vector<Ref> in;
        for (std::size_t k = 0; k < c.shapes.size(); ++k)
          in.push_back(special_input(c.shapes[k], c.domains[k], 13 + 97 * k, k, phase));
        // Each type's reference starts from the inputs as that type holds them (1e-310 is 0 in
        // float) and is rounded to it at the end (1 / 1e-40f is inf in float).
        auto check = [&](const auto& got, const std::vector<Ref>& held, double tolerance) {
          using T = typename std::decay_t<decltype(got)>::value_type;
          const Ref expected = c.reference(held);
          REQUIRE(got.shape() == xg::Shape(expected.shape));
          const auto values = got.to_vector();
          std::size_t mismatches = 0;
          std::string first;
          for (std::size_t i = 0; i < values.size(); ++i)
            if (!matches_reference(static_cast<double>(values[i]),
                                   static_cast<double>(static_cast<T>(expected.data[i])), tolerance) &&
                mismatches++ == 0)
              first = xg::detail::concat("element ", i, ": got ", values[i], ", expected ", expected.data[i]);
          INFO(first);
          CHECK(mismatches == 0);
        };
        auto in_float = in;
        for (auto& r : in_float)
          for (auto& v : r.data) v = static_cast<float>(v);
        check(c.f32(to_tensors<float>(in)), in_float, c.tol.f32);
        check(c.f64(to_tensors<double>(in)), in, c.tol.f64);
      }
    }
  }
}
