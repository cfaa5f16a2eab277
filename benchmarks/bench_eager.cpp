// xgrad benchmarks: eager-mode costs.
//   (a) dispatch overhead of `a + b` on tiny tensors, with and without autodiff recording;
//   (b) single elementwise ops on 1e6 floats against a hand-written xsimd loop (the 1.3x
//       target), and a 6-op chain run eagerly against the same chain fused by hand;
//   (c) conv2d forward and forward+backward at the LeNet5 shapes (batch 32).
// Names line up with bench_torch.cpp: BM_<case>/<impl>/<size>, impl one of xgrad (one
// thread), xgrad_mt (default threads, real time), xsimd_loop / xsimd_fused / xsimd_6pass
// (hand-written, one thread) and torch / torch_mt.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include <xsimd/xsimd.hpp>

#include <xgrad/xgrad.hpp>

#include "bench_support.hpp"

namespace xg = xgrad;

namespace {

using namespace xgrad::bench;

using SimdBatch = xsimd::batch<float>;
constexpr std::int64_t kLanes = static_cast<std::int64_t>(SimdBatch::size);

xg::Tensor<float> random_vector(std::int64_t n, std::uint64_t seed) { return xg::randn<float>(xg::Shape{n}, seed); }

// ---- (a) dispatch overhead ----------------------------------------------------------------

/// `a + b` on n-element vectors; with `grad`, a requires grad, so each sum records a tape node
/// that is dropped with the result at the end of the iteration.
void dispatch_add(benchmark::State& state, bool grad) {
  OnBenchDevice on_device;
  ThreadScope threads(kOneThread);
  const std::int64_t n = state.range(0);
  auto a = random_vector(n, 1);
  auto b = random_vector(n, 2);
  if (grad) a.set_requires_grad(true);
  for (auto _ : state) {
    auto c = a + b;
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_elementwise_counters(state, n, 3);
}

BENCHMARK_CAPTURE(dispatch_add, plain, false)->Name("BM_dispatch_add/xgrad")->Arg(1)->Arg(1000);
BENCHMARK_CAPTURE(dispatch_add, grad, true)->Name("BM_dispatch_add_grad/xgrad")->Arg(1)->Arg(1000);

// ---- (b) single elementwise ops against a hand-written xsimd loop ---------------------------
// Each op's body is written once as a generic lambda that serves both the SIMD main loop and
// the scalar tail of the hand loop. The hand loop writes into a buffer allocated once; the
// xgrad op allocates its result every call, as eager code does.

struct AddOp {
  static constexpr int arity = 2;
  static xg::Tensor<float> run(const xg::Tensor<float>& a, const xg::Tensor<float>& b) { return a + b; }
  template <class V> static V body(const V& a, const V& b) { return a + b; }
};
struct MulOp {
  static constexpr int arity = 2;
  static xg::Tensor<float> run(const xg::Tensor<float>& a, const xg::Tensor<float>& b) { return a * b; }
  template <class V> static V body(const V& a, const V& b) { return a * b; }
};
struct ExpOp {
  static constexpr int arity = 1;
  static xg::Tensor<float> run(const xg::Tensor<float>& x) { return xg::exp(x); }
  template <class V> static V body(const V& x) { return xsimd::exp(x); }
};
struct ReluOp {
  static constexpr int arity = 1;
  static xg::Tensor<float> run(const xg::Tensor<float>& x) { return xg::relu(x); }
  template <class V> static V body(const V& x) { return xsimd::max(x, V(0)); }
};

template <class Op> void hand_unary(const float* x, float* y, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) Op::body(SimdBatch::load_unaligned(x + i)).store_unaligned(y + i);
  for (; i < n; ++i) y[i] = Op::body(x[i]);
}

template <class Op> void hand_binary(const float* a, const float* b, float* y, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    Op::body(SimdBatch::load_unaligned(a + i), SimdBatch::load_unaligned(b + i)).store_unaligned(y + i);
  for (; i < n; ++i) y[i] = Op::body(a[i], b[i]);
}

/// The xgrad op, out of place (a fresh result tensor per call).
template <class Op> void elementwise_xgrad(benchmark::State& state, int threads) {
  OnBenchDevice on_device;
  ThreadScope scope(threads);
  const std::int64_t n = state.range(0);
  auto a = random_vector(n, 1);
  auto b = random_vector(n, 2);
  auto call = [&] {
    if constexpr (Op::arity == 2)
      return Op::run(a, b);
    else
      return Op::run(a);
  };
  call();  // warm-up: the allocator's first growth is not what is measured
  FaultCounter faults;
  for (auto _ : state) {
    xg::Tensor<float> y = call();
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  faults.report(state);
  set_elementwise_counters(state, n, Op::arity + 1);
}

/// The same op by hand over xsimd batches, into a preallocated buffer; one thread.
template <class Op> void elementwise_hand(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  auto a = random_vector(n, 1);
  auto b = random_vector(n, 2);
  auto y = xg::Tensor<float>::empty(xg::Shape{n});  // 64-byte aligned, like xgrad's results
  const float* pa = a.data();
  const float* pb = b.data();
  float* py = y.data();
  if constexpr (Op::arity == 2)
    hand_binary<Op>(pa, pb, py, n);  // warm-up: touch the output
  else
    hand_unary<Op>(pa, py, n);
  FaultCounter faults;
  for (auto _ : state) {
    if constexpr (Op::arity == 2)
      hand_binary<Op>(pa, pb, py, n);
    else
      hand_unary<Op>(pa, py, n);
    benchmark::DoNotOptimize(py);
    benchmark::ClobberMemory();
  }
  faults.report(state);
  set_elementwise_counters(state, n, Op::arity + 1);
}

template <class Op> void register_elementwise(const std::string& name) {
  benchmark::RegisterBenchmark((name + "/xgrad").c_str(), elementwise_xgrad<Op>, kOneThread)->Arg(1000000);
  benchmark::RegisterBenchmark((name + "/xsimd_loop").c_str(), elementwise_hand<Op>)->Arg(1000000);
  benchmark::RegisterBenchmark((name + "/xgrad_mt").c_str(), elementwise_xgrad<Op>, kDefaultThreads)
      ->Arg(1000000)
      ->UseRealTime();
}

// ---- (b') a 6-op chain: eager (six passes, six allocations) against one fused pass ----------
// y = relu((x * 2 + 1) * x - 0.5) / 3: Mul, Add, Mul, Sub, ReLU, Div.

struct Chain {
  static xg::Tensor<float> run(const xg::Tensor<float>& x) { return xg::relu((x * 2.0f + 1.0f) * x - 0.5f) / 3.0f; }
  template <class V> static V body(const V& x) {
    return xsimd::max((x * V(2.0f) + V(1.0f)) * x - V(0.5f), V(0.0f)) / V(3.0f);
  }
};

void chain_xgrad(benchmark::State& state, int threads) {
  OnBenchDevice on_device;
  ThreadScope scope(threads);
  const std::int64_t n = state.range(0);
  auto x = random_vector(n, 3);
  Chain::run(x);  // warm-up
  FaultCounter faults;
  for (auto _ : state) {
    auto y = Chain::run(x);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  faults.report(state);
  set_elementwise_counters(state, n, 2);
}

void chain_fused(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  auto x = random_vector(n, 3);
  auto y = xg::Tensor<float>::empty(xg::Shape{n});
  {
    // Check once that the fused loop computes what the eager chain does.
    ThreadScope scope(kOneThread);
    hand_unary<Chain>(x.data(), y.data(), n);
    auto ref = Chain::run(x);
    for (std::int64_t i = 0; i < n; i += std::max<std::int64_t>(1, n / 997)) {
      const float want = ref.data()[i], got = y.data()[i];
      if (std::abs(want - got) > 1e-5f * (1.0f + std::abs(want))) {
        state.SkipWithError("fused loop disagrees with the eager xgrad chain");
        return;
      }
    }
  }
  const float* px = x.data();
  float* py = y.data();
  FaultCounter faults;
  for (auto _ : state) {
    hand_unary<Chain>(px, py, n);
    benchmark::DoNotOptimize(py);
    benchmark::ClobberMemory();
  }
  faults.report(state);
  set_elementwise_counters(state, n, 2);
}

struct Times2 {
  template <class V> static V body(const V& x) { return x * V(2.0f); }
};
struct Plus1 {
  template <class V> static V body(const V& x) { return x + V(1.0f); }
};
struct Minus05 {
  template <class V> static V body(const V& x) { return x - V(0.5f); }
};
struct Div3 {
  template <class V> static V body(const V& x) { return x / V(3.0f); }
};

/// The chain as six hand-written passes into two preallocated scratch buffers: the memory
/// traffic of eager execution without its allocations and dispatch.
void chain_six_pass(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  auto x = random_vector(n, 3);
  auto t = xg::Tensor<float>::empty(xg::Shape{n});
  auto u = xg::Tensor<float>::empty(xg::Shape{n});
  const float* px = x.data();
  float* pt = t.data();
  float* pu = u.data();
  std::fill_n(pt, n, 0.0f);  // warm-up: touch the scratch buffers
  std::fill_n(pu, n, 0.0f);
  FaultCounter faults;
  for (auto _ : state) {
    hand_unary<Times2>(px, pt, n);
    hand_unary<Plus1>(pt, pu, n);
    hand_binary<MulOp>(pu, px, pt, n);
    hand_unary<Minus05>(pt, pu, n);
    hand_unary<ReluOp>(pu, pt, n);
    hand_unary<Div3>(pt, pu, n);
    benchmark::DoNotOptimize(pu);
    benchmark::ClobberMemory();
  }
  faults.report(state);
  set_elementwise_counters(state, n, 2);
}

// ---- (c) conv2d at the LeNet5 shapes (ConvCase, kConv1, kConv2: bench_support.hpp) -----------

void conv_forward(benchmark::State& state, ConvCase c, int threads) {
  OnBenchDevice on_device;
  ThreadScope scope(threads);
  auto x = xg::randn<float>({c.batch, c.in_channels, c.height, c.width}, 5);
  auto w = xg::randn<float>({c.out_channels, c.in_channels, c.kernel, c.kernel}, 6);
  for (auto _ : state) {
    auto y = xg::conv2d(x, w, {.pad_mode = xg::PadMode::valid});
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  set_conv_counters(state, conv_forward_flops(c));
}

/// sum(conv2d(x, w)).backward(): dw always, dx for conv2. Gradients are reset every
/// iteration so nothing accumulates.
void conv_forward_backward(benchmark::State& state, ConvCase c, int threads) {
  OnBenchDevice on_device;
  ThreadScope scope(threads);
  auto x = xg::randn<float>({c.batch, c.in_channels, c.height, c.width}, 5);
  auto w = xg::randn<float>({c.out_channels, c.in_channels, c.kernel, c.kernel}, 6);
  w.set_requires_grad(true);
  if (c.input_grad) x.set_requires_grad(true);
  for (auto _ : state) {
    w.zero_grad();
    if (c.input_grad) x.zero_grad();
    auto y = xg::conv2d(x, w, {.pad_mode = xg::PadMode::valid});
    xg::sum(y).backward();
    benchmark::DoNotOptimize(w.grad().data());
    benchmark::ClobberMemory();
  }
  set_conv_counters(state, conv_forward_flops(c) * (c.input_grad ? 3.0 : 2.0));
}

const bool kEagerRegistered = [] {
  register_elementwise<AddOp>("BM_binary_add");
  register_elementwise<MulOp>("BM_binary_mul");
  register_elementwise<ExpOp>("BM_unary_exp");
  register_elementwise<ReluOp>("BM_unary_relu");

  for (std::int64_t n : {1000000, 10000000}) {
    benchmark::RegisterBenchmark("BM_chain6/xgrad", chain_xgrad, kOneThread)->Arg(n)->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("BM_chain6/xsimd_fused", chain_fused)->Arg(n)->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("BM_chain6/xsimd_6pass", chain_six_pass)->Arg(n)->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("BM_chain6/xgrad_mt", chain_xgrad, kDefaultThreads)
        ->Arg(n)
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
  }

  register_conv("xgrad", conv_forward, conv_forward_backward, kConv1);
  register_conv("xgrad", conv_forward, conv_forward_backward, kConv2);
  return true;
}();

}  // namespace
