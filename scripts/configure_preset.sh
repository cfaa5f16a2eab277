#!/usr/bin/env bash
# Configures a preset of CMakePresets.json: scripts/configure_preset.sh NAME [CMAKE ARGS...].
# A build folder left by another generator (before the presets, builds used Makefiles) is
# removed first: CMake refuses to switch generators in place.
set -euo pipefail
cd "$(dirname "$0")/.."
name="$1"
shift
read -r dir generator < <(python3 -c 'import json, sys
for p in json.load(open("CMakePresets.json"))["configurePresets"]:
    if p["name"] == sys.argv[1]:
        print(p["binaryDir"].replace("${sourceDir}/", ""), p["generator"])' "$name") || true
[ -n "${dir:-}" ] || { echo "configure_preset.sh: no preset '$name' in CMakePresets.json" >&2; exit 2; }
if [ -f "$dir/CMakeCache.txt" ] && ! grep -qx "CMAKE_GENERATOR:INTERNAL=$generator" "$dir/CMakeCache.txt"; then
  echo "configure_preset.sh: $dir was made by another generator than $generator: removing it"
  rm -rf "$dir"
fi
cmake --preset "$name" "$@"
