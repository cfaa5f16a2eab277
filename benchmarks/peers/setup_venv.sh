#!/usr/bin/env bash
# Installs the Python peers of the benchmark suite from PyPI, each into its own virtual
# environment (their dependencies disagree: MindSpore's wheels are built against NumPy 1, JAX
# wants NumPy 2). Only the benchmark suite uses them; xgrad's build and tests never do.
#
#   bash benchmarks/peers/setup_venv.sh [DIR]     # default: build-bench/peers-venv
#
# makes DIR/pytorch, DIR/jax and DIR/mindspore. A peer that PyPI does not offer for this Python or
# machine is reported and the others are still installed; the suite then marks it "not installed".
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="${1:-$here/../../build-bench/peers-venv}"

if ! command -v python3 >/dev/null || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update && apt-get install -y python3 python3-venv
  else
    echo "setup_venv.sh: needs python3 with the venv module (Debian: python3-venv)" >&2
    exit 1
  fi
fi

status=0
# peer name, then what pip installs for it
while read -r peer packages; do
  venv="$root/$peer"
  echo "== $peer: $packages into $venv"
  if ! python3 -m venv "$venv" || ! "$venv/bin/python" -m pip install --quiet --upgrade pip ||
    ! "$venv/bin/python" -m pip install --quiet $packages; then
    echo "setup_venv.sh: $peer could not be installed from PyPI; the suite will show it as not installed" >&2
    status=1
    continue
  fi
  "$venv/bin/python" -c "import importlib, sys; m = importlib.import_module(sys.argv[1]); print(sys.argv[1], m.__version__)" \
    "${packages%% *}" 2>&1 | grep -v WARNING | tail -1
done <<'PEERS'
pytorch torch numpy
jax jax
mindspore mindspore numpy<2
PEERS
exit $status
