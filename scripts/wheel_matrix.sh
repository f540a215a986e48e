#!/usr/bin/env bash
# One spillarena wheel, unchanged, beside several torch releases (issue 38): the matrix.
#
#   scripts/wheel_matrix.sh WHEEL [TORCH_VERSION...]    # default versions: 2.11.0 2.13.0 2.15.0
#   scripts/wheel_matrix.sh --prepare [TORCH_VERSION...] # only make the virtualenvs (the downloads)
#
# For each version, a virtualenv of the python3 on PATH in
# ${SPILLARENA_MATRIX_CACHE:-~/.cache/spillarena-matrix}/venv-<version> holding torch==<version>,
# transformers==5.23.0, accelerate and pytest. It is made once and kept: it is reused while it
# holds that torch. The wheel then goes in with --no-deps --force-reinstall, but only after
# `pip install --dry-run --no-index` (no index, no find-links: nothing but what the venv holds)
# accepts its Requires-Dist; a refusal is that version's install FAIL, with pip's message. From a
# temp dir (so `import spillarena` is the installed package, never the source tree), timed:
#   smoke          4 Linear+GELU blocks through spillarena.checkpoint (default arena), gradients
#                  bitwise those of no checkpointing; "install to trained step" = wheel install +
#                  this (the issue's goal: < 30 s)
#   architectures  tests/python/test_non_reentrant.py's bitwise test (Llama, GPT-2, BERT, BART,
#                  T5, ViT from tiny configs) run by the venv's pytest
#   policy         tests/python/test_policy.py and test_offload.py (issue 51): the offload policy
#                  and offload() against that torch's own selective checkpoint and save_on_cpu
#   enable         spillarena.enable(model) without an arena on a tiny Llama, one optimizer step,
#                  gradients bitwise those of no checkpointing
#   trainer        a transformers Trainer, 4 steps on random tokens, spillarena.enable(model):
#                  losses and weights bitwise those of the same run without checkpointing
# Prints the table and writes it to docs/wheel_matrix.md; exits 1 when anything failed, 2 on a
# usage error. Logs: <cache>/logs/<version>/<check>.log.
#
# What making a venv takes, measured 2026-12-03 on the 2-core development VM (Python 3.11.7; "from
# the network" is eth0's bytes received meanwhile; the rest of the wheels came from this
# machine's local mirrors, /opt/wheels and /opt/pypi*), once per version since the venvs are kept:
#   2.11.0  CUDA 13 build, 61 packages, 2.8 GB of wheels: 1.26 GB from the network (1.79 GB
#           without the torch wheel, 531 MB, from SPILLARENA_MATRIX_FIND_LINKS); 140 s; venv 4.9 GiB
#   2.13.0  the local CPU wheel (/opt/wheels), 43 packages, 0.27 GB of wheels: 50 MB from the
#           network; 60 s; venv 1.2 GiB
#   2.15.0  CUDA 13 build, 62 packages, 3.1 GB of wheels: 2.66 GB from the network; 100 s;
#           venv 5.6 GiB
# All three: 4.0 GB from the network (4.5 GB without the local torch 2.11 wheel), 11.7 GiB on disk.
# (pip's cache is off for these installs: it would keep a second copy of every wheel.)
#
# Environment: SPILLARENA_MATRIX_CACHE (above); SPILLARENA_MATRIX_FIND_LINKS, directories (':'
# separated) whose torch-<version>-<python tag>-*.whl is installed instead of downloading it;
# PYTHON (default python3). PIP_CONSTRAINT=/dev/null is set for the torch install only: a
# machine-wide constraints file may cap torch below the versions asked for.
set -euo pipefail
export LC_NUMERIC=C # $EPOCHREALTIME and printf "%.1f" with a '.'

repo=$(cd "$(dirname "$0")/.." && pwd)
command_line="scripts/wheel_matrix.sh$(printf ' %q' "$@")"
usage() { sed -n '4,5p' "$0" | sed 's/^# //' >&2; exit 2; }

prepare_only=false
wheel_given=
case ${1:-} in
  '' | -h | --help) usage ;;
  --prepare) prepare_only=true; shift ;;
  -*) echo "wheel_matrix: unknown option '$1'" >&2; usage ;;
  *) wheel_given=$1; shift ;;
