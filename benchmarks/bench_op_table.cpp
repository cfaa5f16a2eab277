// Analysis rows: the op table's rows (tests/ops/op_table.cpp) timed one by one, float32, one
// thread, on the --device:
//   op_table/<row>/eager       the row's forward, op by op
//   op_table/<row>/jit_O2      the same under xg::jit at O2 (traced before the timing)
//   op_table/<row>/eager_grad  forward and backward: the gradients of sum(row(x) * w) with respect
//                              to every input (differentiable rows only)
// Each input's axes longer than 1 are multiplied by the largest factor of 64, 32, ..., 2 that
// keeps every input and the output within 65536 elements and that the row accepts: rows with
// fixed labels, a fixed target shape or a fixed one-hot depth refuse all of them and run at their
// own shapes. Timing two builds with the
// same filter and comparing row by row shows a slowdown in one op where it happens. Not a suite
// of run_suite.py: `xgrad_bench --benchmark_filter=op_table/` runs them.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <xgrad/xgrad.hpp>

#include "ops/op_table.hpp"
#include "suite.hpp"

namespace xg = xgrad;

namespace {

using InputShapes = std::vector<std::vector<std::int64_t>>;

constexpr std::int64_t kLargestFactor = 64;
constexpr std::int64_t kMostElements = std::int64_t{1} << 16;

std::vector<xg::Tensor<float>> row_inputs(const xg::testing::OpCase& row, const InputShapes& shapes) {
  std::vector<xg::Tensor<float>> in;
  for (std::size_t k = 0; k < shapes.size(); ++k)
    in.push_back(xg::testing::to_tensor<float>(xg::testing::random_input(shapes[k], row.domains[k], 3 + 31 * k)));
  return in;
}

/// The row's shapes scaled as the file's header says; found once per row (a refused factor
/// costs a call of the row), then remembered.
const InputShapes& timed_shapes(const xg::testing::OpCase& row) {
  static std::map<std::string, InputShapes> found;
  if (auto it = found.find(row.name); it != found.end()) return it->second;
  InputShapes chosen = row.shapes;
  for (std::int64_t factor = kLargestFactor; factor > 1; factor /= 2) {
    InputShapes shapes = row.shapes;
    bool fits = true;
    for (auto& shape : shapes) {
      std::int64_t n = 1;
      for (auto& d : shape) {
        if (d > 1) d *= factor;  // 1 stays 1 (broadcasting, squeezed axes), 0 stays 0
        n *= d;
      }
      fits = fits && n <= kMostElements;
    }
    if (!fits) continue;
    try {
      if (row.f32(row_inputs(row, shapes)).numel() > kMostElements) continue;  // a broadcast output, say
      chosen = shapes;
      break;
    } catch (const std::invalid_argument&) {  // ShapeError or ValueError: the row needs its own shapes
    }
  }
  return found.emplace(row.name, chosen).first->second;
}

enum class RowMode { eager, jit_O2, eager_grad };

/// The call timed for a row in a mode; its inputs are made here, on the --device.
xg::bench::Call op_table_call(const xg::testing::OpCase& row, RowMode mode) {
  const auto& f = row.f32;
  const auto in = row_inputs(row, timed_shapes(row));
  switch (mode) {
    case RowMode::eager:
      return [&f, in] { benchmark::DoNotOptimize(f(in)); };
    case RowMode::jit_O2: {
      auto compiled = xg::jit([&f](std::vector<xg::Tensor<float>> xs) { return f(xs); }, {.level = xg::JitLevel::O2});
      compiled(in);
      return [compiled, in] {
        xg::expect_cache_hit hit;  // a retrace would time the compiler: the row fails instead
        benchmark::DoNotOptimize(compiled(in));
      };
    }
    case RowMode::eager_grad: {
      const auto weights = xg::testing::to_tensor<float>(
          xg::testing::random_input(f(in).shape().to_vector(), xg::testing::Domain::any, 5));
      return [&f, in, weights] { benchmark::DoNotOptimize(xg::testing::loss_and_grads<float>(f, in, weights)); };
    }
  }
  throw std::logic_error("bench_op_table: unknown mode");
}

const bool kOpTableRegistered = [] {
  for (const auto& row : xg::testing::op_table())
    for (auto [mode, name] : {std::pair{RowMode::eager, "eager"}, std::pair{RowMode::jit_O2, "jit_O2"},
                              std::pair{RowMode::eager_grad, "eager_grad"}}) {
      if (mode == RowMode::eager_grad && !row.differentiable) continue;
      xg::bench::register_row(
          "op_table", row.name, name, 1, [&row, mode] { return op_table_call(row, mode); }, /*on_bench_device=*/true);
    }
  return true;
}();

}  // namespace
