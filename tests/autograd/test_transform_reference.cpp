// The transforms against an independent reference: PyTorch's torch.autograd.functional
// (jacobian, hessian, jvp, vjp, hvp) on float64 functions with matmul, softmax, cross-entropy,
// conv2d, pooling and control flow, read from transform_reference.txt, which
// scripts/gen_transform_reference.py writes. Each function is written here again with xgrad's
// ops; its inputs, constants and PyTorch's results all come from the file.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <fstream>
#include <iomanip>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <xgrad/xgrad.hpp>

namespace xg = xgrad;

namespace {

using T = xg::Tensor<double>;

// Both libraries compute in float64 along the same chain of ops and differ in summation order
// and the last bits of the elementwise functions: 3e-13 relative at worst on these cases
// (measured on AMD EPYC with AVX-512).
constexpr double kTolerance = 1e-10;
// The generator's while loops run with Python's `while`, bounded as xgrad's here.
constexpr std::int64_t kMaxIters = 50;

struct Reference {
  std::vector<std::int64_t> shape;
  std::vector<double> values;
};

struct Case {
  std::string name;
  std::map<std::string, Reference> tensors;

  bool has(const std::string& key) const { return tensors.count(key) != 0; }
  const Reference& at(const std::string& key) const {
    const auto it = tensors.find(key);
    if (it == tensors.end()) FAIL("transform_reference.txt has no '" << key << "' for case " << name);
    return it->second;
  }
  T tensor(const std::string& key) const {
    const Reference& r = at(key);
    return xg::tensor<double>(r.values, xg::Shape(r.shape));
  }
};

std::vector<std::int64_t> parse_shape(const std::string& token, int line_number) {
  if (token.size() < 2 || token.front() != '[' || token.back() != ']')
    FAIL("transform_reference.txt:" << line_number << ": bad shape '" << token << "'");
  std::vector<std::int64_t> dims;
  std::istringstream in(token.substr(1, token.size() - 2));
  for (std::string dim; std::getline(in, dim, ',');) dims.push_back(std::stoll(dim));
  return dims;
}

std::map<std::string, Case> load_cases() {
  const std::string path = std::string(XGRAD_TESTS_DIR) + "/autograd/transform_reference.txt";
  std::ifstream file(path);
  if (!file) FAIL("cannot read " << path << ": scripts/gen_transform_reference.py writes it");
  std::map<std::string, Case> cases;
  int line_number = 0;
  for (std::string line; std::getline(file, line);) {
    ++line_number;
    if (line.empty() || line.front() == '#') continue;
    std::istringstream in(line);
    std::string case_name, key, shape;
    in >> case_name >> key >> shape;
    Reference r{parse_shape(shape, line_number), {}};
    for (double v; in >> v;) r.values.push_back(v);
    std::int64_t numel = 1;
    for (std::int64_t d : r.shape) numel *= d;
    if (!in.eof() || static_cast<std::int64_t>(r.values.size()) != numel)
      FAIL("transform_reference.txt:" << line_number << ": " << case_name << " " << key << " should hold " << numel
                                      << " numbers");
    Case& c = cases[case_name];
    c.name = case_name;
    c.tensors[key] = std::move(r);
  }
  return cases;
}

const Case& reference(const std::string& name) {
  static const std::map<std::string, Case> cases = load_cases();
  const auto it = cases.find(name);
  if (it == cases.end()) FAIL("transform_reference.txt has no case '" << name << "'");
  return it->second;
}

/// Agreement to kTolerance relative to each element, and to kTolerance of a thousandth of the
/// reference's largest magnitude for elements that cancel to (near) zero.
void check_matches(const std::string& label, const T& got, const Reference& want) {
  REQUIRE_MESSAGE(got.shape() == xg::Shape(want.shape),
                  label << ": shape " << got.shape() << ", PyTorch's " << xg::Shape(want.shape));
  const std::vector<double> v = got.to_vector();
  double scale = 0;
  for (double w : want.values) scale = std::max(scale, std::abs(w));
  auto excess = [&](std::size_t i) {
    return std::abs(v[i] - want.values[i]) - kTolerance * (std::abs(want.values[i]) + 1e-3 * scale);
  };
  std::size_t wrong = 0, worst = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    // Written so that a NaN counts as wrong.
    if (!(excess(i) <= 0)) {
      if (wrong == 0 || !(excess(i) <= excess(worst))) worst = i;
      ++wrong;
    }
  }
  std::ostringstream worst_text;
  worst_text << std::setprecision(17) << v[worst] << " where PyTorch gives " << want.values[worst];
  CHECK_MESSAGE(wrong == 0, label << ": " << wrong << " of " << v.size() << " elements differ by more than "
                                  << kTolerance << " relative; the worst, element " << worst << ", is "
                                  << worst_text.str());
}

