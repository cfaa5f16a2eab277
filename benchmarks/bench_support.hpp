// Helpers shared by the benchmark files (bench_eager.cpp, bench_jit.cpp, bench_torch.cpp):
// thread-count scoping, the "faults/iter" counter, the "allocs/call" and "buffers/call" counters,
// the elementwise rate counters, the table of reference rows that ratios divide by, and the
// LeNet5 conv shapes with their registration. It includes
// only std, Google Benchmark and xgrad's thread pool and storage headers, so bench_torch.cpp can
// use it without the rest of xgrad.
#pragma once

#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <map>
#include <string>
#include <utility>

#include "xgrad/backend/cpu/thread_pool.hpp"
#include "xgrad/core/storage.hpp"

namespace xgrad::bench {

/// Thread counts for the `threads` argument of the benchmarks: one thread, or the library
/// default (XGRAD_NUM_THREADS or the hardware concurrency; for LibTorch, one per hardware thread).
inline constexpr int kOneThread = 1;
inline constexpr int kDefaultThreads = 0;

/// The device the xgrad rows run on: `--device=cpu|thrust` (bench_main.cpp). Reference rows
/// (hand loops, OpenBLAS, LibTorch) and rows timing a cpu kernel directly stay on the cpu.
inline Device& bench_device() {
  static Device device = Device::cpu;
  return device;
}

/// For the scope of an xgrad row: the factories (so its inputs, parameters and optimizer state)
/// put tensors on bench_device().
class OnBenchDevice {
 public:
  OnBenchDevice() { set_default_device(bench_device()); }
  ~OnBenchDevice() { set_default_device(Device::cpu); }
  OnBenchDevice(const OnBenchDevice&) = delete;
  OnBenchDevice& operator=(const OnBenchDevice&) = delete;
};

/// Sets xgrad's thread count for one benchmark and restores it afterwards.
/// threads <= 0 selects the library default (XGRAD_NUM_THREADS or the hardware concurrency).
class ThreadScope {
 public:
  explicit ThreadScope(int threads) : m_saved(cpu::num_threads()) { cpu::set_num_threads(threads); }
  ~ThreadScope() { cpu::set_num_threads(m_saved); }
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  int m_saved;
};

/// items/s counts elements; bytes/s counts the bytes an ideal kernel moves (inputs read plus
/// output written once), so the rates of an xgrad op and its hand loop compare directly.
inline void set_elementwise_counters(benchmark::State& state, std::int64_t n, std::int64_t arrays_touched) {
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * arrays_touched * static_cast<std::int64_t>(sizeof(float)));
}

/// Minor page faults of the process so far. Reported per iteration ("faults/iter") next to
/// the timings: fresh result buffers that the allocator had to map (or had handed back to the
/// OS) are touched page by page, and that, not the arithmetic, is then the cost.
inline long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

/// Construct before the benchmark loop, call report() after it: sets "faults/iter".
class FaultCounter {
 public:
  FaultCounter() : m_start(minor_faults()) {}
  void report(benchmark::State& state) const {
    state.counters["faults/iter"] =
        benchmark::Counter(static_cast<double>(minor_faults() - m_start), benchmark::Counter::kAvgIterations);
  }

 private:
  long m_start;
};

/// Calls of any global operator new / new[] (plain, nothrow, aligned) in the whole process so far.
/// Defined in alloc_counter.cpp, which replaces those operators for the benchmark executable.
std::uint64_t operator_new_calls() noexcept;

/// Construct just before the benchmark loop, call report() right after it (before anything else
/// allocates): sets "allocs/call", the operator new calls per iteration, and "buffers/call", the
/// xgrad::Storage objects (tensor element buffers) made per iteration. Storage takes its buffer
/// from std::malloc / std::aligned_alloc (or its cache of large buffers), not operator new, so
/// the two counts are separate: allocs/call is the bookkeeping (tensor handles, vectors, tape
/// nodes), buffers/call the tensors. Both count every thread of the process.
class AllocationCounter {
 public:
  AllocationCounter() : m_news(operator_new_calls()), m_serial(Storage::next_serial()) {}
  void report(benchmark::State& state) const {
    const std::uint64_t news = operator_new_calls() - m_news;
    // Storage::next_serial() numbers every Storage and counts its own calls too: the call in the
    // constructor took one number, and this one returns the next free number before taking it.
    const std::uint64_t buffers = Storage::next_serial() - m_serial - 1;
    state.counters["allocs/call"] = benchmark::Counter(static_cast<double>(news), benchmark::Counter::kAvgIterations);
    state.counters["buffers/call"] =
        benchmark::Counter(static_cast<double>(buffers), benchmark::Counter::kAvgIterations);
  }

