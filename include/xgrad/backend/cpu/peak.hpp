// The machine's measured peak arithmetic rate: fused multiply-adds on registers, the roof that
// the benchmark suite's roofline and the LeNet5 example's summary read throughput against.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <utility>

#include <xsimd/xsimd.hpp>

#include "xgrad/backend/cpu/thread_pool.hpp"

namespace xgrad::cpu {

/// Independent accumulators of fma_chains(): more than the FMA units' latency times their
/// count, so none waits, and with the two operands no more than the vector registers (x86-64
/// has 16 below AVX-512, where 16 accumulators would spill one to the stack and halve the
/// rate: 59 against 104 GFLOP/s on a Zen 3; AVX-512 and AArch64 have 32).
#if (defined(__x86_64__) || defined(__i386__)) && !defined(__AVX512F__)
inline constexpr int kFmaChains = 12;
#else
inline constexpr int kFmaChains = 16;
#endif

/// FLOPs of one fma_chains() call, whatever the SIMD width.
inline constexpr std::int64_t kFmaChainFlops = std::int64_t{1} << 25;

/// kFmaChainFlops FLOPs of fused multiply-adds on registers, in the SIMD width the library's
/// kernels use, on kFmaChains accumulators. Returns their sum, which keeps the work from being
/// optimized away.
inline float fma_chains() {
  using B = xsimd::batch<float>;
  // Read through volatile, so that the compiler cannot work the chains out while compiling.
  static volatile float start = 1.0f, factor = 0.9999999f, term = 1e-7f;
  const B scale(factor), shift(term);
  constexpr std::int64_t fmas = kFmaChainFlops / (2 * static_cast<std::int64_t>(B::size));
  // Each accumulator named by a constant index, so that -O2 keeps them all in registers too.
  return [&]<std::size_t... c>(std::index_sequence<c...>) {
    std::array<B, kFmaChains> acc{B(start + 0.001f * static_cast<float>(c))...};
    for (std::int64_t step = 0; step < fmas / kFmaChains; ++step) ((acc[c] = xsimd::fma(acc[c], scale, shift)), ...);
    ((c < fmas % kFmaChains ? acc[c] = xsimd::fma(acc[c], scale, shift) : acc[c]), ...);
    return xsimd::hadd((acc[c] + ...));
  }
  (std::make_index_sequence<kFmaChains>{});
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
