#!/usr/bin/env bash
# The wheel as a user meets it (a ctest entry; the wheel comes from the wheel_build entry,
# scripts/build_wheel.sh --out build/wheel):
#   1. installed into a virtualenv that holds torch and nothing else, with --no-index --no-deps and
#      no compiler, cmake or scikit-build-core on PATH, then tests/wheel/smoke.py trains a step;
#   2. the same with liburing's shared library hidden (a mount namespace: root only, else said);
#   3. its extension names no symbol or library of torch (one wheel for every torch >= 2.11;
#      scripts/wheel_matrix.sh runs it beside 2.11, 2.13 and 2.15);
#   4. beside a torch older than 2.11 (a stand-in torch 2.10.0): pip refuses it, and forced in
#      with --no-deps, `import spillarena` raises an ImportError naming the torch it needs;
#   5. one file for every CPython from 3.10 on: the wheel is tagged cp310-abi3, and its extension
#      loads and works (tests/wheel/load_extension.py, no torch) in each CPython 3.10 or later
#      found on PATH or under ~/.pyenv; a CPython 3.9 found there is refused by pip.
# Prints the install and smoke-step times and the wheel's size.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:?usage: wheel_check.sh WORK_DIR, the wheel folder of a build tree}
work=$(mkdir -p "$work" && cd "$work" && pwd)
wheel=""
for w in "$work"/spillarena-*.whl; do  # the newest
  if [[ -f $w && (-z $wheel || $w -nt $wheel) ]]; then wheel=$w; fi
done
[[ -n $wheel ]] || { echo "wheel_check: no wheel in $work; run scripts/build_wheel.sh --out $work"; exit 1; }
echo "wheel_check: $(basename "$wheel"), $(du -k "$wheel" | cut -f1) KiB"
torch_version=$("$src/.venv/bin/python" -c 'from importlib.metadata import version; print(version("torch"))')
spill_dir=$(mktemp -d "$work/spill.XXXXXX")
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
trap 'rm -rf "$spill_dir"' EXIT

# A venv with torch alone, made once per torch release and build tree; spillarena is removed from
# it before each run, and its contents checked, so every run installs into torch and nothing else.
venv=$work/venv-torch-$torch_version
if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  echo "wheel_check: making $venv (torch==$torch_version alone)"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q "torch==$torch_version" 2>&1 | { grep -v "is ignored" || true; }
fi
"$venv/bin/python" -m pip uninstall -q -y spillarena >/dev/null 2>&1 || true
extra=$("$venv/bin/python" -m pip list --format=freeze 2>/dev/null |
  grep -iE '^(spillarena|scikit|cmake|ninja|pybind11|transformers)' || true)
[[ -z $extra ]] || { echo "wheel_check: $venv holds more than torch: $extra"; exit 1; }

# Only the venv's bin/ on PATH: no compiler, cmake or ninja can be found.
clean_env=(env -i "HOME=$HOME" "PATH=$venv/bin" "SPILL_DIR=$spill_dir")
for tool in c++ gcc cmake ninja; do
  if "${clean_env[@]}" "$venv/bin/python" -c "import shutil,sys; sys.exit(shutil.which('$tool') is None)"; then
    echo "wheel_check: $tool is reachable from the clean environment"; exit 1
  fi
done
start=$EPOCHREALTIME
"${clean_env[@]}" "$venv/bin/python" -m pip install -q --no-index --no-deps "$wheel"
echo "wheel_check: installed with --no-index --no-deps in $(since "$start") s"
cd "$spill_dir"  # not the source tree: the import must find the installed package
start=$EPOCHREALTIME
"${clean_env[@]}" "$venv/bin/python" "$src/tests/wheel/smoke.py"
echo "wheel_check: smoke step in a fresh process: $(since "$start") s"

# 2. liburing's shared library hidden: the wheel carries its own (linked in).
liburing=$(ldconfig -p | awk '/liburing\.so\.2 /{print $NF}' | tail -n 1)
if [[ $(id -u) -eq 0 && -n $liburing ]] && command -v unshare >/dev/null; then
  # shellcheck disable=SC2016  # expanded by the inner shell, from its arguments
  unshare -m bash -c 'mount --bind /dev/null "$1" || exit 1
    if python3 -c "import ctypes; ctypes.CDLL(\"liburing.so.2\")" 2>/dev/null; then
      echo "wheel_check: liburing.so.2 still loads after hiding $1"; exit 1
    fi
    shift; exec "$@"' _ "$liburing" "${clean_env[@]}" "$venv/bin/python" "$src/tests/wheel/smoke.py" ||
    { echo "wheel_check: the wheel fails with $liburing hidden"; exit 1; }
  echo "wheel_check: with $liburing hidden (a mount namespace): imports and trains"
