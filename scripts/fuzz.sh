#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with Debian's clang under AddressSanitizer and
# UndefinedBehaviorSanitizer, then runs each for a bounded time, starting from its committed seed
# corpus (tests/fuzz/corpus/<target>/, read only: new inputs go to a scratch corpus in build-sanitize).
# Any crash, sanitizer report, escaped non-xgrad exception, hang (-timeout) or memory blow-up
# fails the run; the input that did it is left in build-sanitize/fuzz-runs/<target>/artifacts/.
# docs/FUZZING.md has the details.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# SECONDS per target (default $XGRAD_FUZZ_SECONDS, else 60); TARGETs among fuzz_idx fuzz_gzip
# fuzz_checkpoint fuzz_ops (default all). XGRAD_FUZZ_JOBS: build parallelism (default nproc);
# XGRAD_FUZZ_PARALLEL: how many targets fuzz at once (default nproc).
# XGRAD_FUZZ_SEED: libFuzzer's -seed (default 0, a random one; the log names it), so that a run,
# CI's included, can be repeated input for input.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
scripts/ensure_packages.sh clang libclang-rt-14-dev cmake ninja-build ccache xtensor-dev libxsimd-dev doctest-dev zlib1g-dev

seconds="${1:-${XGRAD_FUZZ_SECONDS:-60}}"
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "fuzz.sh: SECONDS must be a whole number, got '$seconds'" >&2; exit 2; }
seed="${XGRAD_FUZZ_SEED:-0}"
[[ "$seed" =~ ^[0-9]+$ ]] || { echo "fuzz.sh: XGRAD_FUZZ_SEED must be a whole number, got '$seed'" >&2; exit 2; }
shift || true
all=(fuzz_idx fuzz_gzip fuzz_checkpoint fuzz_ops)
targets=("${@:-${all[@]}}")
for t in "${targets[@]}"; do
  [[ " ${all[*]} " == *" $t "* ]] || { echo "fuzz.sh: unknown target '$t' (known: ${all[*]})" >&2; exit 2; }
done

# The "sanitize" preset (CMakePresets.json), which scripts/test.sh's sanitizer run shares: the
# library at -O1, fast enough to fuzz, with line tables for the reports. Only the fuzz targets
# are built here.
build_start=$SECONDS
scripts/configure_preset.sh sanitize > /dev/null
cmake --build build-sanitize -j"${XGRAD_FUZZ_JOBS:-$(nproc)}" --target "${targets[@]}"
echo "fuzz.sh: built ${targets[*]} in $((SECONDS - build_start)) s"

# An allocation above the target's cap fails (malloc returns null) instead of aborting, so the
# library's refusal of it (an AllocationError, a ValueError) is what is tested; operator new
# cannot return null, so an unchecked huge std::vector or new[] still aborts: a finding.
# libFuzzer's own -malloc_limit_mb is left above that, at its -rss_limit_mb. fuzz_ops' cap is
# 64 MiB (libFuzzer itself takes 20 MiB at once): its inputs hold at most 4096 elements, and a legitimately large result (a broadcast_to
# or a padded conv asked for by the bytes) would otherwise take longer than -timeout to compute
# under the sanitizers: slow, not wrong.
alloc_cap_mb() { [[ "$1" == fuzz_ops ]] && echo 64 || echo 512; }
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export XGRAD_NUM_THREADS=1  # the same input runs the same way, whatever the machine
# Each target runs on one thread, so up to XGRAD_FUZZ_PARALLEL of them (default nproc) run at once.
fuzz_target() {  # fuzz_target TARGET: its exit status and seconds go to its run folder's "status"
  local t=$1 run="build-sanitize/fuzz-runs/$1" start=$SECONDS rc=0
  (cd "$run" && ASAN_OPTIONS="allocator_may_return_null=1:max_allocation_size_mb=$(alloc_cap_mb "$t"):detect_leaks=1:abort_on_error=0" \
      "$root/build-sanitize/tests/fuzz/$t" -seed="$seed" -max_total_time="$seconds" -timeout=15 -rss_limit_mb=2560 \
      -malloc_limit_mb=2560 -artifact_prefix=artifacts/ -print_final_stats=1 corpus "$root/tests/fuzz/corpus/$t" \
      > log.txt 2>&1) || rc=$?
  echo "$rc $((SECONDS - start))" > "$run/status"
}
parallel="${XGRAD_FUZZ_PARALLEL:-$(nproc)}"
for t in "${targets[@]}"; do
  run="build-sanitize/fuzz-runs/$t"
  rm -rf "$run"
  mkdir -p "$run/corpus" "$run/artifacts"
  while (($(jobs -rp | wc -l) >= parallel)); do wait -n || true; done
  echo "fuzz.sh: $t for ${seconds} s from tests/fuzz/corpus/$t ($(ls "tests/fuzz/corpus/$t" | wc -l) seeds), seed $([[ $seed == 0 ]] && echo random || echo "$seed")"
  fuzz_target "$t" &
done
wait
failed=()
for t in "${targets[@]}"; do
  run="build-sanitize/fuzz-runs/$t"
  read -r rc took < "$run/status"
  if ((rc == 0)); then
    echo "fuzz.sh: $t: ok, $(grep -o 'stat::number_of_executed_units: *[0-9]*' "$run/log.txt" | grep -o '[0-9]*$') runs in $took s"
  else
    failed+=("$t")
    echo "fuzz.sh: $t: FAILED after $took s; the input: $(ls "$run"/artifacts/* 2>/dev/null | head -1)"
    grep -E -A25 "=== xgrad fuzz finding|ERROR: (AddressSanitizer|libFuzzer|LeakSanitizer)|runtime error:" "$run/log.txt" | head -60 || tail -40 "$run/log.txt"
  fi
done
if ((${#failed[@]})); then
  echo "fuzz.sh: findings in ${failed[*]} (logs: build-sanitize/fuzz-runs/<target>/log.txt)" >&2
  exit 1
fi
echo "fuzz.sh: no findings in ${targets[*]}"
