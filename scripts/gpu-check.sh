#!/usr/bin/env bash
# The accelerator check. Run THERE, on a GPU machine with CUDA PyTorch, cmake and ninja but no
# package registry, after scripts/gpu-fetch-debs.sh here:
#   1. builds against that machine's LibTorch, the carried Debian packages unpacked into
#      .deps/root (never into /);
#   2. runs the CUDA tests (tests/accelerator_test.cc: bitwise gradients in fp32 and bf16 with
#      dropout, autocast replay, random queue delays) and the CPU tests of the engine beside them;
#   3. runs BM_AcceleratorStep (bench/accelerator_benchmark.cc) in every mode, disk_gds too
#      (skipped with the library's message where libcufile does not load), at 16 layers and
#      again at 8 (host memory added must not grow with the layer count: the host pool bounds it);
#   4. runs the Python head-to-head (bench/python/gpu_head_to_head.py) at Llama-3-8B width, seq 8k and 32k,
#      transformers from the carried wheels (.deps/wheels) on PYTHONPATH, both runs into head_to_head.json;
#   5. runs the longest-sequence search (bench/python/longest_sequence.py): the largest sequence
#      that trains in an emulated 24 GB card per mode (recompute, spillarena direct and gds; gds
#      skipped before any trial, with GdsUnavailableError's message, where libcufile does not
#      load) at Llama-3-8B width, 16 layers, and whether spilling reaches 1.5x recompute's, into
#      longest_sequence.json.
# Everything it reports goes to $OUT (at most 8 files): env.txt, build.log (the Python package's
# build too), tests.log, accelerator.json, accelerator-8.json, head_to_head.json,
# longest_sequence.json, bench.log (8).
# Budget: about 12 minutes on 16 cores for steps 1-3 and the 8k head-to-head (the last session's
# H200 run, with an older step 4), at most 9 for step 4 (8k and 32k, 270 s each, each JSON
# rewritten after every mode) and 8 for step 5. One device command may run 10 minutes: run it as
# three commands, SPILLARENA_GPU_STEPS="1 2 3", then "4", then "5" (the build and the extension's
# build tree are kept between calls). A session lent 15 minutes of device time in all fits steps
# 1-3 and part of 4; give the rest to the next session that is lent a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/spillarena-gpu-check}
build=${SPILLARENA_GPU_BUILD:-build-gpu}
python=${SPILLARENA_PYTHON:-python3}
steps=" ${SPILLARENA_GPU_STEPS:-1 2 3 4 5} "
want() { [[ $steps == *" $1 "* ]]; }  # step 1, the build, always runs (incremental)
mkdir -p "$out" .deps/root
for deb in .deps/debs/*.deb; do dpkg -x "$deb" .deps/root; done
usr=$PWD/.deps/root/usr
export LD_LIBRARY_PATH="$usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"

# A spill directory on a real disk: the first candidate that is not memory-backed.
for d in /var/tmp "$PWD/.spill" /root; do
  mkdir -p "$d" 2>/dev/null || continue
  case $(stat -f -c %T "$d") in tmpfs|ramfs) continue ;; esac
  export SPILL_DIR=$d
  break
done

{
  date -u
  "$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  echo "cores $(nproc); kernel $(uname -r); SPILL_DIR=${SPILL_DIR:-unset} ($(stat -f -c %T "${SPILL_DIR:-/}"))"
  free -g | head -2
  df -h "${SPILL_DIR:-/}" | tail -1
  c++ --version | head -1
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

torch_prefix=$("$python" -c "import torch.utils; print(torch.utils.cmake_prefix_path)")
start=$SECONDS
if ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPILLARENA_BUILD_TOOLS=OFF -DSPILLARENA_WERROR=OFF \
         -DCMAKE_PREFIX_PATH="$torch_prefix;$usr" \
         -DCMAKE_CXX_FLAGS="-isystem $usr/include" &&
       cmake --build "$build" --parallel "$(nproc)" --target accelerator_test device_path_test \
         overlapped_checkpoint_test checkpoint_test integrity_test io_engine_test arena_test \
         spillarena_bench; } > "$out/build.log" 2>&1; then
  grep -E -A4 'error|Error' "$out/build.log" | head -n 80
  tail -n 20 "$out/build.log"
  exit 1
fi
echo "built in $((SECONDS - start)) s"

status=0
want 2 && for t in accelerator_test device_path_test overlapped_checkpoint_test checkpoint_test integrity_test io_engine_test \
         arena_test; do
  echo "=== $t" >> "$out/tests.log"
  timeout 300 "$build/tests/$t" >> "$out/tests.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  echo "$t: rc=$rc $(grep -E '^\[doctest\] test cases' "$out/tests.log" | tail -n 1)"
done
want 2 && grep -E 'ERROR|skipped' "$out/tests.log" | head -n 40

if want 3; then
"$build/bench/spillarena_bench" --benchmark_filter='BM_AcceleratorStep' \
  --benchmark_out_format=json --benchmark_out="$out/accelerator.json" > "$out/bench.log" 2>&1 ||
  status=1
SPILLARENA_BENCH_ACCEL_SHAPE=4,4096,4096,32,8 "$build/bench/spillarena_bench" \
  --benchmark_filter='BM_AcceleratorStep/(recompute|disk_direct|disk_async|disk_gds|ram)' \
  --benchmark_out_format=json --benchmark_out="$out/accelerator-8.json" >> "$out/bench.log" 2>&1 ||
  status=1
cat "$out/bench.log"
fi

# The Python head-to-head: the extension built against this machine's torch, transformers from
# the carried wheels.
want 4 || want 5 || exit $status
mkdir -p .deps/py
for whl in .deps/wheels/*.whl; do "$python" -m zipfile -e "$whl" .deps/py >/dev/null 2>&1; done
# The extension's CMake tree is kept (-Cbuild-dir) and links the library built in step 1, so
# a later call rebuilds nothing that did not change.
if PYTHONPATH=$PWD/.deps/py "$python" -m pip install -q --no-build-isolation --no-deps --no-index \
     -Cbuild-dir=.deps/py-build "-Ccmake.define.SPILLARENA_PREBUILT_LIBRARIES=$(cd "$build" && pwd)" \
     --target .deps/py . >> "$out/build.log" 2>&1; then
  want 4 && { PYTHONPATH=$PWD/.deps/py timeout 270 "$python" bench/python/gpu_head_to_head.py \
    --device cuda --dtype bfloat16 --hidden 4096 --heads 32 --kv-heads 8 --intermediate 14336 \
    --vocab 32000 --layers 8 --seq 8192 --steps 2 --out "$out/head_to_head.json" \
    >> "$out/bench.log" 2>&1 || status=1; }
  want 4 && { PYTHONPATH=$PWD/.deps/py timeout 270 "$python" bench/python/gpu_head_to_head.py \
    --device cuda --dtype bfloat16 --hidden 4096 --heads 32 --kv-heads 8 --intermediate 14336 \
    --vocab 32000 --layers 2 --seq 32768 --steps 1 --out "$out/head_to_head.json" --append \
    >> "$out/bench.log" 2>&1 || status=1; }
  # Recompute, direct and gds (none does not decide the goal; gds last, in the time left, and
  # skipped at once without libcufile); no trial starts after 420 s, and the JSON is rewritten
  # after every trial.
  want 5 && { PYTHONPATH=$PWD/.deps/py timeout 450 "$python" bench/python/longest_sequence.py \
    --device cuda --modes recompute,spillarena_direct,spillarena_gds --deadline-s 420 \
    --out "$out/longest_sequence.json" >> "$out/bench.log" 2>&1 || status=1; }
else
  echo "python package build failed: see build.log"; status=1
fi
tail -n 8 "$out/bench.log"
exit $status
