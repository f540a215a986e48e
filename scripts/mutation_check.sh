#!/usr/bin/env bash
# Mutation check of the README's "Guarantees, and the tests that prove them" table: for each
# tests/mutations/NN-name.patch (each deletes or disables the code that provides one guarantee),
# apply it to a scratch worktree of HEAD, build the patch's target(s), run its test, and record
# "killed" (the test failed, as it must) or "SURVIVED" (the test still passed: it does not prove
# that guarantee). docs/mutation-check.md has the latest record.
#
# NOT IN CI: it is far too long (a full Release build, then one rebuild and one test run per
# patch; the TSan, ASan and libFuzzer patches build trees of their own). Run it by hand:
#
#   scripts/mutation_check.sh [BUILD_DIR] [PATCH...]
#
#   BUILD_DIR  where the build lives and is kept for the next run (default
#              ${TMPDIR:-/tmp}/spillarena-mutation); the scratch worktree is made beside it
#              (BUILD_DIR/worktree) and removed on exit. Its build tree is BUILD_DIR/build.
#   PATCH...   the patches to try (default: every tests/mutations/*.patch), in that order.
#
# Each patch starts with three header lines, which git apply ignores (they precede the first
# "diff --git"):
#   # guarantee: the README row it breaks (shortened)
#   # target: the CMake target(s) to build first, or "none" (a script that builds its own tree)
#   # run: the command that runs the test, from the build tree (BUILD_DIR/build), with $SRC the
#          worktree's root
# and, optionally, "# timeout: SECONDS" for a run that builds a tree of its own (TSan + LibTorch).
#
# Environment:
#   SPILLARENA_PYTHON   the Python whose torch CMake uses (default: this checkout's .venv)
#   MUTATION_BASELINE=1 also run each patch's command on the unmutated tree first: it must pass
#   MUTATION_TIMEOUT    seconds a run may take (default 600, ctest's limit for a test); a run that hangs
#                       until then counts as killed (a hang fails the test in CI too)
#   MUTATION_JOBS       build parallelism (default 2); builds and tests run under nice -n 19
#
# The patches apply to HEAD (the worktree is made from it), not to uncommitted changes.
# Exit status: 0 when every patch run was killed; 1 when one SURVIVED; 2 when a patch did not
# apply or its target did not build (a broken patch proves nothing either way).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${TMPDIR:-/tmp}/spillarena-mutation
if [[ $# -gt 0 && $1 != *.patch ]]; then
  build_dir=$1
  shift
fi
mkdir -p "$build_dir"
build_dir=$(cd "$build_dir" && pwd)
if [[ $# -gt 0 ]]; then
  patches=()
  for p in "$@"; do patches+=("$(cd "$(dirname "$p")" && pwd)/$(basename "$p")"); done
else
  patches=("$root"/tests/mutations/*.patch)
fi
[[ -f ${patches[0]} ]] || { echo "mutation_check: no patches found" >&2; exit 2; }

export SPILLARENA_PYTHON=${SPILLARENA_PYTHON:-$root/.venv/bin/python}
jobs=${MUTATION_JOBS:-2}
export CMAKE_BUILD_PARALLEL_LEVEL=$jobs  # the sanitizer and fuzz scripts' own builds too
timeout_s=${MUTATION_TIMEOUT:-600}
wt=$build_dir/worktree
bt=$build_dir/build
logs=$build_dir/logs
mkdir -p "$logs"

# --- the scratch worktree -----------------------------------------------------------------------
cleanup() {
  if [[ -d $wt ]]; then
    # Files a patch changed are remembered: a later run that reuses the build tree rebuilds them.
    git -C "$wt" diff --name-only >>"$build_dir/dirty-files" 2>/dev/null
    git -C "$root" worktree remove --force "$wt" >/dev/null 2>&1 || rm -rf "$wt"
  fi
  git -C "$root" worktree prune >/dev/null 2>&1
}
trap cleanup EXIT
trap 'exit 130' INT TERM
[[ -d $wt ]] && cleanup
git -C "$root" worktree add --detach "$wt" HEAD >/dev/null || exit 2
head=$(git -C "$wt" rev-parse HEAD)

# A fresh checkout gives every file a new mtime, which would make the kept build trees rebuild
# everything. When they were built from this same commit, the files get the commit's time back,
# except every file a patch ever changed there (dirty-files, kept for as long as the trees are):
# a tree (the sanitizer and fuzz scripts' ones included) may still hold an object compiled from
# the mutated text, so those files get a new mtime and are compiled again wherever they are used.
if [[ -f $build_dir/head && $(cat "$build_dir/head") == "$head" ]]; then
  stamp=$(git -C "$wt" log -1 --format=%ct HEAD)
  (cd "$wt" && git ls-files -z | xargs -0 touch -h -d "@$stamp")
  if [[ -f $build_dir/dirty-files ]]; then
    sort -u -o "$build_dir/dirty-files" "$build_dir/dirty-files"
    while read -r f; do [[ -e $wt/$f ]] && touch "$wt/$f"; done <"$build_dir/dirty-files"
  fi
else
  rm -rf "$bt" "$build_dir/dirty-files"
fi
echo "$head" >"$build_dir/head"

header() { sed -n "s/^# $1: //p" "$2" | head -n 1; }
targets_of() {  # the words before any "(", "none" for none
  local t
  t=$(header target "$1")
  t=${t%%(*}
  [[ $t =~ ^[[:space:]]*none ]] && return 0
  echo "$t"
}
first_failure() {  # the line that says how a run failed
  grep -m1 -E 'ERROR:|FATAL|WARNING: [A-Za-z]*Sanitizer|SUMMARY:|Bus error|Segmentation|Aborted|terminate called|deadly signal|Notes defined|Rows of|line differs|The following tests FAILED|Timeout|error:|^E  +[A-Za-z_.]+(Error|Exception)' "$1" |
    cut -c1-200
}

echo "mutation_check: HEAD $(git -C "$wt" rev-parse --short HEAD), worktree $wt, build $bt"
if [[ ! -f $bt/build.ninja ]]; then
  echo "mutation_check: configuring $bt"
  nice -n 19 cmake -S "$wt" -B "$bt" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DSPILLARENA_WERROR=OFF -DSPILLARENA_BUILD_BENCH=OFF >"$logs/configure.log" 2>&1 || {
    tail -n 30 "$logs/configure.log"
    exit 2
  }
fi

# Every target once, unmutated: the rebuild per patch is then only what the patch touches.
all_targets=()
for p in "${patches[@]}"; do
  for t in $(targets_of "$p"); do all_targets+=("$t"); done
done
if [[ ${#all_targets[@]} -gt 0 ]]; then
  echo "mutation_check: building $(printf '%s\n' "${all_targets[@]}" | sort -u | tr '\n' ' ')"
  start=$SECONDS
  mapfile -t unique_targets < <(printf '%s\n' "${all_targets[@]}" | sort -u)
  nice -n 19 cmake --build "$bt" --parallel "$jobs" --target "${unique_targets[@]}" \
    >"$logs/baseline-build.log" 2>&1 || {
    tail -n 40 "$logs/baseline-build.log"
    exit 2
  }
  echo "mutation_check: built in $((SECONDS - start)) s"
fi

run_command() {  # run_command PATCH LOG: the patch's run line from the build tree
  local cmd limit
  cmd=$(header run "$1")
  limit=$(header timeout "$1")
  (cd "$bt" && SRC="$wt" timeout "${limit:-$timeout_s}" nice -n 19 bash -c "$cmd") >"$2" 2>&1
}

names=() results=() details=() seconds=()
status=0
for p in "${patches[@]}"; do
  name=$(basename "$p" .patch)
  echo "--- $name: $(header guarantee "$p")"
  start=$SECONDS
  if [[ ${MUTATION_BASELINE:-0} == 1 ]]; then
    # Built first: the tree may still hold objects of the previous patch's mutated files.
    read -ra targets <<<"$(targets_of "$p")"
    if ((${#targets[@]})) &&
      ! nice -n 19 cmake --build "$bt" --parallel "$jobs" --target "${targets[@]}" >"$logs/$name.baseline-build.log" 2>&1; then
      names+=("$name") results+=("BASELINE BUILD FAILED") seconds+=($((SECONDS - start)))
      details+=("$(grep -m1 -E 'error' "$logs/$name.baseline-build.log" | cut -c1-200)")
      status=2
      continue
    fi
    if ! run_command "$p" "$logs/$name.baseline.log"; then
      names+=("$name") results+=("BASELINE FAILED") seconds+=($((SECONDS - start)))
      details+=("unmutated: $(first_failure "$logs/$name.baseline.log")")
      echo "    BASELINE FAILED: the unmutated tree fails this run"
      status=2
      continue
    fi
  fi
  if ! git -C "$wt" apply "$p" 2>"$logs/$name.apply.log"; then
    names+=("$name") results+=("DOES NOT APPLY") seconds+=(0)
    details+=("$(head -n 1 "$logs/$name.apply.log")")
    status=2
    continue
  fi
  result="" detail=""
  read -ra targets <<<"$(targets_of "$p")"
  if ((${#targets[@]})) &&
    ! nice -n 19 cmake --build "$bt" --parallel "$jobs" --target "${targets[@]}" >"$logs/$name.build.log" 2>&1; then
    result="BUILD FAILED" detail=$(grep -m1 -E 'error' "$logs/$name.build.log" | cut -c1-200)
    status=2
  else
    run_command "$p" "$logs/$name.run.log"
    rc=$?
    if [[ $rc == 0 ]] && grep -qE 'test cases: *0 \|' "$logs/$name.run.log"; then
      result="NO TEST RAN" detail="the run's filter matched no test case"
      status=2
    elif [[ $rc == 0 ]]; then
      result="SURVIVED" detail="the test passed with the guarantee's code removed"
      [[ $status == 0 ]] && status=1
    elif [[ $rc == 77 ]]; then
      result="not run" detail="skipped: $(grep -m1 skipped "$logs/$name.run.log")"
    elif [[ $rc == 124 ]]; then
      result="killed" detail="no result within the time limit (hang); $(first_failure "$logs/$name.run.log")"
    else
      result="killed" detail="exit $rc; $(first_failure "$logs/$name.run.log")"
    fi
  fi
  git -C "$wt" diff --name-only >>"$build_dir/dirty-files"
  git -C "$wt" checkout -q -- . && git -C "$wt" clean -fdq
  names+=("$name") results+=("$result") details+=("$detail") seconds+=($((SECONDS - start)))
  echo "    $result ($((SECONDS - start)) s): $detail"
done

echo
echo "| patch | result | s | how it failed (logs: $logs) |"
echo "|---|---|---:|---|"
for i in "${!names[@]}"; do
  echo "| ${names[$i]} | ${results[$i]} | ${seconds[$i]} | ${details[$i]//|/\\|} |"
done
exit "$status"
