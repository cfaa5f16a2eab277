// xgrad_bench's main: Google Benchmark's, plus `--device=cpu|thrust`, the device the xgrad rows
// run on (bench_support.hpp: bench_device), recorded in the JSON context, and `--has-mpi`,
// which prints whether the build has MPI. Under mpirun (the data_parallel rows) only rank 0
// reports: the others' console output and --benchmark_out go to /dev/null.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include <xgrad/distributed/process_group.hpp>

#include "bench_support.hpp"

int main(int argc, char** argv) {
  namespace xg = xgrad;
  const char* launched_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (!launched_rank) launched_rank = std::getenv("PMI_RANK");
  const bool reports = !launched_rank || std::atoi(launched_rank) == 0;
  static char discard[] = "--benchmark_out=/dev/null";
  if (!reports && !std::freopen("/dev/null", "w", stdout)) return 2;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (!reports && arg.rfind("--benchmark_out=", 0) == 0) {
      argv[kept++] = discard;
      continue;
    }
    if (arg == "--has-mpi") {  // for run_suite.py: whether the data_parallel rows can run under mpirun
      std::puts(xg::distributed::built_with_mpi() ? "yes" : "no");
      return 0;
    }
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