template <class Out> std::vector<T> tensors_of(const Out& out) {
  if constexpr (std::is_same_v<Out, T>)
    return {out};
  else
    return std::apply([](const auto&... t) { return std::vector<T>{t...}; }, out);
}

struct RunMode {
  const char* name;
  bool jitted;
  xg::JitConfig config;
};

/// g(args...) eagerly and compiled at each level, its tensors against the references `keys`.
/// A throw is a failed check naming the transform and the mode, and the next mode runs.
template <class G, class Args> void check_everywhere(const Case& c, const std::string& what, G g, const Args& args,
                                                     const std::vector<std::string>& keys) {
  const std::vector<RunMode> modes{{"eager", false, {}},
                                   {"jit, default level (O2)", true, {}},
                                   {"jit O0", true, {.level = xg::JitLevel::O0}},
                                   {"jit O1", true, {.level = xg::JitLevel::O1}}};
  for (const RunMode& mode : modes) {
    const std::string label = c.name + ": " + what + ", " + mode.name;
    std::vector<T> got;
    try {
      got = mode.jitted ? tensors_of(std::apply(xg::jit(g, mode.config), args)) : tensors_of(std::apply(g, args));
    } catch (const std::exception& e) {
      FAIL_CHECK(label << " threw: " << e.what());
      continue;
    }
    REQUIRE(got.size() == keys.size());
    for (std::size_t k = 0; k < keys.size(); ++k) check_matches(label + ", " + keys[k], got[k], c.at(keys[k]));
  }
}

template <std::size_t... I> std::vector<std::string> numbered_keys(const std::string& stem) {
  return {(stem + std::to_string(I))...};
}

/// d2f / d arg_i d arg_j for each j: xg::hessian on the diagonal, jacfwd of jacrev off it.
template <std::size_t I, std::size_t... J, class F, class Args>
void check_hessian_row(const Case& c, F f, const Args& args) {
  auto block = [&]<std::size_t K>(std::integral_constant<std::size_t, K>) {
    const std::string key = "hessian" + std::to_string(I) + std::to_string(K);
    if constexpr (I == K)
      check_everywhere(c, "hessian", [f](const auto&... a) { return xg::hessian(f, xg::argnums<I>)(a...); }, args,
                       {key});
    else
      check_everywhere(
          c, "jacfwd(jacrev) block " + key,
          [f](const auto&... a) { return xg::jacfwd(xg::jacrev(f, xg::argnums<I>), xg::argnums<K>)(a...); }, args,
          {key});
  };
  (block(std::integral_constant<std::size_t, J>{}), ...);
}

/// Every transform of f (a function of the case's arguments arg0, arg1, ...) against PyTorch's.
template <class F, std::size_t... I> void check_transforms(const Case& c, F f, std::index_sequence<I...>) {
  const std::tuple args{c.tensor("arg" + std::to_string(I))...};
  const std::tuple args_and_tangents{c.tensor("arg" + std::to_string(I))...,
                                     c.tensor("tangent" + std::to_string(I))...};
  const std::tuple args_and_cotangent{c.tensor("arg" + std::to_string(I))..., c.tensor("cotangent")};
  constexpr std::size_t n = sizeof...(I);

  check_everywhere(c, "value", [f](const auto&... a) { return f(a...); }, args, {"value"});
  check_everywhere(
      c, "jacrev", [f](const auto&... a) { return xg::jacrev(f, xg::argnums<I...>)(a...); }, args,
      numbered_keys<I...>("jacobian"));
  check_everywhere(
      c, "jacfwd", [f](const auto&... a) { return xg::jacfwd(f, xg::argnums<I...>)(a...); }, args,
      numbered_keys<I...>("jacobian"));
  check_everywhere(c, "jvp",
                   [f](const auto&... at) {
                     const std::tuple all{at...};
                     return xg::jvp(f, std::tuple{std::get<I>(all)...}, std::tuple{std::get<n + I>(all)...}).second;
                   },
                   args_and_tangents, {"jvp"});
  check_everywhere(
      c, "vjp",
      [f](const auto&... au) {
        const std::tuple all{au...};
        return xg::vjp(f, std::get<I>(all)...).second(std::get<n>(all));
      },
      args_and_cotangent, numbered_keys<I...>("vjp"));

  // PyTorch's hessian and hvp take scalar functions only: the file has them exactly for those.
  const bool scalar = c.at("value").shape.empty();
  REQUIRE(c.has("hessian00") == scalar);
  if (!scalar) return;
  (check_hessian_row<I, I...>(c, f, args), ...);
  check_everywhere(
      c, "hvp as jvp(grad(f))",
      [f](const auto&... at) {
        const std::tuple all{at...};
        return xg::jvp(xg::grad(f, xg::argnums<I...>), std::tuple{std::get<I>(all)...},
                       std::tuple{std::get<n + I>(all)...})
            .second;
      },
      args_and_tangents, numbered_keys<I...>("hvp"));
}

