#!/usr/bin/env bash
# Installs the build into a scratch prefix, then builds and runs examples/consumer against it
# with find_package(spillarena) — what an outside project does.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
python=${SPILLARENA_PYTHON:-}
if [[ -z "$python" ]]; then
  if [[ -x "$root/.venv/bin/python" ]]; then python="$root/.venv/bin/python"; else python=python3; fi
fi
torch_prefix=$("$python" -c "import torch.utils; print(torch.utils.cmake_prefix_path)" 2>/dev/null)
cmake -S "$root/examples/consumer" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix;$torch_prefix" >/dev/null 2>&1 \
  || cmake -S "$root/examples/consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix;$torch_prefix"
cmake --build "$work/build" >/dev/null
"$work/build/consumer"
