#!/usr/bin/env bash
# Issue 50's GPU check, in two device calls of at most 8 minutes each. Run THERE (a GPU machine
# with CUDA PyTorch 2.11, cmake and ninja but no package registry), after scripts/gpu-prepare.sh
# HERE, which puts in .deps/ everything it needs, so nothing is compiled there:
#   run(command="bash scripts/gpu-check.sh 1", carry=[".deps"], timeout_s=540)
#   run(command="bash scripts/gpu-check.sh 2", carry=[".deps"], timeout_s=540)
# Each call installs first (in seconds: the carried Debian packages unpacked into .deps/root,
# never into /; spillarena's one wheel from .deps/wheels into .deps/py; in call 2 transformers'
# wheels too), then:
#   call 1  a. the CUDA C++ tests from .deps/gpu-bin (accelerator_test: bitwise gradients in
#              fp32 and bf16 with dropout, autocast replay, random queue delays; the engine's
#              CPU tests beside them), each under its own timeout;
#           b. BM_AcceleratorStep at 16 blocks for recompute, ram, disk_async and disk_direct,
#              then recompute and disk_async with SPILLARENA_PREFETCH_THREAD=worker (the A/B
#              of Note [Prefetching off the training thread]: disk_async's ratio to recompute,
#              each arm measured beside its own recompute),
#              (bench/accelerator_benchmark.cc: step time, GPU peak and its goal, host RSS
#              added, pool and copy waits, inputs spilled);
#           c. bench/python/gpu_peak_snapshot.py: the same stack and modes through the wheel,
#              the allocator's trace of one step replayed to its peak and every block there
#              given an owner (weights, grads, layer inputs held, copies in flight, restored
#              inputs, the layer at work, the allocator's cache), then disk_direct and
#              disk_async with host_pool_bytes at 1x, 2x and 4x the default pool;
#   call 2  d0. bench/python/attention_ops.py: the attention kernels transformers' Llama runs
#              there per attn_implementation, dropout and dtype, and what ATTENTION_OPS marks;
#           d. bench/python/longest_sequence.py: the longest sequence per mode (none,
#              transformers' checkpointing, transformers' offload=True, spillarena direct, and
#              direct with policy=ATTENTION_OPS) at
#              Llama-3-8B width, 16 layers, bf16, in an emulated 24 GB card, with the step time
#              and host RSS at each mode's longest length and at the lengths two modes share.
# Files, in $OUT, named as docs/bench/ keeps them (the session copies them there), DATE the
# machine's UTC date: gpu-env_DATE.txt (torch, driver, cores, disk, the commit measured) and
# gpu-check-N_DATE.log (this script's output) in both calls; call 1: accelerator-tests_DATE.log,
# accelerator_DATE.json and accelerator-prefetch-worker_DATE.json (google-benchmark's, b and b2,
# with b2's console in accelerator-prefetch-worker_DATE.log), accelerator-bench_DATE.log (b's
# console and the
# snapshot's table), accelerator-peaks_DATE.json, accelerator-peaks_DATE.tar (the raw
# snapshots, for gpu_peak_snapshot.py --classify or pytorch.org/memory_viz); call 2:
# attention-ops_DATE.json, longest_sequence_DATE.json, longest-sequence_DATE.log. Every JSON carries its date and the
# commit (.deps/COMMIT, written by gpu-prepare.sh).
#
# Budget. Measured on the H200 on 2026-12-04 (docs/benchmarks.md) with .deps/gpu-bin carried:
# installs under 5 s; the C++ tests (a) 34 s; BM_AcceleratorStep at 16 and 8 blocks in every mode
# 317 s, of which 229 s for 16 blocks in 7 modes (log timestamps). Estimated from those, not
# measured: (b) 16 blocks in the 4 modes asked about ~160 s (the shared stack built once ~15 s;
# each mode ~36 s: a warm-up and 3 steps, then a fresh process that builds the stack again and
# runs 3 steps for its host RSS; per_file ~48 s and none ~20 s are no longer run); (c) ~10 runs
# of ~15 s (a fresh process each: CUDA context, the 16-block stack, 5 steps of 0.8-1.4 s, the
# trace's replay) ~150 s; (d) ~4-5 trials per mode (two short ones, then lengths fitted to the
# budget) of 10-25 s each (a fresh process: torch and transformers imported, the model built,
# 2 steps of up to ~5 s at 50k tokens) ~300 s; (b2) two modes ~72 s. So call 1 ~425 s (c gets
# what b2 leaves), call 2 ~320 s. Each step runs under `timeout` with a cap (installs 60 s, a
# 70 s, b 180 s, b2 90 s, c and d what is left), all within
# SPILLARENA_GPU_BUDGET_S (470 s by default; pass less when less device time is left), and the
# Python steps start no run or trial after their own deadline and rewrite their JSON after
# each, so a slow step neither eats the call nor loses what it measured.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
call=${1:-}
[[ $call == 1 || $call == 2 ]] || { echo "usage: bash scripts/gpu-check.sh 1|2 (see the header)"; exit 2; }
out=${OUT:-/tmp/spillarena-gpu-check}
day=${SPILLARENA_GPU_DAY:-$(date -u +%F)}
mkdir -p "$out" .deps/root .deps/py
if [[ -z ${SPILLARENA_GPU_DAY:-} ]]; then  # once more, with everything it prints kept in $OUT
  SPILLARENA_GPU_DAY=$day bash "$0" "$call" 2>&1 | tee "$out/gpu-check-${call}_$day.log"
  exit "${PIPESTATUS[0]}"
