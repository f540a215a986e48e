#!/usr/bin/env bash
# Run THERE, on the GPU machine: builds against that machine's CUDA LibTorch with the carried
# Debian packages unpacked into .deps/root (never into /), runs every test (the CUDA test case
# runs only there) and a short benchmark pass. Output and logs go to $OUT when set.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/spillarena-device}
mkdir -p "$out" .deps/root
for deb in .deps/debs/*.deb; do dpkg -x "$deb" .deps/root; done
root=$PWD/.deps/root/usr
torch_prefix=$(python3 -c "import torch.utils; print(torch.utils.cmake_prefix_path)")
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee "$out/env.txt"
nvidia-smi -L | tee -a "$out/env.txt" || true
export SPILLARENA_PYTHON=python3
export LD_LIBRARY_PATH="$root/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$torch_prefix;$root;$root/lib/x86_64-linux-gnu/cmake;$root/share/cmake" \
  -DBoost_DIR="$root/lib/x86_64-linux-gnu/cmake/Boost-1.74.0" \
  -DCMAKE_CXX_FLAGS="-isystem $root/include" 2>&1 | tee "$out/configure.log"
cmake --build build-device --parallel "$(nproc)" 2>&1 | tail -n 40 | tee "$out/build.log"
(cd build-device && ctest --output-on-failure --timeout 600 2>&1 | tee "$out/ctest.log")
build-device/tests/checkpoint_test -s -tc="*GPU*" 2>&1 | tail -n 20 | tee "$out/gpu_checkpoint.log"
build-device/bench/spillarena_bench --benchmark_filter='RoundTrip|disk_vs' \
  --benchmark_min_time=0.5 --benchmark_out_format=json --benchmark_out="$out/bench.json" \
  2>&1 | tail -n 40 | tee "$out/bench.log"
