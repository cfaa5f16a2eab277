// Helpers shared by the test files.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <xgrad/xgrad.hpp>

namespace xgrad::testing {

/// A program with all three control-flow primitives: a branch on the data, a fixed loop, a loop
/// until a condition.
inline Tensor<double> control_flow_program(const Tensor<double>& x, const Tensor<double>& w) {
  using T = Tensor<double>;
  auto y = cond(
      sum(x) > 0.0, [&w](const T& a) { return a * w; }, [](const T& a) { return exp(a); }, x);
  auto z = fori_loop(
      0, 3, [&w](Tensor<std::int32_t> i, const T& c) { return tanh(c * w + cast<double>(i)); }, y);
  return while_loop([](const T& c) { return sum(c * c) < 40.0; }, [](const T& c) { return c * 1.5; }, z,
                    {.max_iters = 50});
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// "file.cpp:<line>" for the calling file: the form the library uses to point at its caller.
/// (__builtin_FILE: clang 14 has no std::source_location with libstdc++ 12.)
inline std::string here(int line, const char* file = __builtin_FILE()) {
  const std::string_view path = file;
  return std::string(path.substr(path.find_last_of('/') + 1)) + ":" + std::to_string(line);
}

/// Runs f, which must throw E, and returns the exception's what().
template <class E, class F> std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  FAIL("the call did not throw the expected exception type");
  return {};
}

using Bytes = std::vector<unsigned char>;

/// A fresh directory under the system temp dir, removed with everything in it at the end.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("xgrad_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::vector<std::string> entries() const { return list(path); }
  /// The names in a directory, sorted.
  static std::vector<std::string> list(const std::filesystem::path& dir) {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

inline Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}
inline void write_bytes(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace xgrad::testing
