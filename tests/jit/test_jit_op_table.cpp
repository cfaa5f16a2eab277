// The op table through jit: every row traced and run as a graph gives the eager result bit
// for bit, and so do its gradients; random graphs built from the rows agree as well.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <type_traits>

#include "ops/op_table.hpp"

namespace xg = xgrad;
using namespace xgrad::testing;

namespace {

template <class T> std::vector<xg::Tensor<T>> inputs_for(const OpCase& c, std::uint64_t seed) {
  std::vector<xg::Tensor<T>> in;
  for (std::size_t k = 0; k < c.shapes.size(); ++k)
    in.push_back(to_tensor<T>(random_input(c.shapes[k], c.domains[k], seed + 31 * k)));
  return in;
}

/// Same shape and the same bits in every element (NaN included).
template <class T> void check_bitwise(const xg::Tensor<T>& got, const xg::Tensor<T>& expected) {
  REQUIRE(got.shape() == expected.shape());
  auto g = got.to_vector(), e = expected.to_vector();
  std::size_t mismatches = 0;
  std::string first;  // the first differing element, for the failure message
  for (std::size_t i = 0; i < g.size(); ++i)
    if (std::memcmp(&g[i], &e[i], sizeof(T)) != 0 && mismatches++ == 0)
      first = xg::detail::concat("element ", i, ": ", g[i], " vs ", e[i]);
  INFO(first);
  CHECK(mismatches == 0);
}

template <class T> void check_row_through_jit(const OpCase& c) {
  const auto& f = row_fn<T>(c);
  auto in = inputs_for<T>(c, 7);
  auto jitted = xg::jit([&f](std::vector<xg::Tensor<T>> xs) { return f(xs); }, {.level = xg::JitLevel::O0});
  check_bitwise(jitted(in), f(in));
  if (!c.differentiable) return;
  auto weights = to_tensor<T>(random_input(f(in).shape().to_vector(), Domain::any, 3));
  auto eager = loss_and_grads<T>(f, in, weights);
  auto traced = xg::jit([&f](std::vector<xg::Tensor<T>> xs, xg::Tensor<T> w) { return loss_and_grads<T>(f, xs, w); },
                        {.level = xg::JitLevel::O0})(in, weights);
  check_bitwise(traced.first, eager.first);
  REQUIRE(traced.second.size() == eager.second.size());
  for (std::size_t k = 0; k < eager.second.size(); ++k) check_bitwise(traced.second[k], eager.second[k]);
}

/// The primitives of a graph and of its subgraphs (fused bodies).
void collect_primitives(const xg::ir::Graph& g, std::set<std::string, std::less<>>& seen) {
  for (const auto& node : g.nodes) {
    seen.emplace(node->op());
    for (const auto& sub : node->subgraphs) collect_primitives(*sub, seen);
  }
}

}  // namespace

