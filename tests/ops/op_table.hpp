// The op table: one row per op case (inputs, the op, a plain-loop reference), shared by the
// generic value / gradient / shape tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <xgrad/xgrad.hpp>

namespace xgrad::testing {

/// A dense row-major double array: what references compute on.
struct Ref {
  std::vector<std::int64_t> shape;
  std::vector<double> data;

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  double& at(std::initializer_list<std::int64_t> idx) { return data[offset(idx)]; }
  double at(std::initializer_list<std::int64_t> idx) const { return data[offset(idx)]; }
  std::size_t offset(std::initializer_list<std::int64_t> idx) const {
    std::int64_t off = 0;
    std::size_t i = 0;
    for (auto v : idx) off = off * shape[i++] + v;
    return static_cast<std::size_t>(off);
  }
  static Ref zeros(std::vector<std::int64_t> shape) {
    Ref r{std::move(shape), {}};
    r.data.assign(static_cast<std::size_t>(r.numel()), 0.0);
    return r;
  }
};

/// Where an input's random values come from, so every op stays smooth near its inputs.
enum class Domain { any, positive, away_from_zero };

template <class T> using OpFn = std::function<Tensor<T>(const std::vector<Tensor<T>>&)>;

/// How close a row's results must come, as used by the generic tests of test_op_table.cpp. A row
/// that needs a looser bound sets it where it is made, with the measured reason beside it.
struct Tolerances {
  double f32 = 2e-5;          // values at float vs the reference, relative to 1 + |reference|
  double f64 = 1e-12;         // the same at double
  double grad = 1e-6;         // gradient vs central differences: norm of the difference / norm (at least 1)
  double second_grad = 1e-6;  // Hessian-vector product vs central differences of the gradient, the same way
};

struct OpCase {
  std::string name;
  std::vector<std::vector<std::int64_t>> shapes;  // one per input
  std::vector<Domain> domains;                    // one per input (defaults to any)
  OpFn<float> f32;
  OpFn<double> f64;
  std::function<Ref(const std::vector<Ref>&)> reference;
  bool differentiable = true;
  std::vector<bool> grad_inputs;  // which inputs the gradient checks cover (all if empty)
  Tolerances tol;

