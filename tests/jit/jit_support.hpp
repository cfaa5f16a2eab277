// Helpers shared by the jit tests.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <xgrad/xgrad.hpp>

namespace xgrad::testing {

/// Checks a and b element by element, within tol * (1 + |b|).
inline void check_close(const Tensor<double>& a, const Tensor<double>& b, double tol = 1e-12) {
  REQUIRE(a.shape() == b.shape());
  auto x = a.to_vector(), y = b.to_vector();
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO("element " << i << ": " << x[i] << " vs " << y[i]);
    CHECK(std::abs(x[i] - y[i]) <= tol * (1 + std::abs(y[i])));
  }
}

/// d/dx of sum(f(x)) by central differences.
template <class F> Tensor<double> numeric_grad(F f, const Tensor<double>& x) {
  auto v = x.to_vector();
  std::vector<double> g(v.size());
  const double h = 1e-6;
  for (std::size_t i = 0; i < v.size(); ++i) {
    auto at = [&](double d) {
      auto moved = v;
      moved[i] += d;
      return sum(f(tensor<double>(moved, x.shape()))).item();
    };
    g[i] = (at(h) - at(-h)) / (2 * h);
  }
  return tensor<double>(g, x.shape());
}

template <class T> bool same_bits(const Tensor<T>& a, const Tensor<T>& b) {
  if (!(a.shape() == b.shape())) return false;
  auto x = a.to_vector(), y = b.to_vector();
  return std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
}

/// Collects jit's log lines while alive.
struct LogCapture {
  std::mutex mutex;
  std::vector<std::string> lines;
  LogCapture() {
    set_jit_log([this](const std::string& line) {
      std::lock_guard lock(mutex);
      lines.push_back(line);
    });
  }
  ~LogCapture() {
    set_jit_log([](const std::string& line) { std::cerr << line << '\n'; });
  }
};

/// Captures standard output while alive.
struct CoutCapture {
  std::ostringstream text;
  std::streambuf* previous;
  CoutCapture() : previous(std::cout.rdbuf(text.rdbuf())) {}
  ~CoutCapture() { std::cout.rdbuf(previous); }
};

}  // namespace xgrad::testing
