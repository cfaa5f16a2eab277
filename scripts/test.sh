#!/usr/bin/env bash
# Checks the headers' layering; builds and runs the test suite once optimized (then the benchmark
# suite's driver tests and every suite row once), and the find_package consumers; builds the
# fuzz targets and the tests under AddressSanitizer + UBSan, fuzzes, runs the tests there; then
# compiles and links the CUDA build (the library and the examples) with nvcc: no
# GPU to run it.
# The three configurations are the presets of CMakePresets.json ("test", "sanitize",
# "cuda-check"). Each step prints the minutes it started at.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure_packages.sh g++ clang libclang-rt-14-dev cmake ninja-build ccache xtensor-dev libxsimd-dev doctest-dev \
  zlib1g-dev dataset-fashion-mnist fortunes libbenchmark-dev libopenblas-dev libopenmpi-dev openmpi-bin python3
jobs="$(nproc)"
step() { printf '== test.sh %d:%02d %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

# Headers include downwards only (docs/CONTRIBUTING.md, "Layers"); then the checker's own tests.
step "layers"
python3 scripts/check_layers.py
python3 -m unittest discover -s scripts -p 'test_*.py'

# Device::thrust runs through Thrust's OpenMP system here and its serial one under the
# sanitizers (Thrust from the CUDA toolkit at /usr/local/cuda; no GPU needed).
step "optimized build (preset test)"
scripts/configure_preset.sh test
cmake --build build-test -j"$jobs"
step "optimized tests"
(cd build-test && ctest --output-on-failure)
build-test/examples/worked_examples > /dev/null
(cd build-test && examples/mode_switch > /dev/null)

# The benchmark suite's driver and report (made-up results), then every row of the suite once,
# quickly, through the driver (xgrad's rows on both devices): a row that fails fails the run, and
# so does a jit level taking over twice a lower level's time there and again when the row's suite
# is measured longer (the quick run alone put dispatch rows of nanoseconds at 2-3x once in a noisy
# hour). No other timing is checked.
step "benchmark suite, every row once"
python3 -m unittest discover -s benchmarks -p 'test_*.py'
python3 benchmarks/run_suite.py --bench build-test/benchmarks/xgrad_bench --quick --rounds 1 --min-time 0.001 \
  --devices cpu --out build-test/suite --docs build-test/suite/report --fail-on-level-regression 2
python3 benchmarks/run_suite.py --bench build-test/benchmarks/xgrad_bench --quick --rounds 1 --min-time 0.001 \
  --devices thrust --suites dispatch,cache_hit,conv,mlp_step --out build-test/suite-thrust

# find_package(xgrad) against an installed copy: a Release program header-only and compiled,
# and a user's Debug build on a machine with AVX-512 (the flags stand in for -march=native
# there): the target adds -Og, without which GCC rejects xsimd's AVX-512 code. Each of the two
# header-only builds is one large file, which would leave a core idle for a minute: they compile
# beside the sanitizer build below, and run after it.
step "find_package consumers (building beside the sanitizer build)"
rm -rf build-test/prefix build-test/consumer build-test/consumer-debug
cmake --install build-test --prefix build-test/prefix > /dev/null
consumer_build() {  # consumer_build DIR TARGET CMAKE-ARGS...: configures DIR, builds TARGET; log in DIR.log
  local dir=$1 target=$2
  shift 2
  { cmake -S tests/install_consumer -B "$dir" -G Ninja -DCMAKE_PREFIX_PATH="$PWD/build-test/prefix" "$@" &&
    cmake --build "$dir" -j1 --target "$target"; } > "$dir.log" 2>&1 || { cat "$dir.log"; return 1; }
}
consumer_build build-test/consumer all -DCMAKE_BUILD_TYPE=Release &
release_consumer=$!
consumer_build build-test/consumer-debug consumer -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS="-mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx512cd" &
debug_consumer=$!

# The sanitizer build (preset sanitize, Debian's clang with ASan + UBSan): the instrumented
# library, the tests and the libFuzzer targets, in one build so that both cores stay busy.
# The consumers' builds share the cores with it.
step "sanitizer build (preset sanitize)"
scripts/configure_preset.sh sanitize
cmake --build build-sanitize -j"$jobs"

step "find_package consumers"
wait "$release_consumer"
wait "$debug_consumer"
header_only=$(build-test/consumer/consumer)
compiled=$(build-test/consumer/consumer_compiled)
[ "$header_only" = "$compiled" ] || { echo "consumers differ: header-only $header_only, compiled $compiled"; exit 1; }
echo "find_package(xgrad) consumers, header-only and compiled: ok, the same bits ($compiled)"
if grep -q avx512bw /proc/cpuinfo; then
  build-test/consumer-debug/consumer && echo "Debug consumer with AVX-512: compiled and ran"
else
  echo "Debug consumer with AVX-512: compiled (this CPU has no AVX-512 to run it)"
fi

# The libFuzzer targets (IDX reader, gzip, checkpoint reader, op calls), each for 30 s from its
# committed seed corpus with a fixed seed, so that a failure here repeats input for input
# (docs/FUZZING.md); fuzz.sh finds them built.
step "fuzzing"
XGRAD_FUZZ_SEED=1 scripts/fuzz.sh 30

# The tests under the sanitizers, asserts on, Device::thrust serially. They run on one core
# while the CUDA build below takes the others; their log is printed when both are done.
step "sanitizer tests"
(cd build-sanitize && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure) \
  > build-sanitize/ctest.log 2>&1 &
sanitizer_tests=$!

# The CUDA build, compiled and linked with the CUDA toolkit's nvcc, cuBLAS, Thrust and NCCL: the
# library (nvcc compiles its sources that hold Thrust kernels) and the examples, programs a user
# builds, linked against it. The tests and the benchmarks are left to the optimized build above;
# their few sources that nvcc would compile are compiled on a GPU machine with the rest
# (docs/CI.md), which took 150 s of this step's compiling.
step "CUDA build (preset cuda-check)"
scripts/configure_preset.sh cuda-check > /dev/null
cmake --build build-cuda -j"$jobs" --target worked_examples mode_switch lenet5_fashion_mnist char_transformer
nccl=$(grep -q XGRAD_WITH_NCCL build-cuda/build.ninja && echo "with NCCL" || echo "without NCCL (not found)")
echo "CUDA build (nvcc, compute_80, MPI $nccl): the library and the examples compiled and linked"

step "waiting for the sanitizer tests"
status=0
wait "$sanitizer_tests" || status=$?
cat build-sanitize/ctest.log
((status == 0)) || { echo "sanitizer tests failed"; exit "$status"; }
step "done"
