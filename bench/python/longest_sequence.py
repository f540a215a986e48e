"""The largest sequence length that trains in a fixed device memory, per activation strategy.

    python bench/python/longest_sequence.py --device cuda --out longest_sequence.json
    python bench/python/longest_sequence.py --device cuda --device-memory-gb 24 --layers 16 \
        --modes recompute,spillarena_direct --out longest_sequence.json
    python bench/python/longest_sequence.py --device cpu --smoke --out /tmp/longest_smoke.json

The GPU emulates a smaller card: torch.cuda.set_per_process_memory_fraction(24e9 / total memory)
caps PyTorch's allocator at --device-memory-gb (memory outside PyTorch's allocator, such as the
CUDA context or cuFile buffers, is not capped). The model is a Hugging Face LlamaForCausalLM built
from a config with random weights (nothing is downloaded): Llama-3-8B width (hidden 4096,
intermediate 14336, 32 heads, 8 KV heads), --layers 16, bf16, batch 1 and a small vocabulary
(1024) so that the logits do not dominate. Weights and their gradients stay on the device (no
optimizer state), so what is left of the budget is what activations may use.

Modes: none (no checkpointing), recompute (transformers' gradient checkpointing: every layer's
input stays on the device), spillarena_direct (spillarena.enable with an O_DIRECT arena: layer
inputs go to disk), spillarena_gds (io="gds"; where libcufile does not load, the mode is skipped
before any trial, with spillarena.GdsUnavailableError's message: the library searched and how to
install it; where cuFile loads but the arena still cannot be made, the first trial skips it).
Skipped is not a failure.

A trial is one fresh process that builds the model and runs --steps (2) training steps (forward,
loss, backward; gradients kept) at one sequence length: ok, oom (torch.OutOfMemoryError), error
(a spillarena error, with its message), or crash/timeout. Per mode the search doubles the
sequence from --start-seq until a trial fails, then bisects between the last ok and the first
failure down to --granularity tokens, capped at --max-seq (a mode that reaches the cap is marked
capped: its length is a lower bound). No trial starts after --deadline-s; the JSON is rewritten
after every trial, so a run cut short still leaves what it found.

The goal: a spilling mode trains a sequence at least GOAL (1.5) times as long as recompute does
in the same device memory (ratio_vs_recompute >= 1.5), which is the point of moving the saved
layer inputs off the device.

--device cpu --smoke runs the same code on the CPU with a tiny model (hidden 64, 2 layers,
sequences up to 512) and a fake budget: a trial counts as oom when its peak RSS growth during the
steps (VmHWM) exceeds --cpu-budget-mb. It checks the search, the subprocesses and the JSON, not
memory behaviour.
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import boundary_search
import h2h_support  # write_report

MODES = ("none", "recompute", "spillarena_direct", "spillarena_gds")
SPILLING = ("spillarena_direct", "spillarena_gds")
GOAL = 1.5

# Model and search defaults: the real run, and the CPU smoke run (--smoke). Explicit flags win.
FULL = dict(layers=16, hidden=4096, heads=32, kv_heads=8, intermediate=14336,
            start_seq=2048, granularity=1024, max_seq=262144)
SMOKE = dict(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=224,
             start_seq=256, granularity=128, max_seq=512)
CHILD_SETTINGS = ("device", "dtype", "layers", "hidden", "heads", "kv_heads", "intermediate",
                  "vocab", "batch", "steps", "device_memory_gb", "cpu_budget_mb")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--smoke", action="store_true",
                   help="tiny model and sequences (with --device cpu: fake budget)")
    p.add_argument("--device-memory-gb", type=float, default=24.0,
                   help="device memory to emulate (1e9 bytes)")
    p.add_argument("--cpu-budget-mb", type=float, default=22.0,
                   help="CPU smoke: peak RSS growth counted as oom")
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    for name in FULL:
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None,
                       help=f"default {FULL[name]} ({SMOKE[name]} with --smoke)")
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--spill-dir", default=None,
                   help="default: spillarena.default_spill_directory()")
    p.add_argument("--trial-timeout-s", type=float, default=600.0)
    p.add_argument("--deadline-s", type=float, default=1140.0,
                   help="start no trial after this many seconds")
    p.add_argument("--out", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--seq", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name, value in (SMOKE if args.smoke else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    check_args(p, args)
    return args


def check_args(p, args):
    for name in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab", "batch", "steps",
                 "start_seq", "granularity", "max_seq"):
        if not 1 <= getattr(args, name) <= 1 << 22:
            p.error(f"--{name.replace('_', '-')} must be between 1 and {1 << 22}")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        p.error("--hidden must be a multiple of --heads, and --heads of --kv-heads")
    if args.start_seq > args.max_seq:
        p.error("--start-seq must not exceed --max-seq")
    if args.device_memory_gb <= 0 or args.cpu_budget_mb <= 0:
        p.error("--device-memory-gb and --cpu-budget-mb must be positive")
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        p.error(f"unknown mode(s) {sorted(unknown)}; choose from {','.join(MODES)}")


# ---------------------------------------------------------------------------------------------
# The trial (child process): one model, one sequence length, --steps training steps.


def proc_status_kib(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def reset_peak_rss():
    """Resets VmHWM to the current RSS (Linux >= 4.0); returns the RSS in bytes."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        pass  # then the growth is measured against the peak so far: an overestimate
    return proc_status_kib("VmRSS") * 1024


