#!/usr/bin/env bash
# The main job: install what is missing, build the examples, run the worked examples.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure_packages.sh g++ cmake make xtensor-dev libxsimd-dev
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DXGRAD_BUILD_TESTS=OFF -DXGRAD_BUILD_EXAMPLES=ON
cmake --build build -j"$(nproc)" --target worked_examples
build/examples/worked_examples