else
  echo "wheel_check: liburing not hidden (needs root, unshare and a system liburing.so.2);" \
    "the wheel's NEEDED list, which names no liburing, stands for it:"
  "$venv/bin/python" - "$venv" <<'PY'
import glob, subprocess, sys
so = glob.glob(f"{sys.argv[1]}/lib/python*/site-packages/spillarena/_C*.so")[0]
needed = subprocess.run(["readelf", "-d", so], capture_output=True, text=True).stdout
sys.exit("liburing" in needed)
PY
fi

# 3. The extension links no torch (Note [One wheel for every torch] in python/CMakeLists.txt):
# no undefined symbol of libtorch, libc10 or libtorch_python, no such library needed.
so=$(ls "$venv"/lib/python*/site-packages/spillarena/_C*.so)
if nm -D --undefined-only "$so" | grep -iE 'torch|c10'; then
  echo "wheel_check: the extension needs torch's C++ symbols above"; exit 1
fi
if readelf -d "$so" | grep -iE 'NEEDED.*(torch|c10)'; then
  echo "wheel_check: the extension needs torch's libraries above"; exit 1
fi
echo "wheel_check: the extension names no symbol or library of torch"

# 4. Beside a torch older than 2.11: a stand-in torch 2.10.0 (metadata and a module, no code).
other=$work/venv-old-torch
if [[ ! -x $other/bin/python ]]; then python3 -m venv "$other"; fi
"$other/bin/python" -m pip uninstall -q -y spillarena >/dev/null 2>&1 || true
site=$("$other/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$site/torch" "$site/torch-2.10.0.dist-info"
echo '__version__ = "2.10.0"' >"$site/torch/__init__.py"
printf 'Metadata-Version: 2.1\nName: torch\nVersion: 2.10.0\n' >"$site/torch-2.10.0.dist-info/METADATA"
: >"$site/torch-2.10.0.dist-info/RECORD"
if refused=$(env -i "HOME=$HOME" PIP_CONFIG_FILE=/dev/null "$other/bin/python" -m pip install \
    --no-index "$wheel" 2>&1); then
  echo "wheel_check: pip installed the wheel beside torch 2.10.0"; exit 1
fi
echo "$refused" | grep -q "torch>=2.11" ||
  { echo "wheel_check: pip refused, but not for torch:"; echo "$refused"; exit 1; }
echo "wheel_check: beside torch 2.10.0, pip refuses: $(echo "$refused" | grep -m1 -i error)"
"$other/bin/python" -m pip install -q --no-index --no-deps "$wheel"
if message=$("$other/bin/python" -c 'import spillarena' 2>&1); then
  echo "wheel_check: spillarena imported beside torch 2.10.0"; exit 1
fi
for needle in "ImportError" "needs torch >= 2.11" "torch 2.10.0 is installed"; do
  grep -qF "$needle" <<<"$message" || { echo "wheel_check: the ImportError lacks '$needle':"; echo "$message"; exit 1; }
done
echo "wheel_check: forced in with --no-deps: $(echo "$message" | tail -n 1)"

# 5. One file for every CPython (Note [One file for every CPython] in python/src/module.cc).
[[ $(basename "$wheel") == *-cp310-abi3-* ]] ||
  { echo "wheel_check: $(basename "$wheel") is not tagged cp310-abi3"; exit 1; }
unpacked=$work/unpacked
rm -rf "$unpacked" && mkdir -p "$unpacked"
python3 -m zipfile -e "$wheel" "$unpacked"
found=()
for minor in 9 10 11 12 13 14; do
  for py in "$HOME"/.pyenv/versions/3."$minor".*/bin/python3."$minor" \
    "$(command -v "python3.$minor" || true)"; do
    # (a pyenv shim is on PATH but may run no interpreter)
    if [[ -x $py ]] && "$py" -c pass 2>/dev/null; then found+=("$py"); break; fi
  done
done
((${#found[@]})) || { echo "wheel_check: no other CPython found; step 5 checked the tag only"; exit 0; }
for py in "${found[@]}"; do
  if [[ $("$py" -c 'import sys; print(sys.version_info >= (3, 10))') == True ]]; then
    scratch=$(mktemp -d "$work/abi3.XXXXXX")
    "$py" "$src/tests/wheel/load_extension.py" "$unpacked/spillarena" "$scratch" ||
      { rm -rf "$scratch"; echo "wheel_check: the extension fails in $py"; exit 1; }
    rm -rf "$scratch"
  elif refused=$("$py" -m pip install --dry-run --no-index --no-deps "$wheel" 2>&1); then
    echo "wheel_check: pip of $py ($("$py" -V)) accepted the wheel"; exit 1
  else
    echo "wheel_check: $("$py" -V) refused: $(echo "$refused" | grep -m1 -i error)"
  fi
done
