#!/usr/bin/env bash
# The main job: install what is missing, build the examples, run them: the seeds' worked
# examples and a small classifier (eager), then the seeds' mode-switch examples (eager and
# graph mode, a compiled train step, the BiasAdd failure report).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure_packages.sh g++ cmake make xtensor-dev libxsimd-dev
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DXGRAD_BUILD_TESTS=OFF -DXGRAD_BUILD_EXAMPLES=ON
cmake --build build -j"$(nproc)" --target worked_examples mode_switch
build/examples/worked_examples
echo
(cd build && examples/mode_switch)
