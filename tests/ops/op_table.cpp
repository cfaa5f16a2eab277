// The rows of the op table: each op with sample shapes and a plain-loop reference.
#include "ops/op_table.hpp"

#include <algorithm>
#include <limits>
#include <numbers>

namespace xgrad::testing {

namespace {

/// The reference for random_uniform: splitmix64's finalizer, written here from its published
/// constants rather than taken from the library.
std::uint64_t splitmix64_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

using Shapes = std::vector<std::vector<std::int64_t>>;
using D = Domain;

std::function<Ref(const std::vector<Ref>&)> elementwise(std::function<double(const std::vector<double>&)> f) {
  return [f](const std::vector<Ref>& in) { return broadcast_map(in, f); };
}

// NaN propagates through max and min as in NumPy (std::max and std::min drop it or not
// depending on the argument order).
double nan_max(double a, double b) { return std::isnan(a) || std::isnan(b) ? std::nan("") : std::max(a, b); }
double nan_min(double a, double b) { return std::isnan(a) || std::isnan(b) ? std::nan("") : std::min(a, b); }

// ---- references for the non-elementwise ops, in plain loops ----

/// Reduces axes of x (all when empty) with `combine` from `init`; keepdims keeps size-1 axes.
Ref reduce_ref(const Ref& x, std::vector<std::int64_t> axes, bool keepdims, double init,
               const std::function<double(double, double)>& combine, bool average = false) {
  const std::size_t rank = x.shape.size();
  std::vector<bool> red(rank, axes.empty());
  for (auto a : axes) red[static_cast<std::size_t>(a < 0 ? a + static_cast<std::int64_t>(rank) : a)] = true;
  std::vector<std::int64_t> kept(rank), out_shape;
  std::int64_t count = 1;
  for (std::size_t i = 0; i < rank; ++i) {
    kept[i] = red[i] ? 1 : x.shape[i];
    if (red[i]) count *= x.shape[i];
    if (!red[i] || keepdims) out_shape.push_back(kept[i]);
  }
  Ref acc = Ref::zeros(kept);
  std::fill(acc.data.begin(), acc.data.end(), init);
  for (std::int64_t flat = 0; flat < x.numel(); ++flat) {
    std::int64_t rem = flat, off = 0, stride = 1;
    for (std::size_t i = rank; i-- > 0;) {
      std::int64_t idx = rem % x.shape[i];
      rem /= x.shape[i];
      off += (red[i] ? 0 : idx) * stride;
      stride *= kept[i];
    }
    auto& slot = acc.data[static_cast<std::size_t>(off)];
    slot = combine(slot, x.data[static_cast<std::size_t>(flat)]);
  }
  if (average)
    for (auto& v : acc.data) v /= static_cast<double>(count);
  acc.shape = out_shape;
  return acc;
}

/// [B, M, K] x [K, N], [M, K] x [K, N], or [B, M, K] x [B, K, N] (each matrix its own).
Ref matmul_ref(const Ref& a, const Ref& b) {
  std::int64_t batch = a.shape.size() == 3 ? a.shape[0] : 1;
  const std::int64_t b_stride = b.shape.size() == 3 ? b.shape[1] * b.shape[2] : 0;
  std::int64_t m = a.shape[a.shape.size() - 2], k = a.shape.back(), n = b.shape.back();
  auto shape = a.shape;
  shape.back() = n;
  Ref out = Ref::zeros(shape);
  for (std::int64_t p = 0; p < batch; ++p)
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::int64_t q = 0; q < k; ++q)
          s += a.data[static_cast<std::size_t>((p * m + i) * k + q)] *
               b.data[static_cast<std::size_t>(p * b_stride + q * n + j)];
        out.data[static_cast<std::size_t>((p * m + i) * n + j)] = s;
      }
  return out;
}

Ref transpose2_ref(const Ref& a) {
  Ref out = Ref::zeros({a.shape[1], a.shape[0]});
  for (std::int64_t i = 0; i < a.shape[0]; ++i)
    for (std::int64_t j = 0; j < a.shape[1]; ++j) out.at({j, i}) = a.at({i, j});
  return out;
}

Ref conv_ref(const Ref& x, const Ref& w, std::int64_t stride, std::int64_t pad_top, std::int64_t pad_left,
             std::int64_t dil, std::int64_t oh, std::int64_t ow) {
  Ref y = Ref::zeros({x.shape[0], w.shape[0], oh, ow});
  for (std::int64_t n = 0; n < x.shape[0]; ++n)
    for (std::int64_t o = 0; o < w.shape[0]; ++o)
      for (std::int64_t i = 0; i < oh; ++i)
        for (std::int64_t j = 0; j < ow; ++j) {
          double s = 0;
          for (std::int64_t c = 0; c < x.shape[1]; ++c)
            for (std::int64_t p = 0; p < w.shape[2]; ++p)
              for (std::int64_t q = 0; q < w.shape[3]; ++q) {
                // Zero padding: a tap outside x reads a 0 that multiplies the weight (0 * inf is NaN).
                std::int64_t r = i * stride - pad_top + p * dil, t = j * stride - pad_left + q * dil;
                const bool inside = r >= 0 && r < x.shape[2] && t >= 0 && t < x.shape[3];
                s += (inside ? x.at({n, c, r, t}) : 0.0) * w.at({o, c, p, q});
              }
          y.at({n, o, i, j}) = s;
        }
  return y;
}

Ref pool_ref(const Ref& x, std::int64_t k, std::int64_t s, bool is_max) {
  std::int64_t oh = (x.shape[2] - k) / s + 1, ow = (x.shape[3] - k) / s + 1;
  Ref y = Ref::zeros({x.shape[0], x.shape[1], oh, ow});
  for (std::int64_t n = 0; n < x.shape[0]; ++n)
    for (std::int64_t c = 0; c < x.shape[1]; ++c)
      for (std::int64_t i = 0; i < oh; ++i)
        for (std::int64_t j = 0; j < ow; ++j) {
          double acc = is_max ? -std::numeric_limits<double>::infinity() : 0.0;
          for (std::int64_t p = 0; p < k; ++p)
            for (std::int64_t q = 0; q < k; ++q) {
              double v = x.at({n, c, i * s + p, j * s + q});
              acc = is_max ? nan_max(acc, v) : acc + v;
            }
          y.at({n, c, i, j}) = is_max ? acc : acc / static_cast<double>(k * k);
        }
  return y;
}

