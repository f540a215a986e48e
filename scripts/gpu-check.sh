#!/usr/bin/env bash
# The accelerator check. Run THERE, on a GPU machine with CUDA PyTorch, cmake and ninja but no
# package registry, after scripts/gpu-prepare.sh here (which fetches the Debian packages and
# wheels, builds spillarena's one wheel — it works beside any torch >= 2.11 — and the CUDA C++
# tests against that machine's torch release, so no device minute goes to compiling):
#   1. installs: the carried Debian packages unpacked into .deps/root (never into /), the C++
#      tests and benchmark from .deps/gpu-bin, spillarena's wheel from .deps/wheels into .deps/py
#      (no compiler). Where .deps/gpu-bin is missing or was built for another torch release, or
#      no wheel is there, it builds them there instead (incremental: the build trees are kept);
#   2. runs the CUDA tests (tests/accelerator_test.cc: bitwise gradients in fp32 and bf16 with
#      dropout, autocast replay, random queue delays) and the CPU tests of the engine beside them;
#   3. runs BM_AcceleratorStep (bench/accelerator_benchmark.cc) in every mode, disk_gds too
#      (skipped with the library's message where libcufile does not load), at 16 layers and
#      again at 8 (host memory added must not grow with the layer count: the host pool bounds it);
#   4. runs the Python head-to-head (bench/python/gpu_head_to_head.py) at Llama-3-8B width, seq 8k
#      and 32k, transformers from the carried wheels (.deps/wheels) on PYTHONPATH, both runs into
#      head_to_head.json;
#   5. runs the longest-sequence search (bench/python/longest_sequence.py): the largest sequence
#      that trains in an emulated 24 GB card per mode (recompute, spillarena direct and gds; gds
#      skipped before any trial, with GdsUnavailableError's message, where libcufile does not
#      load) at Llama-3-8B width, 16 layers, and whether spilling reaches 1.5x recompute's, into
#      longest_sequence.json.
# Everything it reports goes to $OUT (at most 8 files): env.txt, build.log (installs or builds),
# tests.log, accelerator.json, accelerator-8.json, head_to_head.json, longest_sequence.json,
# bench.log (8). Each step prints its seconds.
# Budget, measured on the H200 on 2026-12-04 with .deps/gpu-bin carried: step 1 under 5 s, step 2
# 34 s, step 3 317 s (16 and 8 layers, every mode); step 4 at most 9 minutes (8k and 32k, 270 s
# each, each JSON rewritten after every mode) and step 5 at most 8. One device command may run 10
# minutes and a session has 15 minutes of device time in all (the machine's start included): run
# steps "1 2 3" first (SPILLARENA_GPU_STEPS="1 2 3"), then "4" or "5" in what is left; the
# installs are kept between calls on a warm machine.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-/tmp/spillarena-gpu-check}
build=${SPILLARENA_GPU_BUILD:-build-gpu}
python=${SPILLARENA_PYTHON:-python3}
steps=" ${SPILLARENA_GPU_STEPS:-1 2 3 4 5} "
want() { [[ $steps == *" $1 "* ]]; }  # step 1 (installs) always runs
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
torch_release=$("$python" -c "import torch; print(torch.__version__.split('+')[0])")
# The carried binaries find this machine's LibTorch (and, through its own run paths, the NVIDIA
# libraries) on LD_LIBRARY_PATH, which comes before the paths they were linked with.
# (torch_prefix is torch/share/cmake; the libraries are in torch/lib.)
LD_LIBRARY_PATH="$(dirname "$(dirname "$torch_prefix")")/lib:$LD_LIBRARY_PATH"
export LD_LIBRARY_PATH
tests=(accelerator_test device_path_test overlapped_checkpoint_test checkpoint_test integrity_test
  io_engine_test arena_test)
start=$SECONDS
if [[ -x .deps/gpu-bin/spillarena_bench && "$(cat .deps/gpu-bin/TORCH_VERSION 2>/dev/null)" == \
      "$torch_release" ]]; then
  bin=.deps/gpu-bin bench_bin=.deps/gpu-bin
  echo "step 1: C++ tests and benchmark from .deps/gpu-bin (built by gpu-prepare.sh for torch" \
    "$torch_release)" | tee "$out/build.log"
