// backend/math.hpp's functions of our own, against long double: math::exp_nonpositive, the
// exponential of attention's softmax (a score less its row's maximum).
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "xgrad/backend/math.hpp"

namespace {

std::vector<float> exp_nonpositive(const std::vector<float>& x) {
  using B = xsimd::batch<float>;
  std::vector<float> y(x.size());
  std::size_t i = 0;
  for (; i + B::size <= x.size(); i += B::size)
    xgrad::math::exp_nonpositive(B::load_unaligned(&x[i])).store_unaligned(&y[i]);
  for (; i < x.size(); ++i) y[i] = std::exp(x[i]);  // the scalar tail, as attention's
  return y;
}

}  // namespace

TEST_CASE("math: exp_nonpositive is within 2 ulps of exp for every x <= 0 down to FLT_MIN's, 0 below") {
  // Every 64th float from -0 down to -88.5 (six million; each binade alike).
  std::vector<float> x;
  for (std::uint32_t bits = std::bit_cast<std::uint32_t>(-0.0f); bits <= std::bit_cast<std::uint32_t>(-88.5f);
       bits += 64)
    x.push_back(std::bit_cast<float>(bits));
  const std::vector<float> y = exp_nonpositive(x);
  double worst = 0;
  float worst_at = 0;
  bool flushed = true;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const long double want = std::exp(static_cast<long double>(x[i]));
    if (want < std::numeric_limits<float>::min()) {  // below FLT_MIN: 0, or the denormal near it
      flushed = flushed && y[i] >= 0 && y[i] < std::numeric_limits<float>::min();
      continue;
    }
    const float rounded = static_cast<float>(want);
    const double ulp = std::nextafter(rounded, 2.0f) - rounded;
    const double err = std::fabs(static_cast<double>(y[i]) - static_cast<double>(want)) / ulp;
    if (err > worst) worst = err, worst_at = x[i];
  }
  CAPTURE(worst_at);
  CHECK(worst <= 2.0);
  CHECK(flushed);
}

TEST_CASE("math: exp_nonpositive at its special values: -inf gives 0, NaN NaN, 0 and -0 give 1") {
  using B = xsimd::batch<float>;
  constexpr float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special{-inf,     std::numeric_limits<float>::quiet_NaN(), 0.0f, -0.0f, -88.0f, -1e-30f,
                                   -1000.0f, -std::numeric_limits<float>::max()};
  std::vector<float> x;
  while (x.size() < B::size * ((special.size() + B::size - 1) / B::size))
    x.insert(x.end(), special.begin(), special.end());
  x.resize(B::size * ((special.size() + B::size - 1) / B::size));
  const std::vector<float> y = exp_nonpositive(x);
  for (std::size_t i = 0; i < x.size(); ++i) {
    CAPTURE(x[i]);
    if (std::isnan(x[i]))
      CHECK(std::isnan(y[i]));
    else if (x[i] == 0)
      CHECK(y[i] == 1.0f);
    else if (x[i] == -1e-30f)
      CHECK(y[i] == 1.0f);
    else
      CHECK(y[i] == 0.0f);  // -inf, and everything at or below -88
  }
}
