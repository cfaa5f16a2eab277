#!/usr/bin/env bash
# Checks the headers' layering; builds and runs the test suite once optimized (then the benchmark
# suite's driver tests and every suite row once), once under AddressSanitizer + UBSan; runs the
# fuzz targets; then compiles and links the CUDA build (tests, examples, benchmarks) with nvcc: no GPU to run it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure_packages.sh g++ cmake make ccache xtensor-dev libxsimd-dev doctest-dev zlib1g-dev dataset-fashion-mnist \
  libbenchmark-dev libopenblas-dev python3
jobs="$(nproc)"

# Headers include downwards only (docs/CONTRIBUTING.md, "Layers"); then the checker's own tests.
python3 scripts/check_layers.py
python3 -m unittest discover -s scripts -p 'test_*.py'

# Device::thrust runs through Thrust's OpenMP system here and its serial one under the
# sanitizers (Thrust from the CUDA toolkit at /usr/local/cuda; no GPU needed).
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=Release -DXGRAD_BUILD_TESTS=ON -DXGRAD_BUILD_EXAMPLES=ON \
  -DXGRAD_BUILD_BENCHMARKS=ON -DXGRAD_BENCH_TORCH=OFF -DXGRAD_THRUST_SYSTEM=OMP
cmake --build build-test -j"$jobs"
(cd build-test && ctest --output-on-failure)
build-test/examples/worked_examples > /dev/null
(cd build-test && examples/mode_switch > /dev/null)

# The benchmark suite's driver and report (made-up results), then every row of the suite once,
# quickly, through the driver (xgrad's rows on both devices): a row that fails fails the run. No
# timing is checked.
python3 -m unittest discover -s benchmarks -p 'test_*.py'
python3 benchmarks/run_suite.py --bench build-test/benchmarks/xgrad_bench --quick --rounds 1 --min-time 0.001 \
  --devices cpu --out build-test/suite --docs build-test/suite/report
python3 benchmarks/run_suite.py --bench build-test/benchmarks/xgrad_bench --quick --rounds 1 --min-time 0.001 \
  --devices thrust --suites dispatch,cache_hit,conv,mlp_step --out build-test/suite-thrust

# find_package(xgrad) against an installed copy.
rm -rf build-test/prefix build-test/consumer
cmake --install build-test --prefix build-test/prefix > /dev/null
cmake -S tests/install_consumer -B build-test/consumer -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$PWD/build-test/prefix" > /dev/null
cmake --build build-test/consumer
header_only=$(build-test/consumer/consumer)
compiled=$(build-test/consumer/consumer_compiled)
[ "$header_only" = "$compiled" ] || { echo "consumers differ: header-only $header_only, compiled $compiled"; exit 1; }
echo "find_package(xgrad) consumers, header-only and compiled: ok, the same bits ($compiled)"
# A user's Debug build on a machine with AVX-512 (the flags stand in for -march=native there):
# the target adds -Og, without which GCC rejects xsimd's AVX-512 code. It runs where the CPU can.
cmake -S tests/install_consumer -B build-test/consumer-debug -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS="-mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx512cd" \
  -DCMAKE_PREFIX_PATH="$PWD/build-test/prefix" > /dev/null
cmake --build build-test/consumer-debug --target consumer
if grep -q avx512bw /proc/cpuinfo; then
  build-test/consumer-debug/consumer && echo "Debug consumer with AVX-512: compiled and ran"
else
  echo "Debug consumer with AVX-512: compiled (this CPU has no AVX-512 to run it)"
fi

# -O1: xsimd's AVX-512 code does not compile at -O0, and -O2 with ASan compiles for ages.
# -g1: line tables for the sanitizer reports, at a quarter less compile time than -g. Asserts on
# (no NDEBUG).
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DXGRAD_SANITIZE=ON \
  -DXGRAD_BUILD_TESTS=ON -DXGRAD_BUILD_EXAMPLES=OFF -DXGRAD_THRUST_SYSTEM=CPP
cmake --build build-sanitize -j"$jobs"
(cd build-sanitize && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure)

# The libFuzzer targets (IDX reader, gzip, checkpoint reader, op calls) under ASan + UBSan with
# Debian's clang, each for 30 s from its committed seed corpus with a fixed seed, so that a
# failure here repeats input for input (docs/FUZZING.md).
XGRAD_FUZZ_SEED=1 scripts/fuzz.sh 30

# The CUDA build, compiled and linked with the CUDA toolkit's nvcc, cuBLAS and Thrust. Host code
# unoptimized (-O0 needs XGRAD_NATIVE off: xsimd's AVX-512 code does not compile at -O0) and
# device code at ptxas -O1: this build checks that everything compiles. One architecture
# (sm_80; users' builds default to sm_80 and sm_90): each more adds a third to its time.
cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG= -DCMAKE_CUDA_FLAGS_DEBUG= \
  -DCMAKE_CUDA_FLAGS=--ptxas-options=-O1 -DCMAKE_CUDA_ARCHITECTURES=80 -DXGRAD_NATIVE=OFF -DXGRAD_THRUST_SYSTEM=CUDA \
  -DXGRAD_BUILD_TESTS=ON -DXGRAD_BUILD_EXAMPLES=ON -DXGRAD_BUILD_BENCHMARKS=ON
cmake --build build-cuda -j"$jobs"
echo "CUDA build (nvcc, sm_80): compiled and linked"
