#!/usr/bin/env bash
# The benchmark suite: builds xgrad_bench (Release; with the LibTorch rows when libtorch-dev is
# installed), runs every suite beside the peers that are installed, then the compile-time
# benchmark (benchmarks/compile_time.py), and writes the results.
#
#   bash scripts/bench.sh            # the full suite; regenerates docs/BENCHMARKS.md, docs/COMPILE_TIME.md
#                                    # and docs/bench/*.svg
#   bash scripts/bench.sh --quick    # a first look in under 2 minutes: 3 short rounds, no Python
#                                    # peers; the report goes to build-bench/suite/report/
#   bash scripts/bench.sh --peers    # first installs the peers: Debian's libtorch-dev, and PyTorch,
#                                    # JAX and MindSpore from PyPI into build-bench/peers-venv
#
# Other arguments go to benchmarks/run_suite.py (--suites, --rounds, --min-time, --devices, ...).
# Peers that are not installed are shown as such in the report.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
install_peers=0
args=()
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1; args+=("$arg") ;;
    --peers) install_peers=1 ;;
    *) args+=("$arg") ;;
  esac
done

scripts/ensure_packages.sh g++ cmake make ccache xtensor-dev libxsimd-dev zlib1g-dev libbenchmark-dev doctest-dev \
  libopenblas-dev python3 python3-venv dataset-fashion-mnist
if ((install_peers)); then
  scripts/ensure_packages.sh libtorch-dev
  bash benchmarks/peers/setup_venv.sh build-bench/peers-venv || echo "bench.sh: a peer failed to install; see above"
fi

# Device::thrust is measured too when the CUDA toolkit's Thrust headers are here (on the host's
# OpenMP system: no GPU is assumed).
thrust=OFF
[ -f /usr/local/cuda/include/cccl/thrust/version.h ] && thrust=OMP
cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DXGRAD_BUILD_BENCHMARKS=ON -DXGRAD_BUILD_TESTS=OFF \
  -DXGRAD_BUILD_EXAMPLES=OFF -DXGRAD_THRUST_SYSTEM="$thrust" > /dev/null
cmake --build build-bench -j"$(nproc)" --target xgrad_bench

if ((quick)); then
  docs=build-bench/suite/report
else
  docs=docs
fi
python3 benchmarks/run_suite.py --bench build-bench/benchmarks/xgrad_bench --out build-bench/suite --docs "$docs" \
  "${args[@]}"

# The compile-time benchmark, in a user's default configuration (no Thrust backend) at -O2 (CMake's
# Release is -O3, which takes about 2.5x longer on xgrad's headers): only configured, since
# compile_time.py runs each compile command itself.
cmake -S . -B build-compile-time -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
  -DXGRAD_BUILD_BENCHMARKS=ON -DXGRAD_BUILD_TESTS=OFF -DXGRAD_BUILD_EXAMPLES=OFF > /dev/null
if ((quick)); then
  python3 benchmarks/compile_time.py --build build-compile-time --rounds 1 --programs hello,torch_hello \
    --out build-bench/suite --docs "$docs"
else
  python3 benchmarks/compile_time.py --build build-compile-time --rounds 3 --out build-bench/suite --docs "$docs"
fi
echo "bench.sh: results in build-bench/suite/{results,compile_time}.json, report in $docs/{BENCHMARKS,COMPILE_TIME}.md"