  /// Whether the gradient checks cover input k.
  bool covers(std::size_t k) const { return grad_inputs.empty() || grad_inputs[k]; }
};

template <class T> const OpFn<T>& row_fn(const OpCase& c) {
  if constexpr (std::is_same_v<T, float>)
    return c.f32;
  else
    return c.f64;
}

/// Gradients of sum(op(in) * weights) with respect to every input, by value_and_grad. An input
/// that already requires grad is used as it is, so that an enclosing value_and_grad over it can
/// differentiate these gradients again; any other becomes a fresh leaf.
template <class T> std::pair<Tensor<T>, std::vector<Tensor<T>>> loss_and_grads(const OpFn<T>& f,
                                                                               std::vector<Tensor<T>> in,
                                                                               const Tensor<T>& weights) {
  for (auto& x : in)
    if (!x.requires_grad()) x = x.detach().set_requires_grad(true);
  return value_and_grad([&] { return sum(f(in) * weights); }, in)();
}

/// One row from a generic callable usable at float and double.
template <class F> OpCase make_case(std::string name, std::vector<std::vector<std::int64_t>> shapes, F f,
                                    std::function<Ref(const std::vector<Ref>&)> reference,
                                    std::vector<Domain> domains = {}, bool differentiable = true) {
  OpCase c;
  c.name = std::move(name);
  c.shapes = std::move(shapes);
  c.domains = domains.empty() ? std::vector<Domain>(c.shapes.size(), Domain::any) : std::move(domains);
  c.f32 = [f](const std::vector<Tensor<float>>& in) { return f(in); };
  c.f64 = [f](const std::vector<Tensor<double>>& in) { return f(in); };
  c.reference = std::move(reference);
  c.differentiable = differentiable;
  return c;
}

/// Random values for one input, drawn from its domain.
inline Ref random_input(const std::vector<std::int64_t>& shape, Domain domain, std::uint64_t seed) {
  Ref r = Ref::zeros(shape);
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (auto& v : r.data) {
    double x = u(gen);
    if (domain == Domain::positive) x = 0.5 + std::abs(x);
    if (domain == Domain::away_from_zero) x = (x < 0 ? -0.3 : 0.3) + 0.7 * x;
    v = x;
  }
  return r;
}

/// The values of the special-value columns (NaN, ±inf, ±0, denormals, 1). All but the double
/// denormal are exact in float; in float that one is 0.
inline const std::vector<double>& special_values() {
  static const std::vector<double> values{std::numeric_limits<double>::quiet_NaN(),
                                          std::numeric_limits<double>::infinity(),
                                          -std::numeric_limits<double>::infinity(),
                                          -0.0,
                                          0.0,
                                          static_cast<double>(1e-40f),   // a float denormal
                                          static_cast<double>(-3e-42f),  // a negative one
                                          1e-310,                        // a double denormal
                                          1.0};
  return values;
}

/// Phases of special_input: over them every element of every input takes each special value.
inline constexpr int kSpecialPhases = 18;  // twice the number of special values

/// random_input with about half its elements replaced by special values. Input k walks the
/// values at stride k + 1, so over the phases the inputs of a binary op meet in many pairs
/// (NaN and inf, inf and -inf, -0 and +0, ...) and a one-element input takes every value.
inline Ref special_input(const std::vector<std::int64_t>& shape, Domain domain, std::uint64_t seed, std::size_t k,
                         int phase) {
  Ref r = random_input(shape, domain, seed);
  const auto& specials = special_values();
  const auto m = static_cast<std::int64_t>(specials.size());
  for (std::int64_t i = 0; i < r.numel(); ++i) {
    const std::int64_t slot =
        (i * static_cast<std::int64_t>(k + 1) + phase + 5 * static_cast<std::int64_t>(k)) % (2 * m);
    if (slot < m) r.data[static_cast<std::size_t>(i)] = specials[static_cast<std::size_t>(slot)];
  }
  return r;
}

/// Whether got matches the reference value want: NaN only for NaN, an infinity only for the same
/// one, finite values within tolerance * (1 + |want|) (a float denormal's difference from the
/// double result is far below that; the sign of a zero is not compared).
inline bool matches_reference(double got, double want, double tolerance) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  if (std::isinf(want) || std::isinf(got)) return got == want;
  return std::abs(got - want) <= tolerance * (1 + std::abs(want));
}

template <class T> Tensor<T> to_tensor(const Ref& r) {
  std::vector<T> values(r.data.begin(), r.data.end());
  return tensor<T>(values, Shape(r.shape));
}

template <class T> Ref to_ref(const Tensor<T>& t) {
  Ref r{t.shape().to_vector(), {}};
  auto v = t.to_vector();
  r.data.assign(v.begin(), v.end());
  return r;
}

/// NumPy-broadcast elementwise map over reference arrays.
inline Ref broadcast_map(const std::vector<Ref>& in, const std::function<double(const std::vector<double>&)>& f) {
  std::size_t rank = 0;
  for (const auto& r : in) rank = std::max(rank, r.shape.size());
  std::vector<std::int64_t> shape(rank, 1);
  for (const auto& r : in)
    for (std::size_t i = 0; i < r.shape.size(); ++i) {
      auto& d = shape[rank - r.shape.size() + i];
      if (r.shape[i] != 1) d = r.shape[i];
    }
  Ref out = Ref::zeros(shape);
  std::vector<double> args(in.size());
  for (std::int64_t flat = 0; flat < out.numel(); ++flat) {
    for (std::size_t k = 0; k < in.size(); ++k) {
      std::int64_t rem = flat, off = 0, stride = 1;
      for (std::size_t i = rank; i-- > 0;) {
        std::int64_t idx = rem % shape[i];
        rem /= shape[i];
        std::size_t lead = rank - in[k].shape.size();
        if (i >= lead) {
          std::int64_t d = in[k].shape[i - lead];
          off += (d == 1 ? 0 : idx) * stride;
          stride *= d;
        }
      }
      args[k] = in[k].data[static_cast<std::size_t>(off)];
    }
    out.data[static_cast<std::size_t>(flat)] = f(args);
  }
  return out;
}

/// Every row of the table (defined in op_table.cpp).
const std::vector<OpCase>& op_table();

}  // namespace xgrad::testing
