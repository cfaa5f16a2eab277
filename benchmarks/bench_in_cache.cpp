// Analysis rows: the elementwise chain of the suite (workloads.hpp: chain7) over one in-cache
// block of 1024 floats, where the O2 fused kernel's design shows apart from its per-call costs.
// That kernel runs, per block (FusedKernel sizes blocks per group: 1024 elements for this chain),
// one block kernel per step (an op's own xsimd loop, the one eager runs, or a unary op merged with
// a cheap neighbour) over L1 scratch blocks, so over an in-cache block its time cannot go below
// the sum of those kernels' times. One thread; each row reports ns per element ("ns/elem", CPU
// time) and, divided by BM_ChainInCache/hand of its size (registered, and so run, first), "x_hand".
//   BM_ChainInCache/hand[/65536]    the hand loop (chain7_hand) over 1024 (65536) floats, repeated
//   BM_ChainInCache/steps           the three block kernels of the O2 fused body, in its order
//   BM_BlockKernel/<op>             one block kernel alone
//   BM_ChainInCache/jit_O2[/65536]  the jitted chain, with its per-call costs and allocations
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <xgrad/ops/elementwise-inl.hpp>  // the op structs and their block kernels
#include <xgrad/xgrad.hpp>

#include "suite.hpp"
#include "workloads.hpp"

namespace xg = xgrad;

namespace {

using namespace xgrad::bench;
/// |want| floored at 1, so that values near zero compare absolutely); else where it does not.
std::string disagreement(const xg::Tensor<float>& got, const xg::Tensor<float>& want, double rel) {
  if (got.shape() != want.shape()) return "shapes differ";
  const std::vector<float> g = got.to_vector(), w = want.to_vector();  // host copies (either device)
  for (std::size_t i = 0; i < w.size(); ++i) {
    const double a = g[i], b = w[i];
    if (!(std::abs(a - b) <= rel * std::max(1.0, std::abs(b))))
      return "element " + std::to_string(i) + ": " + std::to_string(a) + " against " + std::to_string(b);
  }
  return {};
}

xg::Tensor<float> chain_input(std::int64_t n) { return xg::randn<float>(xg::Shape{n}, 7); }

// ---- (e) the chain over one in-cache block: the fused kernel's steps against the hand loop ----
// At O2 the chain is one fused node whose kernel runs, per block of 1024 elements, one block
// kernel per step over L1 scratch blocks (a step: one op, or a unary op merged with a cheap
// neighbour). Timed over a single in-cache block, the sum of those kernels bounds that design
// from below: no per-block overhead removed can take it under the sum. The rows time the hand
// loop, the steps as the kernel runs them, each kernel alone and the jitted chain, and report
// ns per element ("ns/elem", CPU time).

// One block of the chain's fused kernel (FusedKernel sizes blocks per group; the chain, 24 bytes
// per element, gets 1024): 4 KiB of floats.
constexpr std::int64_t kInCacheSize = 1024;
constexpr std::int64_t kInL2Size = 65536;  // 64 blocks: enough to amortize a call; x and y (256 KiB each) in L2

/// Buffers of n floats laid out as FusedKernel lays out its scratch blocks: each starts on a
/// cache line, and consecutive ones are a multiple of 4 KiB plus 128 bytes apart, so a kernel's
/// loads never wait on its stores to the same page offset. Every in-cache row reads and writes
/// these, so the rows differ by the code they run, not by where malloc put their buffers.
class BlockBuffers {
 public:
  BlockBuffers(std::int64_t n, int count)
      : m_stride(((static_cast<std::size_t>(n) * sizeof(float) + 4095) / 4096 * 4096 + 128) / sizeof(float)),
        m_storage(m_stride * static_cast<std::size_t>(count) + kLineFloats) {
    const std::size_t misalignment = reinterpret_cast<std::uintptr_t>(m_storage.data()) % 64 / sizeof(float);
    m_first = m_storage.data() + (misalignment ? kLineFloats - misalignment : 0);
  }
  float* operator[](int i) { return m_first + static_cast<std::size_t>(i) * m_stride; }