def cap_device_memory(args, torch):
    device = torch.device(args.device)
    device = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = min(1.0, args.device_memory_gb * 1e9 / total)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return {"device_name": torch.cuda.get_device_name(device), "total_memory_bytes": total,
            "memory_fraction": fraction, "budget_bytes": int(fraction * total)}


def versions(torch, spillarena):
    import transformers

    return {
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "transformers": transformers.__version__, "spillarena": spillarena.__version__
    }


def build_model(args, seq, torch):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                         intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         max_position_embeddings=seq, attention_dropout=0.0, use_cache=False)
    torch.manual_seed(0)
    with torch.device(args.device):  # weights initialised where they live, in their dtype
        model = LlamaForCausalLM._from_config(config, dtype=getattr(torch, args.dtype))
    model.train()
    return model


def make_arena(args, mode, seq, torch, spillarena):
    """The arena for one step's layer inputs, plus one input of slack."""
    shape = (args.batch, seq, args.hidden)
    dtype = getattr(torch, args.dtype)
    capacity = spillarena.bytes_for_layer_inputs(args.layers, shape, dtype) + \
        spillarena.bytes_for_layer_input(shape, dtype)
    io = "gds" if mode == "spillarena_gds" else "direct"
    return spillarena.SpillArena(capacity, args.spill_dir, io=io, keep_last=0)


def prepare(args, mode, seq, model, torch, spillarena):
    """Turns on the mode's checkpointing; returns the arena (None without one)."""
    if mode == "recompute":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if mode not in SPILLING:
        return None
    arena = make_arena(args, mode, seq, torch, spillarena)
    spillarena.enable(model, arena)
    return arena


def train_steps(args, model, ids, torch, result):
    """--steps forward/loss/backward steps; gradients accumulate (no optimizer, nothing freed)."""
    cuda = args.device.startswith("cuda")
    for _ in range(args.steps):
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if cuda:
            torch.cuda.synchronize()
        result["step_ms"].append(round((time.perf_counter() - start) * 1e3, 1))
        result["losses"].append(loss.item())


def classify(error, torch, spillarena):
    """'oom', 'error' (spillarena) or None (anything else: the trial crashes)."""
    if isinstance(error, spillarena.Error):
        return "error"
    if isinstance(error, torch.OutOfMemoryError):
        return "oom"
    text = str(error)
    if isinstance(error, RuntimeError) and ("out of memory" in text or "ALLOC_FAILED" in text):
        return "oom"  # cuBLAS/cuDNN workspaces that hit the cap surface as RuntimeError
    return None


def first_line(error, limit=400):
    text = f"{type(error).__name__}: {error}".strip()
    return text.splitlines()[0][:limit] if text else type(error).__name__