Ref resize_ref(const Ref& x, std::int64_t oh, std::int64_t ow) {  // half-pixel centres, clamped
  Ref y = Ref::zeros({x.shape[0], x.shape[1], oh, ow});
  auto src = [](std::int64_t o, std::int64_t in, std::int64_t out, std::int64_t& i0, std::int64_t& i1, double& f) {
    double c = std::max(0.0, (static_cast<double>(o) + 0.5) * static_cast<double>(in) / static_cast<double>(out) - 0.5);
    i0 = std::min<std::int64_t>(static_cast<std::int64_t>(c), in - 1);
    i1 = std::min<std::int64_t>(i0 + 1, in - 1);
    f = c - static_cast<double>(i0);
  };
  for (std::int64_t n = 0; n < x.shape[0]; ++n)
    for (std::int64_t c = 0; c < x.shape[1]; ++c)
      for (std::int64_t i = 0; i < oh; ++i)
        for (std::int64_t j = 0; j < ow; ++j) {
          std::int64_t r0, r1, c0, c1;
          double fr, fc;
          src(i, x.shape[2], oh, r0, r1, fr);
          src(j, x.shape[3], ow, c0, c1, fc);
          // On a source pixel (fraction 0) the value is that pixel, whatever its neighbour holds.
          auto lerp = [](double a, double b, double f) { return f == 0 ? a : a * (1 - f) + b * f; };
          y.at({n, c, i, j}) = lerp(lerp(x.at({n, c, r0, c0}), x.at({n, c, r0, c1}), fc),
                                    lerp(x.at({n, c, r1, c0}), x.at({n, c, r1, c1}), fc), fr);
        }
  return y;
}

Ref log_softmax_ref(const Ref& x) {  // over the last axis
  Ref y = x;
  std::int64_t c = x.shape.back(), rows = x.numel() / c;
  for (std::int64_t r = 0; r < rows; ++r) {
    double m = -std::numeric_limits<double>::infinity(), s = 0;
    for (std::int64_t j = 0; j < c; ++j) m = std::max(m, x.data[static_cast<std::size_t>(r * c + j)]);
    for (std::int64_t j = 0; j < c; ++j) s += std::exp(x.data[static_cast<std::size_t>(r * c + j)] - m);
    for (std::int64_t j = 0; j < c; ++j) y.data[static_cast<std::size_t>(r * c + j)] -= m + std::log(s);
  }
  return y;
}

/// Over the last axis, with the biased variance; gamma and beta (when given) of the last axis's size.
Ref layer_norm_ref(const Ref& x, const Ref* gamma = nullptr, const Ref* beta = nullptr, double eps = 1e-5) {
  Ref y = x;
  const std::int64_t c = x.shape.back(), rows = x.numel() / c;
  for (std::int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (std::int64_t j = 0; j < c; ++j) mean += x.data[static_cast<std::size_t>(r * c + j)] / static_cast<double>(c);
    for (std::int64_t j = 0; j < c; ++j) {
      const double d = x.data[static_cast<std::size_t>(r * c + j)] - mean;
      var += d * d / static_cast<double>(c);
    }
    for (std::int64_t j = 0; j < c; ++j) {
      double& v = y.data[static_cast<std::size_t>(r * c + j)];
      v = (v - mean) / std::sqrt(var + eps);
      if (gamma) v = v * gamma->data[static_cast<std::size_t>(j)] + beta->data[static_cast<std::size_t>(j)];
    }
  }
  return y;
}

/// softmax(q k^T * scale) v over the last two axes, scale 1 / sqrt(D) unless given; under
/// `causal` query i sees keys j <= i + Tk - Tq only, and a query that sees none gets zeros.
Ref attention_ref(const Ref& q, const Ref& k, const Ref& v, bool causal, double scale = 0) {
  const std::size_t rank = q.shape.size();
  const std::int64_t tq = q.shape[rank - 2], d = q.shape[rank - 1], tk = k.shape[rank - 2], dv = v.shape[rank - 1];
  const std::int64_t batch = q.numel() / (tq * d);
  if (scale == 0) scale = 1 / std::sqrt(static_cast<double>(d));
  std::vector<std::int64_t> shape = q.shape;
  shape.back() = dv;
  Ref out = Ref::zeros(shape);
  auto at = [](const Ref& r, std::int64_t i) { return r.data[static_cast<std::size_t>(i)]; };
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t i = 0; i < tq; ++i) {
      const std::int64_t end = causal ? std::clamp<std::int64_t>(i + tk - tq + 1, 0, tk) : tk;
      if (end == 0) continue;
      std::vector<double> p(static_cast<std::size_t>(end));
      for (std::int64_t j = 0; j < end; ++j) {
        double dot = 0;
        for (std::int64_t c = 0; c < d; ++c) dot += at(q, (b * tq + i) * d + c) * at(k, (b * tk + j) * d + c);
        p[static_cast<std::size_t>(j)] = dot * scale;
      }
      const double m = *std::max_element(p.begin(), p.end());
      double total = 0;
      for (auto& e : p) total += e = std::exp(e - m);
      for (std::int64_t j = 0; j < end; ++j)
        for (std::int64_t c = 0; c < dv; ++c)
          out.data[static_cast<std::size_t>((b * tq + i) * dv + c)] +=
              p[static_cast<std::size_t>(j)] / total * at(v, (b * tk + j) * dv + c);
    }
  return out;
}

Ref copy_block(const Ref& x, std::vector<std::int64_t> begin, std::vector<std::int64_t> size) {
  Ref y = Ref::zeros(size);
  for (std::int64_t flat = 0; flat < y.numel(); ++flat) {
    std::int64_t rem = flat, off = 0, stride = 1;
    for (std::size_t i = size.size(); i-- > 0;) {
      off += (rem % size[i] + begin[i]) * stride;
      rem /= size[i];
      stride *= x.shape[i];
    }
    y.data[static_cast<std::size_t>(flat)] = x.data[static_cast<std::size_t>(off)];
  }
  return y;
}