 private:
  static constexpr std::size_t kLineFloats = 64 / sizeof(float);
  std::size_t m_stride;  // floats from one buffer to the next
  std::vector<float> m_storage;
  float* m_first = nullptr;
};

/// The chain's O2 fused body, step by step. `lower(x).ir()` prints its ops as x*x, sigmoid(x),
/// fma(x, 1.5, 0.25), tanh, fma(tanh, sigmoid, x*x) (simplify makes each multiply feeding only
/// an add one fma) and the pairs the kernel merges as `merged="Fma+Tanh, Sigmoid+Fma"`: three
/// steps, each through the block kernel the fused kernel calls, each result in the scratch
/// block FusedKernel::assign_scratch gives it, the scalars read with stride 0, and the last
/// step writing y.
void chain_steps(const float* x, float* y, std::int64_t n, const std::array<float*, 2>& scratch) {
  namespace op = xgrad::op;
  const float scale = 1.5f, shift = 0.25f;
  const std::int64_t full[3] = {1, 1, 1}, affine[3] = {1, 0, 0};
  float *square = scratch[0], *tanh = scratch[1];
  const void* mul_args[2] = {x, x};
  xgrad::cpu::binary_block<op::Mul, float, float>(mul_args, full, square, n);
  const void* tanh_args[3] = {x, &scale, &shift};
  xgrad::cpu::unary_after_block<op::Tanh, op::Fma, float>(tanh_args, affine, tanh, n);
  const void* last_args[3] = {x, tanh, square};  // sigmoid(x) is the fma's operand 1
  xgrad::cpu::unary_into_block<op::Sigmoid, op::Fma, 1, float>(last_args, full, y, n);
}

/// Sets "ns/elem" (CPU ns per iteration / n) and returns the ns per iteration.
double report_ns_per_element(benchmark::State& state, const LoopClock& clock, std::int64_t n) {
  const double ns = clock.ns_per_iteration(state);
  state.counters["ns/elem"] = ns / static_cast<double>(n);
  return ns;
}

std::string in_cache_key(std::int64_t n) { return "chain/in_cache/" + std::to_string(n); }

/// x in buffer 0, y in buffer 1, then scratch: the chain's input copied in, its size kept opaque
/// to the compiler (the fused kernel's block length is a runtime value too).
struct InCacheChain {
  std::int64_t n;
  BlockBuffers buffers;
  xg::Tensor<float> x;  // the same values, as a tensor, for the checks
  explicit InCacheChain(std::int64_t size, int scratch_buffers = 0)
      : n(size), buffers(size, 2 + scratch_buffers), x(chain_input(size)) {
    std::copy_n(x.data(), n, buffers[0]);
    benchmark::DoNotOptimize(n);
  }
  /// Scratch buffer i (after x and y).
  float* scratch(int i) { return buffers[2 + i]; }
  /// The output as a tensor, to compare with eager or jitted results.
  xg::Tensor<float> y() { return xg::tensor<float>(std::vector<float>(buffers[1], buffers[1] + n)); }
};

/// The hand-written loop (chain7_hand) over n floats, repeated: the reference of the (e) rows.
void chain_in_cache_hand(benchmark::State& state, std::int64_t size) {
  ThreadScope threads(1);
  InCacheChain c(size);
  const float* x = c.buffers[0];
  float* y = c.buffers[1];
  chain7_hand(x, y, c.n);  // warm-up: the buffers into cache
  if (auto why = disagreement(c.y(), chain7(c.x), 1e-6); !why.empty()) {
    state.SkipWithError(("hand-fused chain disagrees with eager xgrad: " + why).c_str());
    return;
  }
  LoopClock clock;
  for (auto _ : state) {
    benchmark::DoNotOptimize(x);
    chain7_hand(x, y, c.n);
    benchmark::DoNotOptimize(y);
    benchmark::ClobberMemory();
  }
  record_reference(state, clock, in_cache_key(size));
  report_ns_per_element(state, clock, size);
}

/// The block kernels of the fused kernel, one after another over one in-cache block; checked
/// bit for bit against the jitted chain, whose single block runs the same kernels.
void chain_in_cache_steps(benchmark::State& state) {
  ThreadScope threads(1);
  InCacheChain c(kInCacheSize, 2);
  const float* x = c.buffers[0];
  float* y = c.buffers[1];
  const std::array<float*, 2> scratch{c.scratch(0), c.scratch(1)};
  chain_steps(x, y, c.n, scratch);
  auto jitted = xg::jit([](const xg::Tensor<float>& t) { return chain7(t); }, {.level = xg::JitLevel::O2});
  if (auto why = disagreement(c.y(), jitted(c.x), 0.0); !why.empty()) {
    state.SkipWithError(("the steps disagree with the jitted chain: " + why).c_str());
    return;
  }
  LoopClock clock;
  for (auto _ : state) {
    benchmark::DoNotOptimize(x);
    chain_steps(x, y, c.n, scratch);
    benchmark::DoNotOptimize(y);
    benchmark::ClobberMemory();
  }
  const double ns = report_ns_per_element(state, clock, kInCacheSize);
  report_ratio(state, ns, in_cache_key(kInCacheSize), "x_hand");
}

/// One block kernel: out = op(a), op(a, b) or op(a, b, a), all operands full blocks.
using BlockKernelFn = void (*)(const float* a, const float* b, float* out, std::int64_t n);
template <class Op> void unary_kernel(const float* a, const float*, float* out, std::int64_t n) {
  xgrad::cpu::detail::unary_run<Op>(a, out, n);
}
template <class Op> void binary_kernel(const float* a, const float* b, float* out, std::int64_t n) {
  xgrad::cpu::detail::binary_run<Op>(a, 1, b, 1, out, n);
}
template <class Op> void ternary_kernel(const float* a, const float* b, float* out, std::int64_t n) {
  xgrad::cpu::detail::ternary_run<Op>(a, 1, b, 1, a, 1, out, n);
}
/// A unary op merged with the fma feeding it (Op(fma(a, b, a))) or reading it (fma(Op(a), b, a)).
template <class Op> void fma_then_kernel(const float* a, const float* b, float* out, std::int64_t n) {
  const void* in[3] = {a, b, a};
  const std::int64_t stride[3] = {1, 1, 1};
  xgrad::cpu::unary_after_block<Op, xgrad::op::Fma, float>(in, stride, out, n);
}
template <class Op> void then_fma_kernel(const float* a, const float* b, float* out, std::int64_t n) {
  const void* in[3] = {a, b, a};
  const std::int64_t stride[3] = {1, 1, 1};
  xgrad::cpu::unary_into_block<Op, xgrad::op::Fma, 0, float>(in, stride, out, n);
}

/// One block kernel alone over one in-cache block, repeated: a term of the steps' sum.
void block_kernel(benchmark::State& state, BlockKernelFn kernel) {
  ThreadScope threads(1);
  InCacheChain c(kInCacheSize, 1);
  const auto other = xg::randn<float>(xg::Shape{kInCacheSize}, 8);  // b of the binary kernels
  std::copy_n(other.data(), kInCacheSize, c.scratch(0));
  const float *a = c.buffers[0], *b = c.scratch(0);
  float* out = c.buffers[1];
  kernel(a, b, out, c.n);  // warm-up
  LoopClock clock;
  for (auto _ : state) {
    benchmark::DoNotOptimize(a);
    benchmark::DoNotOptimize(b);
    kernel(a, b, out, c.n);
    benchmark::DoNotOptimize(out);
    benchmark::ClobberMemory();
  }
  report_ns_per_element(state, clock, kInCacheSize);
}

/// The jitted chain (O2) on an n-element tensor: each call adds its fixed cost (argument checks,
/// cache lookup, the result's allocation) to the n elements' work, which 1024 elements do not
/// amortize and 65536 do. Checked against eager once (the one trace); also reports the suite's
/// allocation counters (suite.hpp: RowMeter).
void chain_in_cache_jit(benchmark::State& state, std::int64_t size) {
  RowMeter meter;
  ThreadScope threads(1);
  auto x = chain_input(size);
  auto f = xg::jit([](const xg::Tensor<float>& t) { return chain7(t); }, {.level = xg::JitLevel::O2, .name = "chain7"});
  if (auto why = disagreement(f(x), chain7(x), 1e-6); !why.empty()) {
    state.SkipWithError(("jitted chain disagrees with eager: " + why).c_str());
    return;
  }
  LoopClock clock;
  meter.start_loop();
  {
    xg::expect_cache_hit guard;
    for (auto _ : state) {
      auto y = f(x);
      benchmark::DoNotOptimize(y.data());
      benchmark::ClobberMemory();
    }
  }
  meter.report(state);
  const double ns = report_ns_per_element(state, clock, size);
  report_ratio(state, ns, in_cache_key(size), "x_hand");
}

const bool kInCacheRegistered = [] {
  // Each reference (hand) row first: the rows after it divide by its time.
  benchmark::RegisterBenchmark("BM_ChainInCache/hand", chain_in_cache_hand, kInCacheSize);
  benchmark::RegisterBenchmark("BM_ChainInCache/steps", chain_in_cache_steps);
  namespace op = xgrad::op;
  for (const auto& [name, kernel] :
       {std::pair{"Tanh", &unary_kernel<op::Tanh>}, std::pair{"Sigmoid", &unary_kernel<op::Sigmoid>},
        std::pair{"Mul", &binary_kernel<op::Mul>}, std::pair{"Add", &binary_kernel<op::Add>},
        std::pair{"Fma", &ternary_kernel<op::Fma>}, std::pair{"Fma+Tanh", &fma_then_kernel<op::Tanh>},
        std::pair{"Sigmoid+Fma", &then_fma_kernel<op::Sigmoid>}})
    benchmark::RegisterBenchmark((std::string("BM_BlockKernel/") + name).c_str(), block_kernel, kernel);
  benchmark::RegisterBenchmark("BM_ChainInCache/jit_O2", chain_in_cache_jit, kInCacheSize);
  benchmark::RegisterBenchmark("BM_ChainInCache/hand/65536", chain_in_cache_hand, kInL2Size)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("BM_ChainInCache/jit_O2/65536", chain_in_cache_jit, kInL2Size)
      ->Unit(benchmark::kMicrosecond);
  return true;
}();

}  // namespace
