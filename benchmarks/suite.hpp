// The benchmark suite's rows: every workload registered as "<suite>/<workload>/<impl>", where
// impl is how it runs: xgrad eagerly (`eager`), compiled at a level (`jit_O0`, `jit_O1`,
// `jit_O2`), or a reference in the same executable (`hand`: a hand-written xsimd loop,
// `openblas`, `libtorch`). benchmarks/run_suite.py runs the rows suite by suite, alternating
// with the Python peers, and writes the report; benchmarks/workloads.py lists the workloads.
//
// Every row reports, besides its time:
//   allocs/call  heap allocations (malloc and friends, operator new included) per call, counted
//                over the timed loop by heap_count.cpp, which interposes on glibc's allocator;
//   buffers/call xgrad tensor buffers (Storage objects) made per call (xgrad rows);
//   peak_MiB     the process's peak resident memory during the row (inputs, warm-up and loop)
//                above its resident memory when the row started, after xgrad's buffer cache
//                and glibc's free memory were handed back: what the workload needs.
#pragma once

#include <benchmark/benchmark.h>
#include <malloc.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bench_support.hpp"

extern "C" std::uint64_t xgrad_heap_allocations() noexcept;  // heap_count.cpp
extern "C" void openblas_set_num_threads(int);               // cblas.h; xgrad_bench links OpenBLAS

namespace xgrad::bench {

// ---- memory of the process, from /proc/self/status ----------------------------------------------

/// A "VmRSS" / "VmHWM" line of /proc/self/status in bytes, or -1 where it cannot be read.
inline double proc_status_bytes(std::string_view field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.compare(0, field.size(), field) == 0 && line.size() > field.size() && line[field.size()] == ':')
      return std::stod(line.substr(field.size() + 1)) * 1024.0;  // the kernel writes kB
  return -1.0;
}

/// Resets the process's peak resident size (VmHWM) to its current size; false where the kernel
/// does not allow it, and then no peak is reported.
inline bool reset_peak_rss() {
  std::ofstream clear_refs("/proc/self/clear_refs");
  clear_refs << "5";
  clear_refs.flush();
  return static_cast<bool>(clear_refs);
}

/// The memory and allocation counters of one row: construct at the row's start, before its
/// inputs exist; call start_loop() just before the timed loop and report() just after it.
class RowMeter {
 public:
  RowMeter() {
    release_cached_memory();
    malloc_trim(0);
    m_baseline = proc_status_bytes("VmRSS");
    m_peak_known = m_baseline >= 0 && reset_peak_rss();
  }
  void start_loop() {
    m_heap = xgrad_heap_allocations();
    m_serial = Storage::next_serial();
  }
  void report(benchmark::State& state) const {
    const auto per_call = [](double n) { return benchmark::Counter(n, benchmark::Counter::kAvgIterations); };
    state.counters["allocs/call"] = per_call(static_cast<double>(xgrad_heap_allocations() - m_heap));
    // next_serial() counts its own calls: the one in start_loop() took a number.
    state.counters["buffers/call"] = per_call(static_cast<double>(Storage::next_serial() - m_serial - 1));
    if (m_peak_known) state.counters["peak_MiB"] = (proc_status_bytes("VmHWM") - m_baseline) / (1024.0 * 1024.0);
  }

 private:
  double m_baseline = -1;
  bool m_peak_known = false;
  std::uint64_t m_heap = 0, m_serial = 0;
};

/// One call of a workload, timed in the loop; made by a row's `prepare` after its inputs.
using Call = std::function<void()>;

/// Registers "<suite>/<workload>/<impl>" on `threads` threads: xgrad's pool and OpenBLAS's (which
/// LibTorch calls too) are set to that many; LibTorch's rows set its own count. prepare() makes the inputs and returns
/// the call; it is called once before the loop (the warm-up, and a jit's one trace). Rows on more than one thread are
/// timed by wall clock (as all are by run_suite.py).
inline void register_row(const std::string& suite, const std::string& workload, const std::string& impl, int threads,
                         std::function<Call()> prepare, bool on_bench_device = false) {
  const std::string name = suite + "/" + workload + "/" + impl;
  benchmark::RegisterBenchmark(name.c_str(),
                               [threads, prepare, on_bench_device](benchmark::State& state) {
                                 RowMeter meter;
                                 std::optional<OnBenchDevice> device;
                                 if (on_bench_device) device.emplace();
                                 ThreadScope thread_scope(threads);
                                 openblas_set_num_threads(threads);
                                 try {
                                   Call call = prepare();
                                   call();
                                   meter.start_loop();
                                   for (auto _ : state) call();
                                   meter.report(state);
                                 } catch (const std::exception& error) {  // a missing data set, a retrace
                                   state.SkipWithError(error.what());
                                 }
                               })
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
}

// ---- shapes the xgrad and LibTorch rows share -----------------------------------------------------

// conv2d at the LeNet5 shapes: batch 32, valid padding, stride 1, no bias.

struct ConvCase {
  const char* name;
  std::int64_t batch, in_channels, height, width, out_channels, kernel;
  bool input_grad;  // conv2's input is an activation, so its gradient also gives dx
};
inline constexpr ConvCase kConv1{"conv1", 32, 1, 32, 32, 6, 5, false};
inline constexpr ConvCase kConv2{"conv2", 32, 6, 14, 14, 16, 5, true};

inline constexpr std::int64_t kLeNetBatch = 32;

/// The LeNet5 rows' batch, the same for every side: the first 32 images of Fashion-MNIST's train
/// set (Debian's dataset-fashion-mnist, or $XGRAD_FASHION_MNIST) with the seed notebook's
/// preprocessing (bilinear resize to 32x32, x / 255, normalized by 0.1307 and 0.3081),
/// [32, 1, 32, 32] flat, and their labels. Read once (suite_xgrad.cpp); throws when the data
/// set is missing.
struct LeNetBatch {
  std::vector<float> images;
  std::vector<std::int32_t> labels;
};
const LeNetBatch& lenet_batch();

}  // namespace xgrad::bench