TEST_CASE("op table: every primitive is reached by a row, its gradient or its second gradient, at O0 or O2") {
  using T = double;
  std::set<std::string, std::less<>> seen;
  for (const auto& c : op_table()) {
    CAPTURE(c.name);
    const auto& f = row_fn<T>(c);
    const auto in = inputs_for<T>(c, 7);
    for (auto level : {xg::JitLevel::O0, xg::JitLevel::O2}) {
      const xg::JitConfig config{.level = level};
      collect_primitives(xg::jit([&f](std::vector<xg::Tensor<T>> xs) { return f(xs); }, config).lower(in).graph(),
                         seen);
      if (!c.differentiable) continue;
      const auto w = to_tensor<T>(random_input(f(in).shape().to_vector(), Domain::any, 3));
      for (std::size_t k = 0; k < in.size(); ++k) {
        if (!c.covers(k)) continue;
        // The first and second gradients of sum(f(x)^2 w) with respect to input k: squared, so
        // that the upstream gradient depends on x and the rules' own gradients are reached.
        auto loss = [&f, w, in, k](const xg::Tensor<T>& x) {
          auto xs = in;
          xs[k] = x;
          return xg::sum(xg::square(f(xs)) * w);
        };
        auto second = [loss](const xg::Tensor<T>& x) {
          return xg::grad([loss](const xg::Tensor<T>& y) { return xg::sum(xg::grad(loss)(y)); })(x);
        };
        CHECK_NOTHROW(collect_primitives(xg::jit(xg::grad(loss), config).lower(in[k]).graph(), seen));
        CHECK_NOTHROW(collect_primitives(xg::jit(second, config).lower(in[k]).graph(), seen));
      }
    }
  }
  // Graph structure, with cases of its own: constants, fused groups, control flow
  // (tests/jit/test_control_flow.cpp, tests/jit/test_scan.cpp), print
  // (tests/jit/test_jit_semantics.cpp) and the collectives, which need a process group
  // (tests/distributed/test_distributed.cpp).
  const std::set<std::string_view> structural{
      "Const",         "Fused",     "Cond",           "Scan",           "ForiLoop",           "While",
      "ForiLoopGrad",  "WhileGrad", "ScanGrad",       "Print",          "AllReduce",          "AllGather",
      "ReduceScatter", "Broadcast", "AllReduceStart", "AllGatherStart", "ReduceScatterStart", "BroadcastStart",
      "CollectiveWait"};
  std::string missing;
  for (std::string_view name : xg::ir::known_primitives())
    if (!seen.count(name) && !structural.count(name))
      missing += std::string(missing.empty() ? "" : ", ") + std::string(name);
  INFO("primitives no op-table row reaches: ", missing);
  CHECK(missing.empty());
}

TEST_CASE("op table through jit at O0: values and gradients equal eager bit for bit") {
  for (const auto& c : op_table()) {
    SUBCASE(c.name.c_str()) {
      check_row_through_jit<float>(c);
      check_row_through_jit<double>(c);
    }
  }
}

namespace {

/// A random program over the op table: each step applies one row to values made earlier
/// (of the row's input shapes) or to fresh inputs; the result sums every value weighted.
struct RandomProgram {
  struct Step {
    std::size_t row;
    std::vector<int> operands;  // value indices; negative: fresh input -1 - k
  };
  std::vector<std::vector<std::int64_t>> input_shapes;
  std::vector<Domain> input_domains;
  std::vector<Step> steps;

  static RandomProgram make(std::uint64_t seed, std::size_t num_steps) {
    const auto& table = op_table();
    std::mt19937_64 gen(seed);
    RandomProgram p;
    std::vector<std::vector<std::int64_t>> value_shapes;
    while (p.steps.size() < num_steps) {
      std::size_t row = gen() % table.size();
      const OpCase& c = table[row];
      if (!c.differentiable) continue;
      Step step{row, {}};
      for (std::size_t k = 0; k < c.shapes.size(); ++k) {
        std::vector<int> fits;
        for (std::size_t v = 0; v < value_shapes.size(); ++v)
          if (value_shapes[v] == c.shapes[k]) fits.push_back(static_cast<int>(v));
        // Mostly reuse values, so programs chain ops; inputs that need a domain stay fresh.
        if (!fits.empty() && c.domains[k] == Domain::any && gen() % 4 != 0) {
          step.operands.push_back(fits[gen() % fits.size()]);
        } else {
          step.operands.push_back(-1 - static_cast<int>(p.input_shapes.size()));
          p.input_shapes.push_back(c.shapes[k]);
          p.input_domains.push_back(c.domains[k]);
        }
      }
      value_shapes.push_back({});
      p.steps.push_back(step);
      // The output shape is known only by running the row: do it once on zeros.
      std::vector<xg::Tensor<double>> probe;
      for (const auto& s : c.shapes) probe.push_back(xg::zeros<double>(xg::Shape(s)));
      value_shapes.back() = c.f64(probe).shape().to_vector();
    }
    return p;
  }