def run_trial(args):
    import torch

    import spillarena

    mode, seq = args.child, args.seq
    result = {"seq": seq, "status": "ok", "step_ms": [], "losses": [], "message": None}
    env = (cap_device_memory(args, torch) if args.device.startswith("cuda")
           else {"device_name": "cpu"})
    env.update(versions(torch, spillarena))
    arena, baseline = None, reset_peak_rss()
    try:
        model = build_model(args, seq, torch)
        result["weights_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
        try:
            arena = prepare(args, mode, seq, model, torch, spillarena)
        except spillarena.Error as e:
            if mode != "spillarena_gds" or isinstance(e, spillarena.InsufficientSpaceError):
                raise
            result.update(status="skipped", message=first_line(e))  # no cuFile / GDS here
            return result, env
        torch.manual_seed(1)
        ids = torch.randint(0, args.vocab, (args.batch, seq), device=args.device)
        baseline = reset_peak_rss()
        train_steps(args, model, ids, torch, result)
    except Exception as e:  # sorted by classify; anything unexpected re-raises
        status = classify(e, torch, spillarena)
        if status is None:
            raise
        result.update(status=status, message=first_line(e))
    record_peaks(args, result, baseline, torch)
    if arena is not None:
        result["io"] = {
            k: arena.stats()[k] for k in ("io_mode", "io_backend", "io_note", "bytes_written")
        }
    return result, env


def record_peaks(args, result, baseline, torch):
    """Device peak on CUDA; on the CPU the RSS growth, judged against the fake budget."""
    if args.device.startswith("cuda"):
        result["peak_bytes"] = torch.cuda.max_memory_allocated()
        result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        return
    growth = proc_status_kib("VmHWM") * 1024 - baseline
    result["peak_bytes"] = growth
    budget = args.cpu_budget_mb * 2**20
    if result["status"] == "ok" and growth > budget:
        result["status"] = "oom"
        result["message"] = (f"emulated: peak RSS growth {growth / 2**20:.1f} MiB"
                             f" > budget {args.cpu_budget_mb} MiB")


# ---------------------------------------------------------------------------------------------
# The search (parent process).


class Runner(boundary_search.TrialClock):
    """Starts trials as fresh processes and keeps the clock for --deadline-s."""

    def __init__(self, args, spill_dir):
        super().__init__(args.deadline_s)
        self.args, self.spill_dir = args, spill_dir
        self.env = None

    def trial(self, mode, seq):
        argv = [f"--{name.replace('_', '-')}={getattr(self.args, name)}" for name in CHILD_SETTINGS]
        cmd = [sys.executable, os.path.abspath(__file__), *argv, "--spill-dir", self.spill_dir,
               "--child", mode, "--seq", str(seq)] + (["--smoke"] if self.args.smoke else [])
        timeout = self.timeout(self.args.trial_timeout_s)
        start = time.monotonic()
        done, cause = self.run_process(cmd, timeout)
        result = parse_child(done, seq) if done else \
            {"seq": seq, "status": "timeout",
             "message": f"no result within {timeout:.0f} s ({cause})"}
        result["trial_s"] = round(time.monotonic() - start, 1)
        return result


def parse_child(done, seq):
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        try:
            return json.loads(lines[-1])
        except json.JSONDecodeError:
            pass
    tail = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
    return {"seq": seq, "status": "crash", "message": f"exit {done.returncode}: {tail[0][:400]}"}


def new_state(skipped=None):
    return {
        "largest_ok_seq": None, "capped": False, "incomplete": False, "skipped": skipped,
        "trials": []
    }


def gds_unavailable(spill_dir):
    """Why io="gds" cannot run here (GdsUnavailableError's first line), or None. Asked once in the
    parent with a 1 MiB arena, so that no trial builds a model to find out."""
    import spillarena

    try:
        spillarena.SpillArena(1 << 20, spill_dir, io="gds")
    except spillarena.GdsUnavailableError as e:
        return first_line(e)
    except spillarena.Error:
        return None  # not cuFile's doing: the trials report it
    return None


def search(mode, runner, on_trial):
    """Doubling from --start-seq to the first failure, then bisection to --granularity
    (boundary_search.bisect_boundary, below --start-seq too)."""
    args = runner.args
    state = new_state()

    def attempt(seq, repeat=False):
        if runner.time_left() <= 0:
            state["incomplete"] = True
            return None
        result = runner.trial(mode, seq)
        runner.env = runner.env or result.pop("env", None)
        result.pop("env", None)
        state["trials"].append(result)
        if result["status"] == "ok":
            state["largest_ok_seq"] = max(seq, state["largest_ok_seq"] or 0)
        on_trial(mode, state)
        if result["status"] == "skipped":
            state["skipped"] = result["message"]
            return None
        if result["status"] == "timeout" and runner.time_left() <= 0:
            state["incomplete"] = True
            return None
        return result["status"] == "ok"

    found = boundary_search.bisect_boundary(attempt, args.start_seq, args.granularity,
                                            args.max_seq, below_start=True)
    state["capped"] = found["capped"]
    return state


def summarize(args, runner, results):
    base = (results.get("recompute") or {}).get("largest_ok_seq")
    for mode, state in results.items():
        seq = state["largest_ok_seq"]
        state["ratio_vs_recompute"] = round(seq / base, 3) if seq and base else None
        if mode in SPILLING:
            ratio = state["ratio_vs_recompute"]
            state["meets_goal"] = None if ratio is None else ratio >= GOAL
    settings = {k: v for k, v in vars(args).items() if k not in ("child", "seq")}
    settings["pytorch_cuda_alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    settings["environment"] = runner.env
    settings["peak_bytes_means"] = (
        "torch.cuda.max_memory_allocated (weights and grads included)"
        if args.device.startswith("cuda") else
        "host peak RSS growth during the steps (VmHWM), the fake budget")
    return {"settings": settings, "goal": GOAL,
            "goal_met": {m: results[m]["meets_goal"] for m in SPILLING if m in results},
            "modes": results}


def budget_line(settings):
    env = settings["environment"] or {}
    if settings["device"].startswith("cuda"):
        return (
            f"budget {settings['device_memory_gb']:g} GB of {env.get('device_name', '?')}"
            f" (memory fraction {env.get('memory_fraction', 0):.3f}); {settings['layers']} layers,"
            f" hidden {settings['hidden']}, {settings['dtype']}, batch {settings['batch']}")
    return (
        f"CPU smoke: fake budget of {settings['cpu_budget_mb']:g} MiB peak RSS growth; tiny model."
        " Plumbing only: these lengths and ratios say nothing about memory.")


def table(report):
    header = (
        f"{'mode':18s} {'largest ok seq':>14s} {'vs recompute':>12s} {'goal ' + str(GOAL):>9s}"
        f" {'trials':>6s} {'peak at largest':>16s} {'step ms':>9s}")
    rows = [budget_line(report["settings"]), header]
    for mode, state in report["modes"].items():
        if state["skipped"]:
            rows.append(f"{mode:18s} skipped: {state['skipped'][:120]}")
            continue
        seq, ratio = state["largest_ok_seq"], state["ratio_vs_recompute"]
        best = next((t for t in state["trials"] if t["seq"] == seq and t["status"] == "ok"), {})
        peak, step = best.get("peak_bytes"), (best.get("step_ms") or [None])[-1]
        goal = {True: "met", False: "missed", None: "-"}[state.get("meets_goal")]
        note = " (capped)" if state["capped"] else " (incomplete)" if state["incomplete"] else ""
        rows.append(
            f"{mode:18s} {seq or '-':>14} {(f'{ratio:.2f}x' if ratio else '-'):>12s} {goal:>9s}"
            f" {len(state['trials']):6d} {(f'{peak / 2**20:.1f} MiB' if peak else '-'):>16s}"
            f" {(f'{step:.0f}' if step else '-'):>9s}{note}")
    return "\n".join(rows)


def run_searches(args, runner):
    """Every mode's search; the report is rewritten after each trial, a progress line on stderr."""
    results = {}

    def on_trial(mode, state):
        results[mode] = state
        t = state["trials"][-1]
        peak = f"{t['peak_bytes'] / 2**20:10.1f} MiB" if t.get("peak_bytes") else ""
        print(f"  {mode:18s} seq {t['seq']:7d} {t['status']:8s} {peak} {t.get('trial_s', '')} s",
              file=sys.stderr, flush=True)
        h2h_support.write_report(args.out, summarize(args, runner, dict(results)))

    for mode in args.modes.split(","):
        reason = gds_unavailable(runner.spill_dir) if mode == "spillarena_gds" else None
        if reason:
            print(f"  {mode:18s} skipped: {reason}", file=sys.stderr, flush=True)
            results[mode] = new_state(skipped=reason)
            h2h_support.write_report(args.out, summarize(args, runner, dict(results)))
            continue
        results[mode] = search(mode, runner, on_trial)
    return summarize(args, runner, results)


def check_device(args):
    """None when the run can go ahead, else the reason it cannot."""
    if not args.device.startswith("cuda"):
        return None if args.smoke else (
            f"--device {args.device} has no device memory to fill; this benchmark needs CUDA. "
            "For a check of the search and plumbing on the CPU, pass --device cpu --smoke.")
    import torch

    if not torch.cuda.is_available():
        return (
            "CUDA is not available (torch.cuda.is_available() is False): the longest-sequence "
            "benchmark needs a GPU. For a CPU check of the plumbing, pass --device cpu --smoke.")
    return None


def main(argv):
    args = parse_args(argv)
    if args.child:
        result, env = run_trial(args)
        result["env"] = env
        print(json.dumps(result))
        return 0
    reason = check_device(args)
    if reason:
        print(f"longest_sequence: {reason}", file=sys.stderr)
        return 2
    import spillarena  # only for the default spill directory (never tmpfs)

    args.spill_dir = args.spill_dir or spillarena.default_spill_directory()
    with tempfile.TemporaryDirectory(prefix="spillarena-longest-", dir=args.spill_dir) as spill:
        report = run_searches(args, Runner(args, spill))
    h2h_support.write_report(args.out, report)
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