Ref permute_ref(const Ref& x, const std::vector<std::int64_t>& perm) {
  std::vector<std::int64_t> shape;
  for (auto p : perm) shape.push_back(x.shape[static_cast<std::size_t>(p)]);
  Ref y = Ref::zeros(shape);
  std::vector<std::int64_t> xs(x.shape.size(), 1);
  for (std::size_t i = x.shape.size() - 1; i-- > 0;) xs[i] = xs[i + 1] * x.shape[i + 1];
  for (std::int64_t flat = 0; flat < y.numel(); ++flat) {
    std::int64_t rem = flat, off = 0;
    for (std::size_t i = shape.size(); i-- > 0;) {
      off += (rem % shape[i]) * xs[static_cast<std::size_t>(perm[i])];
      rem /= shape[i];
    }
    y.data[static_cast<std::size_t>(flat)] = x.data[static_cast<std::size_t>(off)];
  }
  return y;
}

Ref with_shape(Ref r, std::vector<std::int64_t> shape) {
  r.shape = std::move(shape);
  return r;
}

double sigmoid_ref(double v) { return 1 / (1 + std::exp(-v)); }
// NaN propagates through sign as in NumPy.
double sign_ref(double v) { return std::isnan(v) ? v : static_cast<double>((v > 0) - (v < 0)); }

