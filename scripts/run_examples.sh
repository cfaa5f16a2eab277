#!/usr/bin/env bash
# The main job: install what is missing, build the examples, run them: the seeds' worked
# examples and a small classifier (eager), the seeds' mode-switch examples (eager and graph
# mode, a compiled train step, the BiasAdd failure report), then the seed notebook's run:
# LeNet5 on Fashion-MNIST, 3 epochs eagerly and 3 in graph mode (outputs in build/lenet5/). It
# also builds examples/char_transformer (a language model on Debian's fortunes), run apart.
# The build has MPI, so that the same program also trains data-parallel under mpirun
# (README, "Two commands").
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure_packages.sh g++ cmake make xtensor-dev libxsimd-dev zlib1g-dev dataset-fashion-mnist fortunes \
  libopenmpi-dev openmpi-bin
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DXGRAD_BUILD_TESTS=OFF -DXGRAD_BUILD_EXAMPLES=ON -DXGRAD_MPI=ON
cmake --build build -j"$(nproc)" --target worked_examples mode_switch lenet5_fashion_mnist char_transformer
build/examples/worked_examples
echo
(cd build && examples/mode_switch)
echo
build/examples/lenet5_fashion_mnist --out build/lenet5 "$@"
