// Helpers shared by the jit tests.
#pragma once

#include <cstring>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <xgrad/xgrad.hpp>

namespace xgrad::testing {

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