template <class F> void check_unary(const Case& c, F f) { check_transforms(c, f, std::index_sequence<0>{}); }

}  // namespace

TEST_CASE("transform reference: matmul + tanh + sum (mlp_tanh)") {
  const Case& c = reference("mlp_tanh");
  const T weight = c.tensor("weight"), bias = c.tensor("bias");
  check_unary(c, [weight, bias](const T& x) { return xg::sum(xg::tanh(xg::matmul(x, weight) + bias)); });
}

TEST_CASE("transform reference: softmax and log_softmax over the last axis (softmax_rows)") {
  const Case& c = reference("softmax_rows");
  const T coef = c.tensor("coef");
  check_unary(c, [coef](const T& x) { return xg::softmax(x, -1) * coef + xg::log_softmax(x, -1) * 0.5; });
}

TEST_CASE("transform reference: softmax cross-entropy with fixed labels (cross_entropy)") {
  const Case& c = reference("cross_entropy");
  const T weight = c.tensor("weight"), coef = c.tensor("coef");
  const auto labels = xg::cast<std::int32_t>(c.tensor("labels"));
  check_unary(c, [weight, coef, labels](const T& x) {
    const T logits = xg::matmul(x, weight);
    return xg::softmax_cross_entropy(logits, labels, xg::Reduction::mean) + xg::sum(xg::softmax(logits, -1) * coef);
  });
}

TEST_CASE("transform reference: conv2d + bias + tanh + sum of squares (conv_tanh)") {
  const Case& c = reference("conv_tanh");
  const T weight = c.tensor("weight"), bias = c.tensor("bias");
  check_unary(c, [weight, bias](const T& x) {
    return xg::sum(xg::square(xg::tanh(xg::bias_add(xg::conv2d(x, weight), bias))));
  });
}

TEST_CASE("transform reference: padded conv2d, then max and average pooling (conv_pool)") {
  const Case& c = reference("conv_pool");
  const T weight = c.tensor("weight"), coef = c.tensor("coef");
  check_unary(c, [weight, coef](const T& x) {
    const T y = xg::conv2d(x, weight, {.padding = 1});
    const T peaks = xg::relu(xg::max_pool2d(y, 2, 2));
    return xg::sum(xg::square(peaks)) + xg::sum(xg::avg_pool2d(xg::tanh(y), 2, 2) * coef);
  });
}

TEST_CASE("transform reference: cond (first branch), fori_loop and while_loop (control_flow)") {
  const Case& c = reference("control_flow");
  const T weight = c.tensor("weight"), bias = c.tensor("bias");
  const double threshold = c.tensor("threshold").item();
  check_unary(c, [weight, bias, threshold](const T& x) {
    T y = xg::cond(
        xg::sum(x) > 0.0, [](const T& a) { return xg::tanh(a) * 2.0; }, [](const T& a) { return a * a - 1.0; }, x);
    y = xg::fori_loop(
        0, 3,
        [weight, bias](const xg::Tensor<std::int32_t>& i, const T& h) {
          return xg::tanh(xg::matmul(h, weight) + bias + xg::cast<double>(i) * 0.1);
        },
        y);
    y = xg::while_loop([threshold](const T& h) { return xg::sum(h * h) < threshold; },
                       [](const T& h) { return h * 1.5 + xg::sin(h) * 0.1; }, y, {.max_iters = kMaxIters});
    return xg::sum(y * y) * 0.5;
  });
}

TEST_CASE("transform reference: cond (second branch) and while_loop, a vector result (cond_else_while)") {
  const Case& c = reference("cond_else_while");
  const double threshold = c.tensor("threshold").item();
  check_unary(c, [threshold](const T& x) {
    const T y = xg::cond(
        xg::sum(x) > 0.0, [](const T& a) { return xg::sin(a) * 3.0; }, [](const T& a) { return a * a + a; }, x);
    return xg::while_loop([threshold](const T& h) { return xg::sum(h * h) > threshold; },
                          [](const T& h) { return h * 0.7 + xg::sin(xg::sum(h)) * 0.05; }, y, {.max_iters = kMaxIters});
  });
}

TEST_CASE("transform reference: a function of two arguments, every argnums (two_args)") {
  const Case& c = reference("two_args");
  check_transforms(
      c, [](const T& x, const T& w) { return xg::sum(xg::tanh(xg::matmul(x, w))); }, std::index_sequence<0, 1>{});
}
