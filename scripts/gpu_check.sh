#!/usr/bin/env bash
# The checks of the CUDA build on a machine with an NVIDIA GPU, in one run, each step under its
# own time limit: the test suite, the examples, compute-sanitizer's memcheck on the tests that
# use the device, and the benchmark rows of docs/BENCHMARK_HISTORY.md's "Devices" table on both
# devices, with PyTorch's on the GPU when the machine has it. BUILD is a CUDA build (XGRAD_THRUST_SYSTEM=CUDA) with tests, examples and benchmarks;
# LIBS, if given, holds shared libraries the machine lacks (Google Benchmark, OpenBLAS). Logs go
# to OUT (eight files); the last lines printed are a summary. docs/BENCHMARK_HISTORY.md ("GPU")
# says how the build was made and what a run gave.
#   scripts/gpu_check.sh BUILD [OUT] [LIBS]
set -u
build=${1:?usage: scripts/gpu_check.sh BUILD [OUT] [LIBS]}
out=${2:-gpu-check}
libs=${3:-}
mkdir -p "$out"

# cuBLAS comes from the machine's CUDA toolkit (a pip wheel's copy if that is all there is).
cublas=$(find /usr/local/cuda*/ /usr/lib /opt -name 'libcublas.so.13*' 2>/dev/null | head -1)
echo "cuBLAS: ${cublas:-not found}"
export LD_LIBRARY_PATH=${libs:+$libs:}${cublas:+$(dirname "$cublas"):}${LD_LIBRARY_PATH:-}

summary=()
step() {  # step NAME SECONDS COMMAND...: runs COMMAND into OUT/NAME.log and notes its status
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-12s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - start))" "$(tail -1 "$out/$name.log" | cut -c1-90)")")
  echo "${summary[-1]}"  # as it goes, in case the run is cut short
}

machine=$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader;
  lscpu | grep -E 'Model name|^CPU\(s\)' | tr -s ' ')

step tests 180 "$build/tests/xgrad_tests"
step white-box 60 "$build/tests/xgrad_white_box_tests"
step examples 40 bash -c "'$build/examples/worked_examples' && '$build/examples/mode_switch'"
# The suite's xgrad rows of each kind, eager and at O2 (the reference rows run on the cpu).
rows='^(lenet5_step/b32_t1|mlp_step/[^/]*|conv/conv[12]_(fwd|grad)|elementwise/(add_1e6|chain7_1e7)|gemm/matmul_(256|1024)|reductions/(softmax_256x1000|sum_1e7)|dispatch/add_1|attention/seq(128|512|2048)_(fwd|grad)|seq_step/char_transformer_b32)/(eager|jit_O2)'
for device in thrust cpu; do
  step "bench-$device" 150 "$build/benchmarks/xgrad_bench" --device=$device --benchmark_filter="$rows" \
    --benchmark_min_time=0.2 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
done
# PyTorch on the same GPU, where the machine has it (benchmarks/peers/pytorch_cuda_rows.py).
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  step pytorch 120 python3 "$(dirname "$0")/../benchmarks/peers/pytorch_cuda_rows.py"
fi
# memcheck multiplies each kernel's time: the device's op-table, fusion and control-flow cases
# (the training cases repeat the same kernels for hundreds of steps).
step memcheck 140 compute-sanitizer --tool memcheck --error-exitcode 1 "$build/tests/xgrad_tests" \
  --test-case='thrust:*' --test-case-exclude='*trains*,*MLP trained*'

printf '%s\n' "$machine" "${summary[@]}" | tee "$out/summary.txt"