fi
python=${SPILLARENA_PYTHON:-python3}
budget=${SPILLARENA_GPU_BUDGET_S:-470}
deadline=$((SECONDS + budget))

# The seconds a step may run: its cap, or what is left of the budget less a margin of 10 s.
within() {
  local left=$((deadline - SECONDS - 10))
  ((left < 1)) && left=1
  echo $(($1 < left ? $1 : left))
}
# Runs "$@" under timeout with a cap (see within); says on the console (descriptor 3, whatever
# the step's own output is sent to) how long it took and why it stopped.
exec 3>&1
step() {
  local name=$1 cap=$2 start=$SECONDS rc
  shift 2
  timeout --kill-after=5 "$(within "$cap")" "$@"
  rc=$?
  ((rc == 124 || rc == 137)) && echo "$name: stopped at its time limit" >&3
  echo "$name: rc=$rc, $((SECONDS - start)) s" >&3
  return $rc
}

for deb in .deps/debs/*.deb; do [[ -e $deb ]] && dpkg -x "$deb" .deps/root; done
usr=$PWD/.deps/root/usr
export LD_LIBRARY_PATH="$usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
# A spill directory on a real disk: the first candidate that is not memory-backed.
for d in /var/tmp "$PWD/.spill" /root; do
  mkdir -p "$d" 2>/dev/null || continue
  case $(stat -f -c %T "$d") in tmpfs | ramfs) continue ;; esac
  export SPILL_DIR=$d
  break
done
SPILLARENA_COMMIT=$(cat .deps/COMMIT 2>/dev/null ||
  git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)
export SPILLARENA_COMMIT PYTHONUNBUFFERED=1

{
  date -u
  echo "commit $SPILLARENA_COMMIT (the build carried in .deps); call $call; budget $budget s"
  "$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  echo "cores $(nproc); kernel $(uname -r); SPILL_DIR=${SPILL_DIR:-unset} ($(stat -f -c %T "${SPILL_DIR:-/}"))"
  free -g | head -2
  df -h "${SPILL_DIR:-/}" | tail -1
  ulimit -l | sed 's/^/RLIMIT_MEMLOCK (KiB): /'
} > "$out/gpu-env_$day.txt" 2>&1
cat "$out/gpu-env_$day.txt"

# The one spillarena wheel (cp310-abi3, beside any torch >= 2.11: Note [One wheel for every
# torch]); in call 2 transformers and what it imports, which the GPU image may lack or have in
# another version. Never compiled here: without the wheel there is nothing to measure.
start=$SECONDS
wheel=$(compgen -G ".deps/wheels/spillarena-*-cp310-abi3-*.whl" | head -n 1)
if [[ -z $wheel ]]; then
  echo "no spillarena wheel in .deps/wheels: run scripts/gpu-prepare.sh here first"; exit 1
fi
if [[ $call == 2 ]]; then
  for whl in .deps/wheels/*.whl; do
    case $(basename "$whl") in spillarena-*) continue ;; esac
    "$python" -m zipfile -e "$whl" .deps/py >/dev/null 2>&1 || echo "could not unpack $whl"
  done
fi
if ! step install 60 "$python" -m pip install -q --no-deps --no-index --upgrade --target .deps/py \
    "$wheel"; then
  echo "the wheel did not install"; exit 1
fi
export PYTHONPATH=$PWD/.deps/py
echo "installs: $(basename "$wheel"), $((SECONDS - start)) s"
status=0

if [[ $call == 1 ]]; then
  torch_release=$("$python" -c "import torch; print(torch.__version__.split('+')[0])")
  torch_lib=$("$python" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
  # The carried binaries find this machine's LibTorch (and through its run paths the NVIDIA
  # libraries) on LD_LIBRARY_PATH, which comes before the paths they were linked with.
  export LD_LIBRARY_PATH="$torch_lib:$LD_LIBRARY_PATH"
  bin=.deps/gpu-bin
  if [[ ! -x $bin/spillarena_bench || "$(cat $bin/TORCH_VERSION 2>/dev/null)" != "$torch_release" ]]; then
    echo "a, b: skipped: .deps/gpu-bin is missing or not built for torch $torch_release" \
      "(GPU_TORCH=$torch_release scripts/gpu-prepare.sh here)"
    status=1
  else
    tests_log=$out/accelerator-tests_$day.log
    start=$SECONDS
    for t in accelerator_test device_path_test overlapped_checkpoint_test checkpoint_test \
        integrity_test io_engine_test arena_test; do
      cap=$((70 - (SECONDS - start)))
      ((cap < 5)) && { echo "$t: not run (a's 70 s are spent)"; status=1; continue; }
      echo "=== $t" >> "$tests_log"
      timeout --kill-after=5 "$(within "$cap")" "$bin/$t" >> "$tests_log" 2>&1
      rc=$?
      ((rc == 0)) || status=1
      echo "$t: rc=$rc $(grep -E '^\[doctest\] test cases' "$tests_log" | tail -n 1)"
    done
    grep -E 'ERROR|skipped' "$tests_log" | head -n 40
    echo "a (C++ tests): $((SECONDS - start)) s"

    bench_log=$out/accelerator-bench_$day.log
    step "b (BM_AcceleratorStep, 16 blocks)" 180 "$bin/spillarena_bench" \
      --benchmark_filter='BM_AcceleratorStep/(recompute|ram|disk_async|disk_direct)/' \
      --benchmark_out_format=json --benchmark_out="$out/accelerator_$day.json" \
      > "$bench_log" 2>&1 || status=1
    grep -E 'BM_AcceleratorStep|ERROR' "$bench_log"
    # b2: the buffered mode again with the predecessors' prefetches on a worker thread, beside
    # recompute in the same run so its ratio is measured as b's is: the A/B of Note
    # [Prefetching off the training thread] (src/core/stash/chain.cc); the hypothesis is about
    # buffered reads of resident pages, which direct mode does not make.
    b2_log=$out/accelerator-prefetch-worker_$day.log
    step "b2 (BM_AcceleratorStep, prefetches on a worker)" 90 \
      env SPILLARENA_PREFETCH_THREAD=worker "$bin/spillarena_bench" \
      --benchmark_filter='BM_AcceleratorStep/(recompute|disk_async)/' \
      --benchmark_out_format=json --benchmark_out="$out/accelerator-prefetch-worker_$day.json" \
      > "$b2_log" 2>&1 || status=1
    grep -E 'BM_AcceleratorStep|ERROR' "$b2_log"
  fi

  # c: what is left of the budget, less 10 s; a run starts only when it is expected to end
  # inside it (gpu_peak_snapshot.py's --deadline-s).
  cap=$(within 600)
  step "c (peak snapshots and pools)" "$cap" "$python" bench/python/gpu_peak_snapshot.py \
    --device cuda --deadline-s "$((cap > 10 ? cap - 5 : 5))" --run-timeout-s 90 \
    --out "$out/accelerator-peaks_$day.json" --raw "$out/accelerator-peaks_$day.tar" \
    >> "$out/accelerator-bench_$day.log" 2>&1 || status=1
  tail -n 30 "$out/accelerator-bench_$day.log"
else
  # d0: which attention kernels transformers' Llama runs on this GPU and whether
  # spillarena.ATTENTION_OPS marks them (README's table; seconds).
  step "d0 (attention ops)" "$(within 60)" "$python" bench/python/attention_ops.py --device cuda \
    --json "$out/attention-ops_$day.json" || status=1
  # d: what is left of the budget, less 10 s; no trial starts in its last 100 s (a trial's cap).
  cap=$(within 600)
  step "d (longest sequence)" "$cap" "$python" bench/python/longest_sequence.py --device cuda \
    --modes none,hf_checkpointing,hf_offload,spillarena_direct,spillarena_attention \
    --deadline-s "$((cap > 130 ? cap - 100 : 30))" --trial-timeout-s 90 \
    --out "$out/longest_sequence_$day.json" > "$out/longest-sequence_$day.log" 2>&1 || status=1
  tail -n 40 "$out/longest-sequence_$day.log"
fi
echo "call $call: $SECONDS s in all, status $status"
exit $status
