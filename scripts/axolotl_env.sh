#!/usr/bin/env bash
# Builds (once) the axolotl virtualenv: axolotl 0.21.0 on Python 3.11 with the CPU torch, and
# installs spillarena's wheel for that torch into it (every run). Prints the venv's python.
# The venv lives in the user's cache ($SPILLARENA_AXOLOTL_VENV, default
# ~/.cache/spillarena/venv-axolotl), not in the checkout, so a fresh clone on the same machine
# (CI) finds it built: only spillarena is reinstalled, never the 1.9 GB stack.
# Exit 77 when the first build cannot reach PyPI (nothing to test with); any other failure is 1.
#
# Note [Why axolotl lives in its own venv, installed with --no-deps]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# axolotl 0.21.0 declares Python >= 3.12 and pins transformers 5.20.1 and GPU-only packages
# (flash-attn, deepspeed, liger, ...). Its CPU training path needs none of the GPU ones and runs on
# 3.11, so it is installed without its declared dependencies; the HF stack at axolotl's pins and the
# modules it imports at run time are listed below instead. .venv keeps its own transformers: the
# two never share site-packages.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${SPILLARENA_AXOLOTL_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/spillarena/venv-axolotl}
python=${SPILLARENA_AXOLOTL_PYTHON:-python3.11}
torch_pin=torch==2.13.0  # the CPU wheel; an exact pin, or pip may fetch a CUDA build
hf_stack=(transformers==5.20.1 peft==0.21.2 trl==1.14.1 datasets==5.0.1 accelerate==1.15.0
  tokenizers==0.23.3)
runtime_imports=(colorama addict posthog pillow numba bitsandbytes fastcore evaluate wandb fire
  python-dotenv pyyaml pytest scikit-build-core)
no_deps=(axolotl==0.21.0 axolotl-contribs-lgpl axolotl-contribs-mit)
recipe=$(printf '%s\n' "$python" "$torch_pin" "${hf_stack[@]}" "${runtime_imports[@]}" "${no_deps[@]}")

log() { echo "axolotl_env: $*" >&2; }
# pip's output to stderr, less the warning it prints for every package this machine's extra
# (file://) indexes lack.
pip_install() {
  "$venv/bin/python" -m pip install -q "$@" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
}

exec 9>/tmp/spillarena-axolotl-env.lock  # one builder (and one spillarena install) at a time
flock 9

if [[ "$(cat "$venv/.recipe" 2>/dev/null)" != "$recipe" ]]; then
  if ! "$python" -c "import urllib.request as u; u.urlopen('https://pypi.org/simple/axolotl/', timeout=20)" \
      >/dev/null 2>&1; then
    log "skipped: $venv is not built and PyPI is unreachable (axolotl 0.21.0 and its HF stack come from there)"
    exit 77
  fi
  log "building $venv (first run: a few minutes)"
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
  pip_install "$torch_pin" "${hf_stack[@]}" "${runtime_imports[@]}"
  pip_install --no-deps --ignore-requires-python "${no_deps[@]}"
  echo "$recipe" >"$venv/.recipe"
fi

# spillarena: the wheel for this torch, reinstalled every time (a second with --no-deps), so the
# venv always runs this source (scripts/install_python_package.sh).
log "installing spillarena into $venv"
scripts/install_python_package.sh "$venv/bin/python" 2>&1 |
  { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
echo "$venv/bin/python"