else
  bin=$build/tests bench_bin=$build/bench
  echo "step 1: no .deps/gpu-bin for torch $torch_release; building here" | tee "$out/build.log"
  if ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPILLARENA_BUILD_TOOLS=OFF \
           -DSPILLARENA_WERROR=OFF -DCMAKE_PREFIX_PATH="$torch_prefix;$usr" \
           -DCMAKE_CXX_FLAGS="-isystem $usr/include" &&
         cmake --build "$build" --parallel "$(nproc)" --target "${tests[@]}" spillarena_bench; } \
      >> "$out/build.log" 2>&1; then
    grep -E -A4 'error|Error' "$out/build.log" | head -n 80
    tail -n 20 "$out/build.log"
    exit 1
  fi
fi
echo "step 1 (C++): $((SECONDS - start)) s"

status=0
start=$SECONDS
want 2 && for t in "${tests[@]}"; do
  echo "=== $t" >> "$out/tests.log"
  timeout 300 "$bin/$t" >> "$out/tests.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  echo "$t: rc=$rc $(grep -E '^\[doctest\] test cases' "$out/tests.log" | tail -n 1)"
done
want 2 && grep -E 'ERROR|skipped' "$out/tests.log" | head -n 40
want 2 && echo "step 2: $((SECONDS - start)) s"

if want 3; then
start=$SECONDS
"$bench_bin/spillarena_bench" --benchmark_filter='BM_AcceleratorStep' \
  --benchmark_out_format=json --benchmark_out="$out/accelerator.json" > "$out/bench.log" 2>&1 ||
  status=1
SPILLARENA_BENCH_ACCEL_SHAPE=4,4096,4096,32,8 "$bench_bin/spillarena_bench" \
  --benchmark_filter='BM_AcceleratorStep/(recompute|disk_direct|disk_async|disk_gds|ram)' \
  --benchmark_out_format=json --benchmark_out="$out/accelerator-8.json" >> "$out/bench.log" 2>&1 ||
  status=1
cat "$out/bench.log"
echo "step 3: $((SECONDS - start)) s"
fi

# The Python head-to-head: the one spillarena wheel built on the CPU machine (it works beside any
# torch >= 2.11: Note [One wheel for every torch]), or, without one, the package built here;
# transformers from the carried wheels.
want 4 || want 5 || exit $status
start=$SECONDS
mkdir -p .deps/py
for whl in .deps/wheels/*.whl; do
  case $(basename "$whl") in spillarena-*) continue ;; esac
  "$python" -m zipfile -e "$whl" .deps/py >/dev/null 2>&1
done
# One cp310-abi3 file for every CPython from 3.10 on (Note [One file for every CPython]).
wheel=$(compgen -G ".deps/wheels/spillarena-*-cp310-abi3-*.whl" | head -n 1)
if [[ -n $wheel ]]; then
  echo "step 1 (Python): installing $(basename "$wheel")" >> "$out/build.log"
  installed() { "$python" -m pip install -q --no-deps --no-index --upgrade --target .deps/py \
    "$wheel" >> "$out/build.log" 2>&1; }
else
  # The extension's CMake tree is kept (-Cbuild-dir) and links the library built in step 1, so a
  # later call rebuilds nothing that did not change.
  echo "step 1 (Python): no spillarena wheel in .deps/wheels; building" >> "$out/build.log"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPILLARENA_BUILD_TOOLS=OFF \
    -DSPILLARENA_BUILD_TESTS=OFF -DSPILLARENA_BUILD_BENCH=OFF -DSPILLARENA_WERROR=OFF \
    -DCMAKE_PREFIX_PATH="$torch_prefix;$usr" -DCMAKE_CXX_FLAGS="-isystem $usr/include" \
    >> "$out/build.log" 2>&1 && cmake --build "$build" --target spillarena spillarena_core \
    >> "$out/build.log" 2>&1
  installed() { PYTHONPATH=$PWD/.deps/py "$python" -m pip install -q --no-build-isolation \
    --no-deps --no-index -Cbuild-dir=.deps/py-build \
    "-Ccmake.define.SPILLARENA_PREBUILT_LIBRARIES=$(cd "$build" && pwd)" --target .deps/py . \
    >> "$out/build.log" 2>&1; }
fi
if installed; then
  echo "step 1 (Python): $((SECONDS - start)) s"
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
  echo "the Python package did not install: see build.log"; status=1
fi
tail -n 8 "$out/bench.log"
exit $status
