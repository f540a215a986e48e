#!/usr/bin/env bash
# Run HERE (Debian 12, no GPU needed) before a GPU session, so the GPU machine spends its minutes
# on tests and measurements, not on compiling. Everything lands in .deps/ (git-ignored), which the
# device call carries:
#   1. the Debian packages and transformers' wheels (scripts/gpu-fetch-debs.sh): .deps/debs,
#      .deps/wheels;
#   2. the GPU machine's torch release (a CUDA build, torch==$GPU_TORCH for CPython $GPU_PYTHON),
#      installed without its dependencies into build-gpu-torch/venv: its headers, libraries and
#      CMake files are all a build needs, and it is never imported here;
#   3. spillarena's one wheel (every torch >= 2.11, every CPython >= 3.10): .deps/wheels;
#   4. the CUDA C++ tests and spillarena_bench, built against that LibTorch with this machine's
#      CUDA toolkit (nvcc), stripped: .deps/gpu-bin;
#   5. the commit all this was built from (git describe --dirty: "-dirty" when the work tree
#      had changes), which every figure of gpu-check.sh carries: .deps/COMMIT.
# Then the two calls of scripts/gpu-check.sh's header, each with carry=[".deps"]. Defaults are
# the lent machines' (torch 2.11.0+cu130, Python 3.12); GPU_TORCH and GPU_PYTHON name others.
# What travels (the work tree and .deps) must stay under 64 MiB: checked at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
GPU_TORCH=${GPU_TORCH:-2.11.0}
GPU_PYTHON=${GPU_PYTHON:-3.12}
log() { echo "gpu-prepare: $*" >&2; }
tests=(accelerator_test device_path_test overlapped_checkpoint_test checkpoint_test
  integrity_test io_engine_test arena_test)

log "1/4 Debian packages and transformers' wheels (for CPython $GPU_PYTHON)"
GPU_PYTHON=$GPU_PYTHON scripts/gpu-fetch-debs.sh >/dev/null

# A pyenv shim named python3.12 exists where that version is installed but not selected, and fails
# when run: take the first candidate that runs.
python=""
for candidate in "python$GPU_PYTHON" \
    "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$GPU_PYTHON".*/bin/"python$GPU_PYTHON"; do
  if "$candidate" -c '' 2>/dev/null; then python=$candidate; break; fi
done
[[ -n $python ]] ||
  { log "no python$GPU_PYTHON here (the GPU machine's Python; pyenv install $GPU_PYTHON)"; exit 1; }
venv=build-gpu-torch/venv
have=$("$venv/bin/python" -c 'from importlib.metadata import version; print(version("torch"))' \
  2>/dev/null || true)
if [[ ${have%%+*} != "$GPU_TORCH" ]]; then
  log "2/4 torch==$GPU_TORCH for Python $GPU_PYTHON (a CUDA build, about 530 MB) into $venv"
  rm -rf "$venv" build-gpu-torch/dl
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip download -q --no-deps --only-binary=:all: -d build-gpu-torch/dl \
    "torch==$GPU_TORCH" 2>&1 | { grep -v "is ignored: it is neither" || true; } >&2
  "$venv/bin/python" -m pip install -q --no-deps build-gpu-torch/dl/torch-*.whl
  rm -rf build-gpu-torch/dl
else
  log "2/4 $venv has torch $GPU_TORCH"
fi

log "3/4 spillarena's wheel (one for every torch >= 2.11 and CPython >= 3.10; no torch needed)"
rm -f .deps/wheels/spillarena-*.whl
scripts/build_wheel.sh --out .deps/wheels >/dev/null

log "4/4 the CUDA C++ tests and spillarena_bench against its LibTorch"
# libtorch_cuda.so needs cuDNN, cuBLAS, NCCL, ... which only the GPU machine has (torch finds them
# there through its own run paths): the executables are linked without resolving the symbols of
# torch's libraries here (--allow-shlib-undefined); everything spillarena calls is resolved.
cmake_dir=$("$venv/bin/python" -c 'import importlib.util as u, os
print(os.path.join(u.find_spec("torch").submodule_search_locations[0], "share", "cmake"))')
cuda_root=""
for d in "${CUDA_HOME:-}" /usr/local/cuda "$(dirname "$(dirname "$(readlink -f \
    "$(command -v nvcc || echo /nonexistent/bin/nvcc)")")")"; do
  [[ -n $d && -f $d/include/cuda_runtime.h ]] && { cuda_root=$d; break; }
done
[[ -n $cuda_root ]] ||
  { log "no CUDA toolkit here (\$CUDA_HOME, /usr/local/cuda): LibTorch's CMake files need it"; exit 1; }
cmake -S . -B build-gpu-torch/cpp -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPILLARENA_BUILD_TOOLS=OFF \
  -DSPILLARENA_WERROR=OFF -DTorch_DIR="$cmake_dir/Torch" -DCaffe2_DIR="$cmake_dir/Caffe2" \
  -DCUDA_TOOLKIT_ROOT_DIR="$cuda_root" -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined \
  >build-gpu-torch/configure.log 2>&1 ||
  { tail -n 30 build-gpu-torch/configure.log; exit 1; }
cmake --build build-gpu-torch/cpp --parallel "$(nproc)" --target "${tests[@]}" spillarena_bench \
  >build-gpu-torch/build.log 2>&1 || { tail -n 40 build-gpu-torch/build.log; exit 1; }
rm -rf .deps/gpu-bin && mkdir -p .deps/gpu-bin
for t in "${tests[@]}"; do cp "build-gpu-torch/cpp/tests/$t" .deps/gpu-bin/; done
cp build-gpu-torch/cpp/bench/spillarena_bench .deps/gpu-bin/
strip .deps/gpu-bin/*
echo "$GPU_TORCH" >.deps/gpu-bin/TORCH_VERSION
git describe --always --dirty --abbrev=12 >.deps/COMMIT
du -sh .deps/debs .deps/wheels .deps/gpu-bin .deps >&2
# The device call carries the work tree (tracked and untracked files git does not ignore) and
# the paths named in carry: 64 MiB in all.
tree_bytes=$({ git ls-files -z --cached --others --exclude-standard |
  du -cb --files0-from=- 2>/dev/null || true; } | tail -n 1 | cut -f1)
deps_bytes=$(du -sb .deps | cut -f1)
if ((tree_bytes + deps_bytes > 64 << 20)); then
  log "the work tree ($((tree_bytes >> 20)) MiB) and .deps ($((deps_bytes >> 20)) MiB) exceed" \
    "the 64 MiB a device call carries: leave out what the calls do not need"
  exit 1
fi
log "ready ($(cat .deps/COMMIT)), $(((tree_bytes + deps_bytes) >> 20)) MiB to carry:" \
  "run(command=\"bash scripts/gpu-check.sh 1\", carry=[\".deps\"], timeout_s=540), then 2"
