// xgrad benchmarks: xgrad::cpu::gemm against OpenBLAS cblas_sgemm (GFLOP/s).
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cstdint>
#include <random>
#include <vector>

#include "xgrad/backend/cpu/gemm.hpp"
#include "xgrad/backend/cpu/thread_pool.hpp"

namespace {

struct SquareOperands {
  explicit SquareOperands(int64_t n) : m_a(static_cast<size_t>(n * n)), m_b(m_a.size()), m_c(m_a.size()) {
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (auto& x : m_a) x = dist(rng);
    for (auto& x : m_b) x = dist(rng);
  }
  std::vector<float> m_a, m_b, m_c;
};

void set_flops(benchmark::State& state, int64_t n) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
}

void run_xgrad_sgemm(benchmark::State& state, int threads) {
  const int64_t n = state.range(0);
  SquareOperands ops(n);
  // Keep OpenBLAS's own workers idle so they do not compete for cores.
  openblas_set_num_threads(1);
  const int saved = xgrad::cpu::num_threads();
  xgrad::cpu::set_num_threads(threads);
  for (auto _ : state) {
    xgrad::cpu::gemm<float>(n, n, n, 1.0f, ops.m_a.data(), n, 1, ops.m_b.data(), n, 1, 0.0f, ops.m_c.data(), n);
    benchmark::DoNotOptimize(ops.m_c.data());
    benchmark::ClobberMemory();
  }
  xgrad::cpu::set_num_threads(saved);
  set_flops(state, n);
}

void BM_xgrad_sgemm(benchmark::State& state) { run_xgrad_sgemm(state, 1); }

/// All hardware threads (or XGRAD_NUM_THREADS).
void BM_xgrad_sgemm_mt(benchmark::State& state) { run_xgrad_sgemm(state, 0); }

void BM_openblas_sgemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  SquareOperands ops(n);
  openblas_set_num_threads(1);
  const auto ni = static_cast<blasint>(n);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0f, ops.m_a.data(), ni, ops.m_b.data(), ni,
                0.0f, ops.m_c.data(), ni);
    benchmark::DoNotOptimize(ops.m_c.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, n);
}

}  // namespace

BENCHMARK(BM_xgrad_sgemm)->Arg(64)->Arg(256)->Arg(1024);
BENCHMARK(BM_openblas_sgemm)->Arg(64)->Arg(256)->Arg(1024);
BENCHMARK(BM_xgrad_sgemm_mt)->Arg(64)->Arg(256)->Arg(1024)->UseRealTime();
