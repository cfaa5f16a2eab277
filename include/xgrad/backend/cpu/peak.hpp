// The machine's measured peak arithmetic rate: fused multiply-adds on registers, the roof that
// the benchmark suite's roofline and the LeNet5 example's summary read throughput against.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>

#include <xsimd/xsimd.hpp>

#include "xgrad/backend/cpu/thread_pool.hpp"

namespace xgrad::cpu {

/// FLOPs of one fma_chains() call, whatever the SIMD width.
inline constexpr std::int64_t kFmaChainFlops = std::int64_t{1} << 25;

/// kFmaChainFlops FLOPs of fused multiply-adds on registers, in the SIMD width the library's
/// kernels use: 16 independent accumulators, more than the FMA units' latency times their count,
/// so none waits. Returns their sum, which keeps the work from being optimized away.
inline float fma_chains() {
  using B = xsimd::batch<float>;
  constexpr int chains = 16;
  constexpr std::int64_t steps = kFmaChainFlops / (2 * chains * static_cast<std::int64_t>(B::size));
  // Read through volatile, so that the compiler cannot work the chains out while compiling.
  static volatile float start = 1.0f, factor = 0.9999999f, term = 1e-7f;
  std::array<B, chains> acc;
  for (int c = 0; c < chains; ++c) acc[c] = B(start + 0.001f * static_cast<float>(c));
  const B scale(factor), shift(term);
  for (std::int64_t step = 0; step < steps; ++step)
    for (B& a : acc) a = xsimd::fma(a, scale, shift);
  B sum = acc[0];
  for (int c = 1; c < chains; ++c) sum += acc[c];
  return xsimd::hadd(sum);
}

/// fma_chains() once on each of `threads` threads of the pool, at once; returns the sums' total.
inline float fma_chains_on(int threads) {
  std::array<float, kMaxThreads> sums{};
  parallel_for(0, threads, 1, [&sums](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) sums[static_cast<std::size_t>(t)] = fma_chains();
  });
  float total = 0;
  for (float s : sums) total += s;
  return total;
}

/// The peak FLOP/s measured on `threads` threads of the pool: the best of `repeats` runs of
/// fma_chains_on (a few milliseconds each).
inline double measure_peak_flops(int threads, int repeats = 20) {
  double best = 0;
  volatile float sink = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    sink = sink + fma_chains_on(threads);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, static_cast<double>(threads) * static_cast<double>(kFmaChainFlops) / seconds);
  }
  return best;
}

}  // namespace xgrad::cpu