esac
versions=("$@")
((${#versions[@]})) || versions=(2.11.0 2.13.0 2.15.0)

python=${PYTHON:-python3}
cache=${SPILLARENA_MATRIX_CACHE:-$HOME/.cache/spillarena-matrix}
extras=(transformers==5.23.0 accelerate pytest)
check_timeout_s=1200

log() { echo "wheel_matrix: $*" >&2; }
seconds_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

mkdir -p "$cache"
work=$(mktemp -d "${TMPDIR:-/tmp}/wheel-matrix.XXXXXX")
trap 'rm -rf "$work"' EXIT

python_version=$("$python" -c 'import platform; print(platform.python_version())')
python_tag=$("$python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')

# The wheel is copied first: a build running meanwhile may replace the file.
wheel=
if [[ -n $wheel_given ]]; then
  [[ -f $wheel_given ]] || { log "no wheel at '$wheel_given'"; exit 2; }
  mkdir "$work/wheel"
  wheel=$work/wheel/$(basename "$wheel_given")
  cp "$wheel_given" "$wheel"
  wheel_sha256=$(sha256sum "$wheel" | cut -d' ' -f1)
  wheel_requires=$("$python" - "$wheel" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(name).decode().splitlines()
print(", ".join(l.split(":", 1)[1].strip() for l in lines
                if l.startswith("Requires-Dist:") and "extra ==" not in l) or "nothing")
PY
)
  log "wheel $(basename "$wheel") (sha256 ${wheel_sha256:0:16}...), requires: $wheel_requires"
fi

# ---------------------------------------------------------------------------------------------
# The virtualenvs
# ---------------------------------------------------------------------------------------------

installed_torch() { # the torch version a venv holds ("" when none)
  "$1/bin/python" -c 'from importlib.metadata import version; print(version("torch"))' \
    2>/dev/null || true
}

torch_requirement() { # a local wheel of SPILLARENA_MATRIX_FIND_LINKS, else torch==VERSION
  local dir found
  local -a dirs
  IFS=: read -r -a dirs <<<"${SPILLARENA_MATRIX_FIND_LINKS:-}"
  for dir in "${dirs[@]}"; do
    found=$(compgen -G "$dir/torch-$1-$python_tag-$python_tag-*.whl" | head -n 1 || true)
    [[ -n $found ]] && { echo "$found"; return; }
  done
  echo "torch==$1"
}

# Sets venv_cell; returns 1 when the venv could not be made.
ensure_venv() {
  local version=$1 venv=$2 marker=$2/.wheel-matrix start have spec
  spec="torch==$version ${extras[*]}"
  have=$(installed_torch "$venv")
  if [[ -f $marker && $(<"$marker") == "$spec" && ${have%%+*} == "$version" ]]; then
    venv_cell="cached"
    return 0
  fi
  start=$EPOCHREALTIME
  log "torch $version: making $venv ($(df -h --output=avail "$cache" | tail -n 1 | tr -d ' ')" \
    "free; a CUDA build of torch downloads several GB)"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  if ! PIP_CONSTRAINT=/dev/null "$venv/bin/python" -m pip install --no-cache-dir \
    --progress-bar off "$(torch_requirement "$version")" "${extras[@]}" \
    >"$logs/venv.log" 2>&1; then
    venv_cell="FAIL $(seconds_since "$start")"
    notes+=("torch $version, venv: pip failed: $(grep -m 2 '^ERROR' "$logs/venv.log" |
      tr '\n' ' ')(log: $logs/venv.log)")
    return 1
  fi
  have=$(installed_torch "$venv")
  if [[ ${have%%+*} != "$version" ]]; then
    venv_cell="FAIL $(seconds_since "$start")"
    notes+=("torch $version, venv: pip installed torch '$have'")
    return 1
  fi
  echo "$spec" >"$marker"
  venv_cell="new $(seconds_since "$start") s, $(du -sh "$venv" | cut -f1)"
  log "torch $version: venv ready, torch $have: $venv_cell"
}

# ---------------------------------------------------------------------------------------------
# The wheel and the checks
# ---------------------------------------------------------------------------------------------

# pip sees only the venv and the wheel: no index, no find-links from the environment or from
# pip's configuration files. A wheel that needs another torch is refused, never "fixed" by
# installing that torch.
isolated_pip() {
  local venv=$1
  shift
  env -u PIP_FIND_LINKS -u PIP_CONSTRAINT -u PIP_EXTRA_INDEX_URL -u PIP_INDEX_URL \
    PIP_CONFIG_FILE=/dev/null "$venv/bin/python" -m pip "$@"
}

# Sets cell[$version,install]; returns 1 on a refusal.
install_wheel() {
  local version=$1 venv=$2 start=$EPOCHREALTIME would refusal why
  isolated_pip "$venv" uninstall -y -q spillarena >/dev/null 2>&1 || true
  if ! isolated_pip "$venv" install --dry-run --no-index "$wheel" >"$logs/install.log" 2>&1; then
    refusal=$(grep '^ERROR' "$logs/install.log" | tr '\n' ' ' | sed 's/ $//')
    refusal=${refusal:-see $logs/install.log}
    cell[$version,install]="FAIL $(seconds_since "$start")"
    why="pip refuses the wheel (it requires $wheel_requires)"
    notes+=("torch $version, install: $why: \`$refusal\`")
    log "torch $version: $why: $refusal"
    return 1
  fi
  would=$(sed -n 's/^Would install //p' "$logs/install.log")
  if [[ $would != spillarena-* || $would == *' '* ]]; then
    cell[$version,install]="FAIL $(seconds_since "$start")"
    notes+=("torch $version, install: pip would install more than the wheel: \`$would\`")
    return 1
  fi
  if ! isolated_pip "$venv" install --no-index --no-deps --force-reinstall "$wheel" \
    >>"$logs/install.log" 2>&1; then
    cell[$version,install]="FAIL $(seconds_since "$start")"
    notes+=("torch $version, install: $(grep -m 1 '^ERROR' "$logs/install.log")")
    return 1
  fi
  cell[$version,install]="PASS $(seconds_since "$start")"
}

# run_check VERSION NAME COMMAND...: in $work, timed, logged; sets cell[VERSION,NAME].
run_check() {
  local version=$1 name=$2 start=$EPOCHREALTIME rc=0 first_error
  shift 2
  (cd "$work" && env -u PYTHONPATH SPILLARENA_MATRIX_REPO="$repo" \
    timeout "$check_timeout_s" "$@") >"$logs/$name.log" 2>&1 || rc=$?
  if ((rc == 0)); then
    cell[$version,$name]="PASS $(seconds_since "$start")"
  else
    cell[$version,$name]="FAIL $(seconds_since "$start")"
    first_error=$(grep -E -m 1 'Error|assert|FAILED' "$logs/$name.log" ||
      tail -n 1 "$logs/$name.log")
    notes+=("torch $version, $name: exit $rc: \`$first_error\` (log: $logs/$name.log)")
    log "torch $version: $name FAILED (exit $rc); the end of $logs/$name.log:"
    tail -n 15 "$logs/$name.log" >&2
  fi
  log "torch $version: $name ${cell[$version,$name]} s"
}

cat >"$work/matrix_checks.py" <<'PY'
"""The matrix's inline checks: smoke, enable, trainer (python matrix_checks.py NAME)."""
import os
import sys

import torch

import spillarena

REPO = os.environ["SPILLARENA_MATRIX_REPO"]
assert "site-packages" in spillarena.__file__ and not spillarena.__file__.startswith(REPO), (
    f"spillarena imported from {spillarena.__file__}, not from the installed wheel")
print(f"spillarena {spillarena.__version__} from {spillarena.__file__}; torch {torch.__version__}")
torch.set_num_threads(min(2, os.cpu_count() or 1))


def assert_bitwise(got, want):
    assert got.keys() == want.keys(), sorted(set(got) ^ set(want))
    differ = [n for n in want if not torch.equal(got[n], want[n])]
    assert differ == [], f"not bitwise: {differ}"


def smoke():
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU()) for _ in range(4)]
    x0 = torch.randn(32, 256)

    def step(checkpointed):
        for b in blocks:
            b.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_(True)
        h = x
        for b in blocks:
            h = spillarena.checkpoint(b, h) if checkpointed else b(h)
        h.pow(2).mean().backward()
        grads = {f"{i}.{n}": p.grad.clone() for i, b in enumerate(blocks)
                 for n, p in b.named_parameters()}
        grads["input"] = x.grad.clone()
        return grads

    reference = step(False)
    assert_bitwise(step(True), reference)
    stats = spillarena.default_arena().stats()
    assert stats["allocations"] >= 3 and stats["bytes_written"] > 0, stats
    print("smoke: 4 checkpointed blocks, gradients bitwise; arena", stats["bytes_written"],
          "bytes written")


def tiny_llama(transformers):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attention_dropout=0.1)
    config._attn_implementation = "eager"
    return transformers.LlamaForCausalLM(config).train()


def enable():
    import transformers

    model = tiny_llama(transformers)
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))

    def step():
        model.zero_grad(set_to_none=True)
        torch.manual_seed(7)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    ref_loss, reference = step()
    spillarena.enable(model)
    loss, grads = step()
    assert torch.equal(loss, ref_loss), (loss, ref_loss)
    assert_bitwise(grads, reference)
    torch.optim.AdamW(model.parameters(), lr=1e-3).step()
    stats = spillarena.arena_of(model).stats()
    # keep_last=1 (the default): the last layer's input stays in memory
    assert stats["allocations"] == 2 and stats["bytes_written"] > 0, stats
    print("enable: loss", loss.item(), "gradients bitwise; arena", stats)


