// Generic tests over the op table: values against plain loops at float and double, and
// analytic gradients against central differences in double.
#include <doctest/doctest.h>

#include <cmath>

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

}  // namespace

TEST_CASE("op table: values match plain-loop references at float and double") {
  for (const auto& c : op_table()) {
    SUBCASE(c.name.c_str()) {
      auto in = sample_inputs(c, 11);
      check_values<float>(c, in, 2e-5);
      check_values<double>(c, in, 1e-12);
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
        // No gradient reached an input (say, one only compared): its gradient is zero.
        auto analytic = inputs[k].grad().defined() ? inputs[k].grad() : xg::zeros_like(inputs[k]);
        REQUIRE(analytic.shape() == inputs[k].shape());
        auto a = analytic.to_vector();
        double diff = 0, norm = 0;
        for (std::size_t i = 0; i < refs[k].data.size(); ++i) {
          auto probe = [&](double delta) {
            auto moved = refs;
            moved[k].data[i] += delta;
            return weighted_loss(c, to_tensors<double>(moved), weights);
          };
          double numeric = (probe(h) - probe(-h)) / (2 * h);
          diff += (a[i] - numeric) * (a[i] - numeric);
          norm += std::max(a[i] * a[i], numeric * numeric);
        }
        INFO("input " << k << ": |analytic - numeric| / |gradient| = " << std::sqrt(diff / std::max(norm, 1e-30)));
        CHECK(std::sqrt(diff) <= 1e-6 * std::max(std::sqrt(norm), 1.0));
      }
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
        check(c.f32(to_tensors<float>(in)), in_float, 2e-5);
        check(c.f64(to_tensors<double>(in)), in, 1e-12);
      }
    }
  }
}