std::vector<OpCase> build_table() {
  std::vector<OpCase> t;
  auto unary = [&](std::string name, auto f, double (*ref)(double), Domain d = D::any, bool diff = true) {
    auto r = [ref](const std::vector<double>& a) { return ref(a[0]); };
    t.push_back(make_case(name, Shapes{{3, 5}}, f, elementwise(r), {d}, diff));
    t.push_back(make_case(name + "/one_element", Shapes{{1}}, f, elementwise(r), {d}, diff));
    t.push_back(make_case(name + "/empty", Shapes{{0, 3}}, f, elementwise(r), {d}, diff));
    t.push_back(make_case(name + "/scalar", Shapes{{}}, f, elementwise(r), {d}, diff));
    t.push_back(make_case(name + "/long", Shapes{{2, 37}}, f, elementwise(r), {d}, diff));  // SIMD body + tail
  };
  unary(
      "neg", [](const auto& in) { return -in[0]; }, [](double v) { return -v; });
  unary(
      "exp", [](const auto& in) { return exp(in[0]); }, [](double v) { return std::exp(v); });
  unary(
      "log", [](const auto& in) { return log(in[0]); }, [](double v) { return std::log(v); }, D::positive);
  unary(
      "sqrt", [](const auto& in) { return sqrt(in[0]); }, [](double v) { return std::sqrt(v); }, D::positive);
  unary(
      "rsqrt", [](const auto& in) { return rsqrt(in[0]); }, [](double v) { return 1 / std::sqrt(v); }, D::positive);
  unary(
      "tanh", [](const auto& in) { return tanh(in[0]); }, [](double v) { return std::tanh(v); });
  unary(
      "sigmoid", [](const auto& in) { return sigmoid(in[0]); }, sigmoid_ref);
  unary(
      "relu", [](const auto& in) { return relu(in[0]); }, [](double v) { return nan_max(v, 0.0); }, D::away_from_zero);
  unary(
      "abs", [](const auto& in) { return abs(in[0]); }, [](double v) { return std::abs(v); }, D::away_from_zero);
  unary(
      "square", [](const auto& in) { return square(in[0]); }, [](double v) { return v * v; });
  unary(
      "sin", [](const auto& in) { return sin(in[0]); }, [](double v) { return std::sin(v); });
  unary(
      "cos", [](const auto& in) { return cos(in[0]); }, [](double v) { return std::cos(v); });
  unary(
      "sign", [](const auto& in) { return sign(in[0]); }, sign_ref, D::away_from_zero, false);
  unary(
      "erf", [](const auto& in) { return erf(in[0]); }, [](double v) { return std::erf(v); });
  unary(
      "gelu", [](const auto& in) { return gelu(in[0]); },
      [](double v) { return 0.5 * v * (1 + std::erf(v / std::numbers::sqrt2)); });
  unary(
      "gelu_tanh", [](const auto& in) { return gelu(in[0], GeluApproximation::tanh); },
      [](double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (v + 0.044715 * v * v * v))); });

  auto binary = [&](std::string name, auto f, double (*ref)(double, double), Domain da = D::any, Domain db = D::any,
                    bool diff = true) {
    auto r = [ref](const std::vector<double>& a) { return ref(a[0], a[1]); };
    t.push_back(make_case(name, Shapes{{3, 4}, {3, 4}}, f, elementwise(r), {da, db}, diff));
    t.push_back(make_case(name + "/broadcast_row", Shapes{{3, 4}, {4}}, f, elementwise(r), {da, db}, diff));
    t.push_back(make_case(name + "/broadcast_both", Shapes{{3, 1, 5}, {2, 1}}, f, elementwise(r), {da, db}, diff));
    t.push_back(make_case(name + "/scalar_left", Shapes{{}, {2, 19}}, f, elementwise(r), {da, db}, diff));
    t.push_back(make_case(name + "/column", Shapes{{4, 1}, {4, 33}}, f, elementwise(r), {da, db}, diff));
    t.push_back(make_case(name + "/one_element", Shapes{{1}, {1}}, f, elementwise(r), {da, db}, diff));
    t.push_back(make_case(name + "/empty", Shapes{{0, 4}, {4}}, f, elementwise(r), {da, db}, diff));
  };
  binary(
      "add", [](const auto& in) { return in[0] + in[1]; }, [](double a, double b) { return a + b; });
  binary(
      "sub", [](const auto& in) { return in[0] - in[1]; }, [](double a, double b) { return a - b; });
  binary(
      "mul", [](const auto& in) { return in[0] * in[1]; }, [](double a, double b) { return a * b; });
  binary(
      "div", [](const auto& in) { return in[0] / in[1]; }, [](double a, double b) { return a / b; }, D::any,
      D::away_from_zero);
  binary(
      "pow", [](const auto& in) { return pow(in[0], in[1]); }, [](double a, double b) { return std::pow(a, b); },
      D::positive);
  binary(
      "maximum", [](const auto& in) { return maximum(in[0], in[1]); },
      [](double a, double b) { return nan_max(a, b); });
  binary(
      "minimum", [](const auto& in) { return minimum(in[0], in[1]); },
      [](double a, double b) { return nan_min(a, b); });
  binary(
      "equal",
      [](const auto& in) {
        using T = typename std::decay_t<decltype(in[0])>::value_type;
        return cast<T>(equal(in[0], in[0] * T(1) + in[1] * T(0)));  // equal where values match exactly
      },
      [](double a, double b) { return a == a * 1 + b * 0 ? 1.0 : 0.0; }, D::any, D::any, false);
  binary(
      "less",
      [](const auto& in) { return cast<typename std::decay_t<decltype(in[0])>::value_type>(less(in[0], in[1])); },
      [](double a, double b) { return a < b ? 1.0 : 0.0; }, D::any, D::any, false);
  binary(
      "greater", [](const auto& in) { return cast<typename std::decay_t<decltype(in[0])>::value_type>(in[0] > in[1]); },
      [](double a, double b) { return a > b ? 1.0 : 0.0; }, D::any, D::any, false);

  t.push_back(make_case(
      "scalar_operators", Shapes{{2, 3}},
      [](const auto& in) { return (2.0f + in[0] * 3.0f - 1.0f) / 2.0f - (1.0f / (in[0] * in[0] + 1.0f)); },
      elementwise([](const std::vector<double>& a) { return (2 + a[0] * 3 - 1) / 2 - 1 / (a[0] * a[0] + 1); })));
  t.push_back(make_case("where", Shapes{{3, 4}, {3, 4}, {4}},
                        [](const auto& in) { return where(in[0] > 0.0f, in[1], in[2]); },
                        elementwise([](const std::vector<double>& a) { return a[0] > 0 ? a[1] : a[2]; }),
                        {D::away_from_zero, D::any, D::any}));
  t.push_back(make_case(
      "fma", Shapes{{3, 4}, {4}, {3, 1}}, [](const auto& in) { return fma(in[0], in[1], in[2]); },
      elementwise([](const std::vector<double>& a) { return a[0] * a[1] + a[2]; })));
  t.push_back(make_case(
      "clip", Shapes{{4, 5}}, [](const auto& in) { return clip(in[0], -0.5f, 0.5f); },
      elementwise([](const std::vector<double>& a) { return std::clamp(a[0], -0.5, 0.5); })));

  auto plus = [](double a, double b) { return a + b; };
  auto maxf = nan_max;
  auto minf = nan_min;
  const double inf = std::numeric_limits<double>::infinity();
  t.push_back(make_case(
      "sum/all", Shapes{{3, 4, 5}}, [](const auto& in) { return sum(in[0]); },
      [=](const std::vector<Ref>& r) { return reduce_ref(r[0], {}, false, 0, plus); }));
  t.push_back(make_case(
      "sum/axes_0_2", Shapes{{3, 4, 5}},
      [](const auto& in) {
        return sum(in[0], {0, 2});
      },
      [=](const std::vector<Ref>& r) {
        return reduce_ref(r[0], {0, 2}, false, 0, plus);
      }));
  t.push_back(make_case(
      "sum/axis_last_keepdims", Shapes{{3, 41}}, [](const auto& in) { return sum(in[0], {-1}, true); },
      [=](const std::vector<Ref>& r) { return reduce_ref(r[0], {-1}, true, 0, plus); }));
  t.push_back(make_case(
      "sum/axis_0_long", Shapes{{7, 35}}, [](const auto& in) { return sum(in[0], {0}); },
      [=](const std::vector<Ref>& r) { return reduce_ref(r[0], {0}, false, 0, plus); }));
  t.push_back(make_case(
      "sum/empty", Shapes{{0, 3}}, [](const auto& in) { return sum(in[0], {0}); },
      [=](const std::vector<Ref>& r) { return reduce_ref(r[0], {0}, false, 0, plus); }));
  t.push_back(make_case(
      "mean/axis_1", Shapes{{3, 4, 2}}, [](const auto& in) { return mean(in[0], {1}); },
      [=](const std::vector<Ref>& r) { return reduce_ref(r[0], {1}, false, 0, plus, true); }));
  t.push_back(make_case(
      "mean/all", Shapes{{5, 3}}, [](const auto& in) { return mean(in[0]); },
      [=](const std::vector<Ref>& r) { return reduce_ref(r[0], {}, false, 0, plus, true); }));
  t.push_back(make_case(
      "max/axis_1", Shapes{{3, 6, 2}}, [](const auto& in) { return max(in[0], {1}); },
      [=](const std::vector<Ref>& r) { return reduce_ref(r[0], {1}, false, -inf, maxf); }));
  t.push_back(make_case(
      "max/all_keepdims", Shapes{{4, 37}}, [](const auto& in) { return max(in[0], {}, true); },
      [=](const std::vector<Ref>& r) { return reduce_ref(r[0], {}, true, -inf, maxf); }));
  t.push_back(make_case(
      "min/axes_0_2", Shapes{{3, 2, 4}},
      [](const auto& in) {
        return min(in[0], {0, 2});
      },
      [=](const std::vector<Ref>& r) {
        return reduce_ref(r[0], {0, 2}, false, inf, minf);
      }));
  // The column of row i's largest element (the first on ties, the first NaN if any).
  auto argmax_of_row = [](const Ref& x, std::int64_t i) {
    std::int64_t best = 0;
    for (std::int64_t j = 1; j < x.shape[1] && !std::isnan(x.at({i, best})); ++j)
      if (x.at({i, j}) > x.at({i, best}) || std::isnan(x.at({i, j}))) best = j;
    return best;
  };
  t.push_back(make_case(
      "argmax/axis_1", Shapes{{4, 7}},
      [](const auto& in) { return cast<typename std::decay_t<decltype(in[0])>::value_type>(argmax(in[0], 1)); },
      [=](const std::vector<Ref>& r) {
        Ref out = Ref::zeros({r[0].shape[0]});
        for (std::int64_t i = 0; i < r[0].shape[0]; ++i)
          out.data[static_cast<std::size_t>(i)] = static_cast<double>(argmax_of_row(r[0], i));
        return out;
      },
      {}, false));
  t.push_back(make_case(
      "one_hot/of_argmax", Shapes{{4, 3}},
      [](const auto& in) { return one_hot<typename std::decay_t<decltype(in[0])>::value_type>(argmax(in[0], 1), 5); },
      [=](const std::vector<Ref>& r) {
        Ref out = Ref::zeros({r[0].shape[0], 5});
        for (std::int64_t i = 0; i < r[0].shape[0]; ++i) out.at({i, argmax_of_row(r[0], i)}) = 1;
        return out;
      },
      {}, false));
  t.push_back(make_case(
      "sum_to", Shapes{{3, 4, 5}},
      [](const auto& in) {
        return sum_to(in[0], Shape{4, 1});
      },
      [=](const std::vector<Ref>& r) {
        Ref out = reduce_ref(r[0], {0, 2}, true, 0, plus);
        out.shape = {4, 1};  // sum_to drops the leading axis: same elements
        return out;
      }));

  // Counter-based: element i is mix(mix(key) + i * golden ratio), its top 53 bits as a
  // fraction (24 at float, within the float tolerance of this reference). Added to x so the
  // gradient check has a path (d/dx = 1; the key has none).
  t.push_back(make_case(
      "random_uniform/plus_x", Shapes{{3, 5}},
      [](const auto& in) {
        using T = typename std::decay_t<decltype(in[0])>::value_type;
        return random_uniform<T>(scalar<std::int64_t>(42), in[0].shape()) + in[0];
      },
      [](const std::vector<Ref>& r) {
        Ref out = r[0];
        const std::uint64_t stream = splitmix64_mix(42);
        for (std::size_t i = 0; i < out.data.size(); ++i)
          out.data[i] += std::ldexp(static_cast<double>(splitmix64_mix(stream + i * 0x9e3779b97f4a7c15ULL) >> 11), -53);
        return out;
      }));
  t.push_back(make_case(
      "matmul/2d", Shapes{{3, 4}, {4, 5}}, [](const auto& in) { return matmul(in[0], in[1]); },
      [](const std::vector<Ref>& r) { return matmul_ref(r[0], r[1]); }));
  t.push_back(make_case(
      "matmul/batched_broadcast", Shapes{{2, 3, 4}, {4, 5}}, [](const auto& in) { return matmul(in[0], in[1]); },
      [](const std::vector<Ref>& r) { return matmul_ref(r[0], r[1]); }));
  t.push_back(make_case(
      "matmul/transpose_a_b", Shapes{{4, 3}, {5, 4}}, [](const auto& in) { return matmul(in[0], in[1], true, true); },
      [](const std::vector<Ref>& r) { return matmul_ref(transpose2_ref(r[0]), transpose2_ref(r[1])); }));
  t.push_back(make_case(
      "matmul/transpose_a", Shapes{{4, 3}, {4, 5}}, [](const auto& in) { return matmul(in[0], in[1], true, false); },
      [](const std::vector<Ref>& r) { return matmul_ref(transpose2_ref(r[0]), r[1]); }));
  t.push_back(make_case(
      "matmul/transpose_b", Shapes{{3, 4}, {5, 4}}, [](const auto& in) { return matmul(in[0], in[1], false, true); },
      [](const std::vector<Ref>& r) { return matmul_ref(r[0], transpose2_ref(r[1])); }));
  t.push_back(make_case(
      "matmul/batched_both", Shapes{{2, 3, 4}, {2, 4, 5}}, [](const auto& in) { return matmul(in[0], in[1]); },
      [](const std::vector<Ref>& r) { return matmul_ref(r[0], r[1]); }));
  t.push_back(make_case(
      "matmul/large_tiles", Shapes{{17, 33}, {33, 19}}, [](const auto& in) { return matmul(in[0], in[1]); },
      [](const std::vector<Ref>& r) { return matmul_ref(r[0], r[1]); }));

  t.push_back(make_case(
      "reshape", Shapes{{2, 6}},
      [](const auto& in) {
        return reshape(in[0], {3, -1}) * 1.5f;
      },
      [](const std::vector<Ref>& r) {
        Ref y = with_shape(r[0], {3, 4});
        for (auto& v : y.data) v *= 1.5;
        return y;
      }));
  t.push_back(make_case(
      "transpose/reverse", Shapes{{2, 3, 4}}, [](const auto& in) { return transpose(in[0]); },
      [](const std::vector<Ref>& r) {
        return permute_ref(r[0], {2, 1, 0});
      }));
  t.push_back(make_case(
      "transpose/perm", Shapes{{2, 3, 4}},
      [](const auto& in) {
        return transpose(in[0], {0, 2, 1});
      },
      [](const std::vector<Ref>& r) {
        return permute_ref(r[0], {0, 2, 1});
      }));
  t.push_back(make_case(
      "broadcast_to", Shapes{{3, 1}},
      [](const auto& in) {
        return broadcast_to(in[0], {2, 3, 4});
      },
      [](const std::vector<Ref>& r) {
        Ref zero = Ref::zeros({2, 3, 4});
        return broadcast_map({r[0], zero}, [](const std::vector<double>& a) { return a[0]; });
      }));
  t.push_back(make_case(
      "expand_dims", Shapes{{2, 3}}, [](const auto& in) { return expand_dims(in[0], 1) * 2.0f; },
      [](const std::vector<Ref>& r) {
        Ref y = with_shape(r[0], {2, 1, 3});
        for (auto& v : y.data) v *= 2;
        return y;
      }));
  t.push_back(make_case(
      "squeeze", Shapes{{2, 1, 3, 1}}, [](const auto& in) { return squeeze(in[0], {1}) * 2.0f; },
      [](const std::vector<Ref>& r) {
        Ref y = with_shape(r[0], {2, 3, 1});
        for (auto& v : y.data) v *= 2;
        return y;
      }));
  t.push_back(make_case(
      "flatten", Shapes{{2, 3, 2}}, [](const auto& in) { return flatten(in[0]) * 2.0f; },
      [](const std::vector<Ref>& r) {
        Ref y = with_shape(r[0], {2, 6});
        for (auto& v : y.data) v *= 2;
        return y;
      }));
  t.push_back(make_case(
      "slice", Shapes{{4, 5, 3}},
      [](const auto& in) {
        return slice(in[0], {1, 0, 1}, {2, -1, 2});
      },
      [](const std::vector<Ref>& r) {
        return copy_block(r[0], {1, 0, 1}, {2, 5, 2});
      }));
  t.push_back(make_case(
      "concat/axis_1", Shapes{{2, 3}, {2, 1}, {2, 2}}, [](const auto& in) { return concat(in, 1); },
      [](const std::vector<Ref>& r) {
        Ref y = Ref::zeros({2, 6});
        for (std::int64_t i = 0; i < 2; ++i) {
          std::int64_t at = 0;
          for (const auto& x : r)
            for (std::int64_t j = 0; j < x.shape[1]; ++j) y.at({i, at++}) = x.at({i, j});
        }
        return y;
      }));
  t.push_back(make_case(
      "stack/axis_0", Shapes{{2, 3}, {2, 3}}, [](const auto& in) { return stack(in, 0); },
      [](const std::vector<Ref>& r) {
        Ref y = Ref::zeros({2, 2, 3});
        std::copy(r[0].data.begin(), r[0].data.end(), y.data.begin());
        std::copy(r[1].data.begin(), r[1].data.end(), y.data.begin() + 6);
        return y;
      }));
  t.push_back(make_case(
      "cast/round_trip", Shapes{{3, 2}},
      [](const auto& in) {
        using T = typename std::decay_t<decltype(in[0])>::value_type;
        return cast<T>(cast<double>(in[0]) * 2.0);
      },
      elementwise([](const std::vector<double>& a) { return 2 * a[0]; })));

  t.push_back(make_case(
      "bias_add", Shapes{{2, 3, 2, 2}, {3}}, [](const auto& in) { return bias_add(in[0], in[1]); },
      [](const std::vector<Ref>& r) {
        Ref y = r[0];
        for (std::int64_t i = 0; i < y.numel(); ++i)
          y.data[static_cast<std::size_t>(i)] += r[1].data[static_cast<std::size_t>((i / 4) % 3)];
        return y;
      }));
  t.push_back(make_case(
      "conv2d/pad_1", Shapes{{2, 3, 5, 5}, {4, 3, 3, 3}},
      [](const auto& in) { return conv2d(in[0], in[1], {.padding = 1}); },
      [](const std::vector<Ref>& r) { return conv_ref(r[0], r[1], 1, 1, 1, 1, 5, 5); }));
  t.push_back(make_case(
      "conv2d/stride_2_dilation_2", Shapes{{1, 2, 9, 8}, {3, 2, 3, 2}},
      [](const auto& in) { return conv2d(in[0], in[1], {.stride = 2, .padding = 1, .dilation = 2}); },
      [](const std::vector<Ref>& r) { return conv_ref(r[0], r[1], 2, 1, 1, 2, 4, 4); }));
  t.push_back(make_case(
      "conv2d/valid", Shapes{{2, 1, 7, 7}, {2, 1, 5, 5}},
      [](const auto& in) { return conv2d(in[0], in[1], {.pad_mode = PadMode::valid}); },
      [](const std::vector<Ref>& r) { return conv_ref(r[0], r[1], 1, 0, 0, 1, 3, 3); }));
  t.push_back(make_case(
      "conv2d/same_stride_2", Shapes{{1, 2, 6, 7}, {2, 2, 3, 3}},
      [](const auto& in) { return conv2d(in[0], in[1], {.stride = 2, .pad_mode = PadMode::same}); },
      // out 3x4; pad total rows max((3-1)*2+3-6, 0)=1 -> top 0; cols (4-1)*2+3-7=2 -> left 1
      [](const std::vector<Ref>& r) { return conv_ref(r[0], r[1], 2, 0, 1, 1, 3, 4); }));
  t.push_back(make_case(
      "conv2d/pointwise", Shapes{{2, 3, 4, 4}, {5, 3, 1, 1}}, [](const auto& in) { return conv2d(in[0], in[1]); },
      [](const std::vector<Ref>& r) { return conv_ref(r[0], r[1], 1, 0, 0, 1, 4, 4); }));
  t.push_back(make_case(
      "max_pool2d", Shapes{{2, 2, 6, 6}}, [](const auto& in) { return max_pool2d(in[0], 2, 2); },
      [](const std::vector<Ref>& r) { return pool_ref(r[0], 2, 2, true); }));
  t.push_back(make_case(
      "max_pool2d/overlap", Shapes{{1, 2, 7, 7}}, [](const auto& in) { return max_pool2d(in[0], 3, 2); },
      [](const std::vector<Ref>& r) { return pool_ref(r[0], 3, 2, true); }));
  // A convnet's block: compiled, its forward is one Conv2DReLUMaxPool node and its gradient
  // moves ReLU's mask into the pooling's argmax (passes/fuse.hpp). Few output channels (the
  // shifted product), enough to fill half a vector (the direct kernel), and a bias.
  auto conv_relu_pool_ref = [](const Ref& x, const Ref& w, std::int64_t oh, std::int64_t ow) {
    Ref y = conv_ref(x, w, 1, 0, 0, 1, oh, ow);
    for (double& v : y.data) v = v > 0 || std::isnan(v) ? v : 0;  // relu keeps NaN
    return pool_ref(y, 2, 2, true);
  };
  t.push_back(make_case(
      "conv2d_relu_max_pool/shifted", Shapes{{2, 1, 12, 12}, {3, 1, 5, 5}},
      [](const auto& in) { return max_pool2d(relu(conv2d(in[0], in[1], {.pad_mode = PadMode::valid})), 2, 2); },
      [=](const std::vector<Ref>& r) { return conv_relu_pool_ref(r[0], r[1], 8, 8); }));
  t.push_back(make_case(
      "conv2d_relu_max_pool/direct", Shapes{{2, 2, 10, 9}, {10, 2, 3, 3}},
      [](const auto& in) { return max_pool2d(relu(conv2d(in[0], in[1], {.pad_mode = PadMode::valid})), 2, 2); },
      [=](const std::vector<Ref>& r) { return conv_relu_pool_ref(r[0], r[1], 8, 7); }));
  t.push_back(make_case(
      "conv2d_bias_relu_max_pool/direct", Shapes{{2, 2, 10, 9}, {10, 2, 3, 3}, {10}},
      [](const auto& in) {
        return max_pool2d(relu(bias_add(conv2d(in[0], in[1], {.pad_mode = PadMode::valid}), in[2])), 2, 2);
      },
      [](const std::vector<Ref>& r) {
        Ref y = conv_ref(r[0], r[1], 1, 0, 0, 1, 8, 7);
        for (std::int64_t i = 0; i < y.numel(); ++i) {
          double& v = y.data[static_cast<std::size_t>(i)];
          v += r[2].data[static_cast<std::size_t>((i / 56) % 10)];  // 8 x 7 outputs a channel
          v = v > 0 || std::isnan(v) ? v : 0;                       // relu keeps NaN
        }
        return pool_ref(y, 2, 2, true);
      }));
  t.push_back(make_case(
      "avg_pool2d", Shapes{{2, 2, 6, 4}}, [](const auto& in) { return avg_pool2d(in[0], 2, 2); },
      [](const std::vector<Ref>& r) { return pool_ref(r[0], 2, 2, false); }));
  t.push_back(make_case(
      "resize_bilinear/up", Shapes{{1, 2, 3, 4}}, [](const auto& in) { return resize_bilinear(in[0], 5, 7); },
      [](const std::vector<Ref>& r) { return resize_ref(r[0], 5, 7); }));
  t.push_back(make_case(
      "resize_bilinear/down", Shapes{{2, 1, 6, 5}}, [](const auto& in) { return resize_bilinear(in[0], 4, 3); },
      [](const std::vector<Ref>& r) { return resize_ref(r[0], 4, 3); }));
  t.push_back(make_case(
      "log_softmax", Shapes{{3, 5}}, [](const auto& in) { return log_softmax(in[0]); },
      [](const std::vector<Ref>& r) { return log_softmax_ref(r[0]); }));
  // take: fixed indices (the table's inputs are the float tensors), one repeated so the gradient
  // adds twice into one slice.
  auto take_ref = [](const Ref& x, const std::vector<std::int32_t>& idx, std::vector<std::int64_t> idx_shape,
                     int axis) {
    std::int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; ++d) outer *= x.shape[static_cast<std::size_t>(d)];
    for (std::size_t d = static_cast<std::size_t>(axis) + 1; d < x.shape.size(); ++d) inner *= x.shape[d];
    const std::int64_t extent = x.shape[static_cast<std::size_t>(axis)], count = static_cast<std::int64_t>(idx.size());
    std::vector<std::int64_t> shape(x.shape.begin(), x.shape.begin() + axis);
    shape.insert(shape.end(), idx_shape.begin(), idx_shape.end());
    shape.insert(shape.end(), x.shape.begin() + axis + 1, x.shape.end());
    Ref y = Ref::zeros(shape);
    for (std::int64_t o = 0; o < outer; ++o)
      for (std::int64_t i = 0; i < count; ++i)
        for (std::int64_t r = 0; r < inner; ++r)
          y.data[static_cast<std::size_t>((o * count + i) * inner + r)] =
              x.data[static_cast<std::size_t>((o * extent + idx[static_cast<std::size_t>(i)]) * inner + r)];
    return y;
  };
  t.push_back(make_case(
      "take/axis_0", Shapes{{5, 3}},
      [](const auto& in) {
        return take(in[0], tensor<std::int32_t>({4, 0, 2, 0}, {2, 2}), 0);
      },
      [take_ref](const std::vector<Ref>& r) {
        return take_ref(r[0], {4, 0, 2, 0}, {2, 2}, 0);
      }));
  t.push_back(make_case(
      "take/axis_1", Shapes{{2, 4, 3}},
      [](const auto& in) {
        return take(in[0], tensor<std::int32_t>({3, 3, 1}), -2);
      },
      [take_ref](const std::vector<Ref>& r) {
        return take_ref(r[0], {3, 3, 1}, {3}, 1);
      }));
  t.push_back(make_case(
      "take/last_axis", Shapes{{3, 70}},
      [](const auto& in) {
        return take(in[0], tensor<std::int32_t>({69, 0, 5, 69, 7}), 1);
      },
      [take_ref](const std::vector<Ref>& r) {
        return take_ref(r[0], {69, 0, 5, 69, 7}, {5}, 1);
      }));
  t.push_back(make_case(
      "take/wide_rows", Shapes{{4, 150}},  // rows wider than the cpu's 64-column scatter blocks
      [](const auto& in) {
        return take(in[0], tensor<std::int32_t>({1, 3, 1, 1, 0}), 0);
      },
      [take_ref](const std::vector<Ref>& r) {
        return take_ref(r[0], {1, 3, 1, 1, 0}, {5}, 0);
      }));
  t.push_back(make_case(
      "take/no_indices", Shapes{{3, 2}}, [](const auto& in) { return take(in[0], zeros<std::int32_t>({0}), 0); },
      [take_ref](const std::vector<Ref>& r) { return take_ref(r[0], {}, {0}, 0); }));
  // cumsum over [outer, extent, inner], forward or reversed.
  auto cumsum_ref = [](const Ref& x, int axis, bool reverse) {
    std::int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; ++d) outer *= x.shape[static_cast<std::size_t>(d)];
    for (std::size_t d = static_cast<std::size_t>(axis) + 1; d < x.shape.size(); ++d) inner *= x.shape[d];
    const std::int64_t n = x.shape[static_cast<std::size_t>(axis)];
    Ref y = x;
    for (std::int64_t o = 0; o < outer; ++o)
      for (std::int64_t r = 0; r < inner; ++r) {
        double acc = 0;
        for (std::int64_t k = 0; k < n; ++k) {
          const auto at = static_cast<std::size_t>((o * n + (reverse ? n - 1 - k : k)) * inner + r);
          acc += x.data[at];
          y.data[at] = acc;
        }
      }
    return y;
  };
  t.push_back(make_case(
      "cumsum/last_axis", Shapes{{3, 5}}, [](const auto& in) { return cumsum(in[0], -1); },
      [cumsum_ref](const std::vector<Ref>& r) { return cumsum_ref(r[0], 1, false); }));
  t.push_back(make_case(
      "cumsum/axis_0_reverse", Shapes{{4, 2, 3}}, [](const auto& in) { return cumsum(in[0], 0, true); },
      [cumsum_ref](const std::vector<Ref>& r) { return cumsum_ref(r[0], 0, true); }));
  // tril / triu: element (i, j) of the last two axes kept where j - i <= k (tril) or >= k (triu).
  auto triangle_ref = [](const Ref& x, std::int64_t k, bool upper) {
    Ref y = x;
    const std::int64_t rows = x.shape[x.shape.size() - 2], cols = x.shape.back();
    for (std::int64_t e = 0; e < x.numel(); ++e) {
      const std::int64_t j = e % cols, i = e / cols % rows;
      if (upper ? j - i < k : j - i > k) y.data[static_cast<std::size_t>(e)] = 0;
    }
    return y;
  };
  t.push_back(make_case(
      "tril", Shapes{{2, 3, 4}}, [](const auto& in) { return tril(in[0]); },
      [triangle_ref](const std::vector<Ref>& r) { return triangle_ref(r[0], 0, false); }));
  t.push_back(make_case(
      "tril/below", Shapes{{3, 5}}, [](const auto& in) { return tril(in[0], -1); },
      [triangle_ref](const std::vector<Ref>& r) { return triangle_ref(r[0], -1, false); }));
  t.push_back(make_case(
      "triu/above", Shapes{{4, 3}}, [](const auto& in) { return triu(in[0], 1); },
      [triangle_ref](const std::vector<Ref>& r) { return triangle_ref(r[0], 1, true); }));
  t.push_back(make_case(
      "masked_fill", Shapes{{3, 4}},
      [](const auto& in) {
        using T = typename std::decay_t<decltype(in[0])>::value_type;
        return masked_fill(in[0], tensor<bool>({true, false, false, true}), T(0.5));
      },
      [](const std::vector<Ref>& r) {
        Ref y = r[0];
        for (std::size_t e = 0; e < y.data.size(); ++e)
          if (e % 4 == 0 || e % 4 == 3) y.data[e] = 0.5;
        return y;
      }));
  t.push_back(make_case(
      "split", Shapes{{5, 3}},
      [](const auto& in) {
        const auto pieces = split(in[0], {2, 0, 3}, 0);
        return concat(std::vector{pieces[2] * 2, pieces[1], pieces[0]}, 0);
      },
      [](const std::vector<Ref>& r) {
        Ref y = r[0];
        for (std::size_t e = 0; e < 9; ++e) y.data[e] = 2 * r[0].data[e + 6];
        for (std::size_t e = 0; e < 6; ++e) y.data[e + 9] = r[0].data[e];
        return y;
      }));
  t.push_back(make_case(
      "layer_norm", Shapes{{4, 6}}, [](const auto& in) { return layer_norm(in[0]); },
      [](const std::vector<Ref>& r) { return layer_norm_ref(r[0]); }));
  t.push_back(make_case(
      "layer_norm/affine", Shapes{{2, 3, 7}, {7}, {7}},
      [](const auto& in) { return layer_norm(in[0], in[1], in[2], 1e-3); },
      [](const std::vector<Ref>& r) { return layer_norm_ref(r[0], &r[1], &r[2], 1e-3); }));
  t.push_back(make_case(
      "layer_norm/one_feature", Shapes{{3, 1}}, [](const auto& in) { return layer_norm(in[0]); },
      [](const std::vector<Ref>& r) { return layer_norm_ref(r[0]); }));
  // Attention: queries and keys of different counts and widths; causal with as many queries as
  // keys, fewer (a cache of past keys), more (the first see no key); and past one 64 x 64 block
  // of the cpu kernel in both directions.
  auto attention_case = [&](std::string name, Shapes shapes, bool causal, double scale = 0) {
    t.push_back(make_case(
        std::move(name), std::move(shapes),
        [causal, scale](const auto& in) {
          AttentionOptions options{.causal = causal};
          if (scale != 0) options.scale = scale;
          return scaled_dot_product_attention(in[0], in[1], in[2], options);
        },
        [causal, scale](const std::vector<Ref>& r) { return attention_ref(r[0], r[1], r[2], causal, scale); }));
  };
  attention_case("attention", Shapes{{2, 5, 4}, {2, 6, 4}, {2, 6, 3}}, false);
  attention_case("attention/causal", Shapes{{2, 6, 4}, {2, 6, 4}, {2, 6, 4}}, true);
  attention_case("attention/causal_cached_keys", Shapes{{1, 3, 4}, {1, 7, 4}, {1, 7, 2}}, true);
  attention_case("attention/causal_more_queries", Shapes{{5, 2}, {3, 2}, {3, 3}}, true);
  attention_case("attention/heads_scaled", Shapes{{2, 2, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 4}}, false, 0.7);
  attention_case("attention/long_causal", Shapes{{1, 67, 3}, {1, 131, 3}, {1, 131, 2}}, true);
  attention_case("attention/one_key", Shapes{{3, 2}, {1, 2}, {1, 4}}, false);
  t.push_back(make_case(
      "softmax/axis_0", Shapes{{4, 3}}, [](const auto& in) { return softmax(in[0], 0); },
      [](const std::vector<Ref>& r) {
        Ref y = permute_ref(log_softmax_ref(permute_ref(r[0], {1, 0})), {1, 0});
        for (auto& v : y.data) v = std::exp(v);
        return y;
      }));
  t.push_back(make_case(
      "softmax_cross_entropy", Shapes{{4, 5}},
      [](const auto& in) {
        return softmax_cross_entropy(in[0], tensor<std::int32_t>({1, 0, 4, 2}), Reduction::mean);
      },
      [](const std::vector<Ref>& r) {
        Ref ls = log_softmax_ref(r[0]);
        const std::int64_t labels[] = {1, 0, 4, 2};
        double s = 0;
        for (std::int64_t i = 0; i < 4; ++i) s -= ls.at({i, labels[i]});
        return Ref{{}, {s / 4}};
      }));
  t.push_back(make_case(
      "softmax_cross_entropy/none", Shapes{{3, 4}},
      [](const auto& in) {
        return softmax_cross_entropy(in[0], tensor<std::int32_t>({3, 3, 0}), Reduction::none);
      },
      [](const std::vector<Ref>& r) {
        Ref ls = log_softmax_ref(r[0]);
        return Ref{{3}, {-ls.at({0, 3}), -ls.at({1, 3}), -ls.at({2, 0})}};
      }));
  return t;
}

}  // namespace

const std::vector<OpCase>& op_table() {
  static const std::vector<OpCase> table = build_table();
  return table;
}

}  // namespace xgrad::testing