def trainer():
    import transformers

    class RandomTokens(torch.utils.data.Dataset):
        def __init__(self):
            self.ids = torch.randint(0, 256, (16, 32), generator=torch.Generator().manual_seed(3))

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    class LossRecordingTrainer(transformers.Trainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.losses = []

        def compute_loss(self, model, inputs, *args, **kwargs):
            loss = super().compute_loss(model, inputs, *args, **kwargs)
            self.losses.append((loss[0] if isinstance(loss, tuple) else loss).detach().clone())
            return loss

    def train(spill, out):
        model = tiny_llama(transformers)
        if spill:
            spillarena.enable(model)
        args = transformers.TrainingArguments(
            output_dir=out, max_steps=4, per_device_train_batch_size=4, learning_rate=3e-3,
            logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, seed=0,
            dataloader_num_workers=0, disable_tqdm=True)
        t = LossRecordingTrainer(model=model, args=args, train_dataset=RandomTokens())
        t.train()
        weights = {n: p.detach().clone() for n, p in model.named_parameters()}
        return torch.stack(t.losses), weights, model

    import tempfile

    with tempfile.TemporaryDirectory() as out:
        ref_losses, ref_weights, _ = train(False, out)
        losses, weights, model = train(True, out)
    assert len(losses) == 4 and torch.equal(losses, ref_losses), (losses, ref_losses)
    assert_bitwise(weights, ref_weights)
    stats = spillarena.arena_of(model).stats()
    assert stats["allocations"] == 4 * 2 and stats["bytes_written"] > 0, stats  # keep_last=1
    print("trainer: losses", losses.tolist(), "bitwise; arena", stats)


{"smoke": smoke, "enable": enable, "trainer": trainer}[sys.argv[1]]()
PY

# pytest -p matrix_site_check: stops the run unless spillarena is the installed wheel.
cat >"$work/matrix_site_check.py" <<'PY'
import os

import pytest


def pytest_configure(config):
    import spillarena

    repo = os.environ["SPILLARENA_MATRIX_REPO"]
    if "site-packages" not in spillarena.__file__ or spillarena.__file__.startswith(repo):
        raise pytest.UsageError(f"spillarena imported from {spillarena.__file__}, not the wheel")


def pytest_report_header(config):
    import spillarena
    import torch

    return (f"spillarena {spillarena.__version__} from {spillarena.__file__}; "
            f"torch {torch.__version__}")
PY

architectures_test=tests/python/test_non_reentrant.py
architectures_test+=::test_bitwise_as_torchs_own_non_reentrant_checkpointing
policy_tests=(tests/python/test_policy.py tests/python/test_offload.py)

# ---------------------------------------------------------------------------------------------
# The matrix
# ---------------------------------------------------------------------------------------------

checks=(smoke architectures policy enable trainer)
declare -A cell=()
notes=()
failed=0
for version in "${versions[@]}"; do
  venv=$cache/venv-$version
  logs=$cache/logs/$version
  mkdir -p "$logs"
  cell[$version,install]="—"
  cell[$version,to_step]="—"
  for check in "${checks[@]}"; do cell[$version,$check]="—"; done
  if ! ensure_venv "$version" "$venv"; then
    cell[$version,venv]=$venv_cell
    failed=1
    continue
  fi
  cell[$version,venv]=$venv_cell
  $prepare_only && continue

  install_start=$EPOCHREALTIME
  if ! install_wheel "$version" "$venv"; then
    failed=1
    continue
  fi
  run_check "$version" smoke "$venv/bin/python" matrix_checks.py smoke
  [[ ${cell[$version,smoke]} == PASS* ]] && cell[$version,to_step]=$(seconds_since "$install_start")
  run_check "$version" architectures "$venv/bin/python" -m pytest -p no:cacheprovider \
    -p matrix_site_check -c /dev/null --rootdir "$work" --confcutdir "$repo/tests/python" \
    "$repo/$architectures_test"
  run_check "$version" policy "$venv/bin/python" -m pytest -p no:cacheprovider \
    -p matrix_site_check -c /dev/null --rootdir "$work" --confcutdir "$repo/tests/python" \
    "${policy_tests[@]/#/$repo/}"
  run_check "$version" enable "$venv/bin/python" matrix_checks.py enable
  run_check "$version" trainer "$venv/bin/python" matrix_checks.py trainer
  for check in install "${checks[@]}"; do
    [[ ${cell[$version,$check]} == PASS* ]] || failed=1
  done
done

if $prepare_only; then
  for version in "${versions[@]}"; do
    echo "torch $version: ${cell[$version,venv]} ($cache/venv-$version)"
  done
  exit "$failed"
fi

table() {
  echo "| torch | venv | install | smoke | architectures | policy | enable | trainer |" \
    "install to trained step |"
  echo "|---|---|---|---|---|---|---|---|---|"
  local version check row
  for version in "${versions[@]}"; do
    row="| $version | ${cell[$version,venv]}"
    for check in install "${checks[@]}"; do
      row+=" | ${cell[$version,$check]}"
    done
    row+=" | ${cell[$version,to_step]}"
    [[ ${cell[$version,to_step]} != "—" ]] && row+=" s"
    echo "$row |"
  done
}

echo
table
if ((${#notes[@]})); then
  echo
  printf -- '- %s\n' "${notes[@]}"
fi

doc=$repo/docs/wheel_matrix.md
{
  cat <<EOF
# One wheel beside every torch: the matrix

Issue 38: one spillarena wheel should work, unchanged, beside every torch release from 2.11 on.
\`scripts/wheel_matrix.sh\` puts one wheel file into a cached virtualenv per torch version: pip,
shown nothing but that venv (no index), must accept the wheel's requirements, then the wheel is
installed with \`--no-deps\`. From a temp directory, so that the installed package is the one
imported, it then runs: a 4-block MLP through \`spillarena.checkpoint\`, gradients bitwise those
of no checkpointing (\`smoke\`); the bitwise test on Llama, GPT-2, BERT, BART, T5 and ViT from
tiny configs (\`tests/python/test_non_reentrant.py\`, \`architectures\`); the offload policy
and \`spillarena.offload\` against that torch's own selective checkpoint and \`save_on_cpu\`
(\`tests/python/test_policy.py\`, \`test_offload.py\`, \`policy\`);
\`spillarena.enable(model)\` with no arena on a tiny Llama, one step (\`enable\`); a transformers
\`Trainer\` run with spillarena enabled, bitwise against the same run without checkpointing
(\`trainer\`). Cells are PASS/FAIL and seconds; "install to trained step" is the wheel's install
plus the smoke step (goal: under 30 s). The script regenerates this file.

- date: $(date -u +%F)
- wheel: \`$(basename "$wheel")\` (requires ${wheel_requires}; sha256 \`$wheel_sha256\`)
- python: $python_version; $(nproc) cores; the checks run on the CPU
- command: \`$command_line\`

EOF
  table
  if ((${#notes[@]})); then
    printf '\nFailures:\n\n'
    printf -- '- %s\n' "${notes[@]}"
  fi
} >"$doc.tmp"
mv "$doc.tmp" "$doc"
log "wrote ${doc#"$repo"/}"
exit "$failed"