  /// The weighted sum of all values; runs eagerly or traced, the same code.
  template <class T> xg::Tensor<T> run(const std::vector<xg::Tensor<T>>& inputs) const {
    const auto& table = op_table();
    std::vector<xg::Tensor<T>> values;
    xg::Tensor<T> total = xg::zeros<T>(xg::Shape{});
    for (std::size_t s = 0; s < steps.size(); ++s) {
      std::vector<xg::Tensor<T>> args;
      for (int o : steps[s].operands) args.push_back(o < 0 ? inputs[static_cast<std::size_t>(-1 - o)] : values[o]);
      values.push_back(row_fn<T>(table[steps[s].row])(args));
      total = total + xg::mean(values.back()) * static_cast<T>(s + 1);
    }
    return total;
  }
};

/// What non-strict rewrites keep: x + 0 may turn -0 into +0, and the sum of a broadcast,
/// k additions of one value, becomes one multiply by k, which rounds once instead of k times.
/// So: equal up to a few rounding errors, 1e-12 (double) or 1e-5 (float) of the tensor's
/// largest magnitude (at least 1); NaN where eager has NaN.
template <class T> void check_same_numbers(const xg::Tensor<T>& got, const xg::Tensor<T>& expected) {
  REQUIRE(got.shape() == expected.shape());
  auto g = got.to_vector(), e = expected.to_vector();
  double scale = 1;
  for (T v : e)
    if (std::isfinite(v)) scale = std::max(scale, std::abs(static_cast<double>(v)));
  const double tolerance = (std::is_same_v<T, float> ? 1e-5 : 1e-12) * scale;
  std::size_t mismatches = 0;
  std::string first;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const bool same = g[i] == e[i] || (std::isnan(g[i]) && std::isnan(e[i])) ||
                      std::abs(static_cast<double>(g[i]) - static_cast<double>(e[i])) <= tolerance;
    if (!same && mismatches++ == 0)
      first = "element " + std::to_string(i) + ": " + std::to_string(g[i]) + " against " + std::to_string(e[i]);
  }
  INFO("first mismatch: " << first);
  CHECK(mismatches == 0);
}

template <class T> void check_program(const RandomProgram& p, std::uint64_t seed,
                                      const xg::JitConfig& config = {.level = xg::JitLevel::O0}) {
  std::vector<xg::Tensor<T>> inputs;
  for (std::size_t k = 0; k < p.input_shapes.size(); ++k)
    inputs.push_back(to_tensor<T>(random_input(p.input_shapes[k], p.input_domains[k], seed + k)));
  auto value_and_grads = [&p](std::vector<xg::Tensor<T>> in) {
    for (auto& x : in) x = x.detach().set_requires_grad(true);
    return xg::value_and_grad([&] { return p.run<T>(in); }, in)();
  };
  auto eager = value_and_grads(inputs);
  auto traced = xg::jit(value_and_grads, config)(inputs);
  auto check = config.strict || config.level == xg::JitLevel::O0 ? check_bitwise<T> : check_same_numbers<T>;
  check(traced.first, eager.first);
  for (std::size_t k = 0; k < inputs.size(); ++k) check(traced.second[k], eager.second[k]);
}

}  // namespace

TEST_CASE("random graphs from the op table: jit equals eager in values and gradients") {
  for (std::uint64_t seed = 0; seed < 300; ++seed) {
    CAPTURE(seed);
    auto program = RandomProgram::make(seed, 2 + seed % 9);
    check_program<double>(program, seed);
    if (seed % 3 == 0) check_program<float>(program, seed);
  }
}

TEST_CASE("random graphs at every level, strict and not, and with each pass switched off") {
  std::vector<std::pair<std::string, xg::JitConfig>> configs{{"O1 strict", {.level = xg::JitLevel::O1, .strict = true}},
                                                             {"O2 strict", {.level = xg::JitLevel::O2, .strict = true}},
                                                             {"O1", {.level = xg::JitLevel::O1}},
                                                             {"O2", {.level = xg::JitLevel::O2}}};
  for (const auto& pass : xg::passes::pass_names())
    configs.push_back({"O2 without " + pass, {.level = xg::JitLevel::O2, .disabled_passes = {pass}}});
  // Freed arena buffers filled with NaN bytes: a kernel reading one after the plan gave it
  // away would change the (bitwise checked) results.
  configs.push_back(
      {"O2 strict, freed buffers poisoned", {.level = xg::JitLevel::O2, .strict = true, .poison_freed_buffers = true}});
  for (const auto& entry : configs) {  // no structured binding: clang 14 cannot capture one in CAPTURE
    const std::string& name = entry.first;
    const xg::JitConfig& config = entry.second;
    CAPTURE(name);
    for (std::uint64_t seed = 0; seed < 60; ++seed) {
      CAPTURE(seed);
      auto program = RandomProgram::make(1000 + seed, 2 + seed % 9);
      check_program<double>(program, seed, config);
      if (seed % 3 == 0) check_program<float>(program, seed, config);
    }
  }
}