 private:
  std::uint64_t m_news;
  std::uint64_t m_serial;
};

// ---- rows divided by a reference row of the same run ------------------------------------------

inline double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

/// ns per iteration of the last run of each reference row, by key. One table for every file
/// (an inline function's static), so an xgrad row can divide by a LibTorch row.
inline std::map<std::string, double>& reference_ns() {
  static std::map<std::string, double> table;
  return table;
}

/// Times a benchmark loop with the calling thread's CPU clock (Google Benchmark's CPU time), or
/// with the wall clock for rows that run on several threads (their real time).
class LoopClock {
 public:
  explicit LoopClock(bool wall = false) : m_wall(wall), m_start(now()) {}
  double ns_per_iteration(const benchmark::State& state) const {
    const double iterations = static_cast<double>(std::max<benchmark::IterationCount>(state.iterations(), 1));
    return (now() - m_start) * 1e9 / iterations;
  }

 private:
  double now() const {
    if (!m_wall) return thread_cpu_seconds();
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  bool m_wall;
  double m_start;
};

inline void record_reference(const benchmark::State& state, const LoopClock& clock, const std::string& key) {
  reference_ns()[key] = clock.ns_per_iteration(state);
}

/// Sets counter `name` to ns / the reference row's ns per call and returns that ratio; returns 0
/// (and sets nothing) when the reference row has not run.
inline double report_ratio(benchmark::State& state, double ns, const std::string& key, const std::string& name) {
  auto it = reference_ns().find(key);
  if (it == reference_ns().end() || it->second <= 0) return 0.0;
  state.counters[name] = ns / it->second;
  return ns / it->second;
}

/// "met" / "missed" for a row's label.
inline const char* verdict(bool met) { return met ? "met" : "missed"; }

// ---- conv2d at the LeNet5 shapes (batch 32), the same for xgrad and LibTorch -----------------

struct ConvCase {
  const char* name;
  std::int64_t batch, in_channels, height, width, out_channels, kernel;
  bool input_grad;  // conv2's input is an activation, so backward also computes dx
};
// conv1: x[32,1,32,32] w[6,1,5,5]; conv2: x[32,6,14,14] w[16,6,5,5]; both valid, stride 1.
inline constexpr ConvCase kConv1{"conv1", 32, 1, 32, 32, 6, 5, false};
inline constexpr ConvCase kConv2{"conv2", 32, 6, 14, 14, 16, 5, true};

inline double conv_forward_flops(const ConvCase& c) {
  const double oh = static_cast<double>(c.height - c.kernel + 1), ow = static_cast<double>(c.width - c.kernel + 1);
  return 2.0 * static_cast<double>(c.batch * c.out_channels * c.in_channels * c.kernel * c.kernel) * oh * ow;
}

inline void set_conv_counters(benchmark::State& state, double flops) {
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

/// A conv benchmark body: (state, shape, threads).
using ConvBenchmark = void (*)(benchmark::State&, ConvCase, int);

/// Registers BM_conv2d_fwd and BM_conv2d_fwdbwd for one shape as `<impl>` (one thread) and
/// `<impl>_mt` (default threads, real time), so the xgrad and torch rows line up.
inline void register_conv(const std::string& impl, ConvBenchmark forward, ConvBenchmark forward_backward,
                          const ConvCase& c) {
  for (const auto& [kind, fn] : {std::pair{"fwd", forward}, std::pair{"fwdbwd", forward_backward}}) {
    const std::string base = std::string("BM_conv2d_") + kind + "/" + impl;
    benchmark::RegisterBenchmark((base + "/" + c.name).c_str(), fn, c, kOneThread)->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark((base + "_mt/" + c.name).c_str(), fn, c, kDefaultThreads)
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
  }
}

// ---- the LeNet5 train step (bench_lenet.cpp) ---------------------------------------------------

inline constexpr std::int64_t kLeNetBatch = 32;

/// The LibTorch LeNet5 train step on `threads` intra-op threads (bench_torch.cpp, compiled with
/// XGRAD_BENCH_HAVE_TORCH); records its ns per step as reference row `key`.
void lenet_step_torch(benchmark::State& state, int threads, const std::string& key);

}  // namespace xgrad::bench
