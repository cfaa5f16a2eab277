// xgrad_bench's main: Google Benchmark's, plus `--device=cpu|thrust`, the device the xgrad rows
// run on (bench_support.hpp: bench_device). The chosen device is recorded in the JSON context.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <string_view>

#include "bench_support.hpp"

int main(int argc, char** argv) {
  namespace xg = xgrad;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.rfind("--device=", 0) != 0) {
      argv[kept++] = argv[i];
      continue;
    }
    const std::string_view name = arg.substr(9);
    if (name == "cpu") {
      xg::bench::bench_device() = xg::Device::cpu;
    } else if (name == "thrust") {
      if (!xg::thrust_available()) {
        std::fprintf(stderr,
                     "xgrad_bench: --device=thrust: this build has no Thrust backend; configure with "
                     "-DXGRAD_THRUST_SYSTEM=OMP (or CPP, CUDA)\n");
        return 2;
      }
      xg::bench::bench_device() = xg::Device::thrust;
    } else {
      std::fprintf(stderr, "xgrad_bench: --device: expected cpu or thrust, got '%.*s'\n", static_cast<int>(name.size()),
                   name.data());
      return 2;
    }
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("xgrad_device", std::string(xg::device_name(xg::bench::bench_device())));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
