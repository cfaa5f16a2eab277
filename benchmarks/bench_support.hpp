// Helpers shared by the benchmark files: the --device the xgrad rows run on, thread-count
// scoping, and the table of reference rows that the analysis rows' ratios divide by. It includes
// only std, Google Benchmark and xgrad's thread pool and storage headers, so suite_libtorch.cpp
// can use it without the rest of xgrad.
#pragma once

#include <benchmark/benchmark.h>

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

}  // namespace xgrad::bench