namespace {

/// Same bits in every element, except that any NaN matches any NaN: IEEE 754 leaves a NaN's sign
/// and payload open (x86 makes a negative "default NaN" where an operand's NaN propagates with
/// its own bits), and a rewrite that swaps the operands of a commutative op may pick the other.
template <class T> void check_bitwise_any_nan(const xg::Tensor<T>& got, const xg::Tensor<T>& expected) {
  REQUIRE(got.shape() == expected.shape());
  auto g = got.to_vector(), e = expected.to_vector();
  std::size_t mismatches = 0;
  std::string first;
  for (std::size_t i = 0; i < g.size(); ++i)
    if (std::memcmp(&g[i], &e[i], sizeof(T)) != 0 && !(std::isnan(g[i]) && std::isnan(e[i])) && mismatches++ == 0)
      first = xg::detail::concat("element ", i, ": ", g[i], " vs ", e[i]);
  INFO(first);
  CHECK(mismatches == 0);
}

/// Row c with special-value inputs (NaN, ±inf, ±0, denormals; special_input) through jit with
/// `config`, one compiled function for every phase: values and gradients equal eager's, bit for
/// bit where the level keeps bits (O0, strict; NaN for NaN), else as numbers (check_same_numbers).
template <class T> void check_special_row_through_jit(const OpCase& c, const xg::JitConfig& config) {
  const auto& f = row_fn<T>(c);
  const bool bitwise = config.strict || config.level == xg::JitLevel::O0;
  auto check = bitwise ? check_bitwise_any_nan<T> : check_same_numbers<T>;
  auto forward = xg::jit([&f](std::vector<xg::Tensor<T>> xs) { return f(xs); }, config);
  auto backward =
      xg::jit([&f](std::vector<xg::Tensor<T>> xs, xg::Tensor<T> w) { return loss_and_grads<T>(f, xs, w); }, config);
  for (int phase = 0; phase < kSpecialPhases; phase += 3) {
    CAPTURE(phase);
    std::vector<xg::Tensor<T>> in;
    for (std::size_t k = 0; k < c.shapes.size(); ++k)
      in.push_back(to_tensor<T>(special_input(c.shapes[k], c.domains[k], 17 + 31 * k, k, phase)));
    check(forward(in), f(in));
    if (!c.differentiable) continue;
    auto weights = to_tensor<T>(random_input(f(in).shape().to_vector(), Domain::any, 3));
    auto eager = loss_and_grads<T>(f, in, weights);
    auto traced = backward(in, weights);
    check(traced.first, eager.first);
    REQUIRE(traced.second.size() == eager.second.size());
    for (std::size_t k = 0; k < eager.second.size(); ++k) check(traced.second[k], eager.second[k]);
  }
}

}  // namespace

TEST_CASE("op table with NaN, ±inf, ±0 and denormal inputs: jit at every level equals eager") {
  const std::vector<std::pair<std::string, xg::JitConfig>> configs{
      {"O0", {.level = xg::JitLevel::O0}},
      {"O1 strict", {.level = xg::JitLevel::O1, .strict = true}},
      {"O2 strict", {.level = xg::JitLevel::O2, .strict = true}},
      {"O2", {.level = xg::JitLevel::O2}}};
  for (const auto& entry : configs) {  // no structured binding: clang 14 cannot capture one in CAPTURE
    const std::string& name = entry.first;
    const xg::JitConfig& config = entry.second;
    CAPTURE(name);
    for (const auto& c : op_table()) {
      CAPTURE(c.name);
      check_special_row_through_jit<float>(c, config);
      check_special_row_through_jit<double>(c, config);
    }
  }
}
