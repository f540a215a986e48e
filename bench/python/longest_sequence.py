"""The longest sequence that trains in a fixed device memory, per activation strategy, with the
step time and host RSS at that length: the second of issue 50's GPU calls (gpu-check.sh 2).

    python bench/python/longest_sequence.py --device cuda --out longest_sequence.json
    python bench/python/longest_sequence.py --device cuda --device-memory-gb 24 --layers 16 \
        --modes hf_checkpointing,spillarena_direct --out longest_sequence.json
    python bench/python/longest_sequence.py --device cpu --smoke --out /tmp/longest_smoke.json

The GPU emulates a smaller card: torch.cuda.set_per_process_memory_fraction(24e9 / total memory)
caps PyTorch's allocator at --device-memory-gb (memory outside PyTorch's allocator, such as the
CUDA context or cuFile buffers, is not capped). The model is a Hugging Face LlamaForCausalLM built
from a config with random weights (nothing is downloaded): Llama-3-8B width (hidden 4096,
intermediate 14336, 32 heads, 8 KV heads), --layers 16, bf16, batch 1 and a small vocabulary
(1024) so that the logits do not dominate. Weights and their gradients stay on the device (no
optimizer state), so what is left of the budget is what activations may use.

Modes:
  none               no checkpointing
  hf_checkpointing   transformers' activation checkpointing (every layer's input on the device)
  hf_offload         the same with transformers' offload=True (transformers >= 5:
                     activation_checkpointing_enable(offload=True) wraps
                     torch.autograd.graph.save_on_cpu(pin_memory=True) around each layer's
                     checkpoint, so the inputs it keeps go to pinned host memory)
  spillarena_direct  spillarena.enable with an O_DIRECT arena (inputs on disk)
  spillarena_attention  the same with policy=spillarena.ATTENTION_OPS (issue 51): attention's
                     outputs to the disk too, read back instead of recomputed
  spillarena_gds     io="gds"; where libcufile does not load, skipped before any trial with
                     spillarena.errors.GdsUnavailableError's message (skipped is not a failure)
Each trial records which checkpoint function transformers installed (checkpoint_function), so a
transformers without offload cannot pass for one that has it.

A trial is one fresh process that builds the model and runs --steps (2) training steps (forward,
loss, backward; gradients kept) at one sequence length: ok, oom (torch.OutOfMemoryError), error
(a spillarena error, with its message), or crash/timeout. It reports each step's time (the last
is the step time: the first warms kernels and pinned memory), the allocator's peak, and host RSS:
the process's peak (VmHWM) and its growth during the steps. Per mode the search (search_length)
tries --start-seq and twice it, fits the device peak as a line in the sequence length through
the two longest lengths that trained, and tries the length the line says fills the budget,
refining from each result (a bisection step after two failures in a row) until the longest ok
and the shortest failure are --granularity apart; capped at --max-seq (a mode that reaches it is
marked capped: its length is a lower bound). Then, for each pair of compare_pairs, both modes at
the same length (the shorter of their longest) if one has not trained there: the step time per
token and the host RSS of spillarena against transformers' at equal work. No trial starts after
--deadline-s; the JSON is rewritten after every trial, so a run cut short still leaves what it
found. The report carries its date and the commit measured.

Goals (issue 50): a spilling mode trains a sequence at least GOAL (1.5) times as long as
hf_checkpointing in the same device memory, at no more than 1.15x its step time per token, with
host RSS below hf_offload's at the same length.

--device cpu --smoke runs the same code on the CPU with a tiny model (hidden 64, 2 layers,
sequences up to 512) and a fake budget: a trial counts as oom when its peak RSS growth during the
steps (VmHWM) exceeds --cpu-budget-mb. It checks the search, the subprocesses and the JSON, not
memory behaviour.
"""

import argparse
import datetime
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_args
from provenance import commit_of

import boundary_search
import h2h_support  # write_report

MODES = ("none", "hf_checkpointing", "hf_offload", "spillarena_direct", "spillarena_attention",
         "spillarena_gds")
DEFAULT_MODES = ("none", "hf_checkpointing", "hf_offload", "spillarena_direct",
                 "spillarena_attention")
SPILLING = ("spillarena_direct", "spillarena_attention", "spillarena_gds")
BASELINE = "hf_checkpointing"
GOAL = 1.5                # longest sequence vs hf_checkpointing's
STEP_GOAL = 1.15          # step time per token vs hf_checkpointing's, at the same length
COMPARE_PAIRS = (("spillarena_direct", "hf_checkpointing"), ("spillarena_direct", "hf_offload"),
                 ("spillarena_attention", "hf_checkpointing"))
FILL = 0.97               # the search's first guess aims at this fraction of the budget

# Model and search defaults: the real run, and the CPU smoke run (--smoke). Explicit flags win.
FULL = dict(layers=16, hidden=4096, heads=32, kv_heads=8, intermediate=14336,
            start_seq=2048, granularity=1024, max_seq=262144)
SMOKE = dict(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=224,
             start_seq=128, granularity=64, max_seq=512)
CHILD_SETTINGS = ("device", "dtype", "layers", "hidden", "heads", "kv_heads", "intermediate",
                  "vocab", "batch", "steps", "device_memory_gb", "cpu_budget_mb")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--smoke", action="store_true",
                   help="tiny model and sequences (with --device cpu: fake budget)")
    p.add_argument("--device-memory-gb", type=bench_args.amount(0.5, 4096, " GB"), default=24.0,
                   help="device memory to emulate (1e9 bytes)")
    p.add_argument("--cpu-budget-mb", type=bench_args.amount(1, 1 << 20, " MB"), default=64.0,
                   help="CPU smoke: peak RSS growth counted as oom")
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    for name in FULL:
        p.add_argument("--" + name.replace("_", "-"), type=bench_args.count(1, 1 << 22),
                       default=None, help=f"default {FULL[name]} ({SMOKE[name]} with --smoke)")
    p.add_argument("--vocab", type=bench_args.count(1, 1 << 22), default=1024)
    p.add_argument("--batch", type=bench_args.count(1, 4096), default=1)
    p.add_argument("--steps", type=bench_args.count(1, 100), default=2)
    p.add_argument("--modes", type=mode_list, default=list(DEFAULT_MODES))
    p.add_argument("--spill-dir", default=None,
                   help="default: spillarena.default_spill_directory()")
    p.add_argument("--trial-timeout-s", type=bench_args.seconds(1, 86400), default=600.0)
    p.add_argument("--deadline-s", type=bench_args.seconds(1, 86400), default=1140.0,
                   help="start no trial after this many seconds")
    p.add_argument("--no-compare", action="store_true",
                   help="skip the trials at a common length (compare_pairs)")
    p.add_argument("--commit", default=os.environ.get("SPILLARENA_COMMIT"),
                   help="the commit measured (default $SPILLARENA_COMMIT, else git's)")
    p.add_argument("--out", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--seq", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name, value in (SMOKE if args.smoke else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.hidden % args.heads or args.heads % args.kv_heads:
        p.error("--hidden must be a multiple of --heads, and --heads of --kv-heads")
    if args.start_seq > args.max_seq:
        p.error("--start-seq must not exceed --max-seq")
    if args.child and args.child not in MODES:
        p.error(f"unknown mode {args.child}")
    return args


def mode_list(text):
    """argparse type: comma-separated modes of MODES, each once."""
    modes = [m.strip() for m in text.split(",")]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown mode(s) {unknown}; choose from {','.join(MODES)}")
    if len(set(modes)) != len(modes):
        raise argparse.ArgumentTypeError(f"{text!r} names a mode twice")
    return modes


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


def enable_hf_checkpointing(model, offload, device):
    """transformers' own checkpointing, non-reentrant, with offload=True or not; returns the
    qualified name of the checkpoint function it installed on the first layer."""
    kwargs = {"use_reentrant": False}
    if offload and device == "cpu":
        unpinned_save_on_cpu()
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs,
                                              offload=offload)
    elif offload:
        raise RuntimeError("this transformers has no activation_checkpointing_enable(offload=True)"
                           " (transformers >= 5 has)")
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    layer = next(m for m in model.modules() if hasattr(m, "_gradient_checkpointing_func"))
    function = layer._gradient_checkpointing_func
    function = getattr(function, "func", function)  # a functools.partial
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', '?')}"


def unpinned_save_on_cpu():
    """CPU smoke only: transformers' offload asks save_on_cpu for pinned memory, which a torch
    without an accelerator cannot give (RuntimeError); this one does not pin, so the smoke runs
    transformers' own offload path otherwise unchanged."""
    import functools

    import torch
    from transformers import modeling_utils

    if hasattr(modeling_utils, "save_on_cpu"):
        modeling_utils.save_on_cpu = functools.partial(_save_on_cpu_unpinned,
                                                       torch.autograd.graph.save_on_cpu)


def _save_on_cpu_unpinned(save_on_cpu, pin_memory=False, **kwargs):
    return save_on_cpu(pin_memory=False, **kwargs)


def make_arena(args, mode, seq, torch, spillarena):
    """The arena for one step's layer inputs, plus one input of slack; with the attention
    policy, room for as much again (each attention's output is a layer input's size; its
    logsumexp and seeds are small)."""
    shape = (args.batch, seq, args.hidden)
    dtype = getattr(torch, args.dtype)
    per_step = spillarena.bytes_for_layer_inputs(args.layers, shape, dtype)
    if mode == "spillarena_attention":
        per_step *= 2
    capacity = per_step + 2 * spillarena.bytes_for_layer_input(shape, dtype)
    io = "gds" if mode == "spillarena_gds" else "direct"
    return spillarena.SpillArena(capacity, args.spill_dir, io=io, keep_last=0)


def prepare(args, mode, seq, model, torch, spillarena, result):
    """Turns on the mode's checkpointing; returns the arena (None without one)."""
    if mode in ("hf_checkpointing", "hf_offload"):
        result["checkpoint_function"] = enable_hf_checkpointing(model, mode == "hf_offload",
                                                                torch.device(args.device).type)
    if mode not in SPILLING:
        return None
    arena = make_arena(args, mode, seq, torch, spillarena)
    policy = spillarena.ATTENTION_OPS if mode == "spillarena_attention" else None
    spillarena.enable(model, arena, policy=policy)
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


STASH_FIELDS = ("inputs_stored", "inputs_spilled", "saved_tensors_stored",
                "saved_tensors_spilled", "host_pool_bytes", "host_pool_grows",
                "host_pool_pinned", "pool_waits", "pool_wait_ns", "peak_device_bytes_held",
                "copy_waits", "inputs_back_before_copied", "restore_waits", "restore_wait_ns")


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
            arena = prepare(args, mode, seq, model, torch, spillarena, result)
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
        stats, stash = arena.stats(), arena.stash_stats()
        result["io"] = {k: stats[k] for k in ("io_mode", "io_backend", "io_note", "bytes_written")}
        result["stash"] = {k: stash[k] for k in STASH_FIELDS if k in stash}
    return result, env


def record_peaks(args, result, baseline, torch):
    """Host RSS always; the device peak on CUDA; on the CPU the RSS growth is the peak, judged
    against the fake budget."""
    growth = proc_status_kib("VmHWM") * 1024 - baseline
    result["host_peak_rss_bytes"] = proc_status_kib("VmHWM") * 1024
    result["host_rss_growth_bytes"] = growth
    if args.device.startswith("cuda"):
        result["peak_bytes"] = torch.cuda.max_memory_allocated()
        result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        return
    result["peak_bytes"] = growth
    budget = args.cpu_budget_mb * 2**20
    if result["status"] == "ok" and growth > budget:
        result["status"] = "oom"
        result["message"] = (f"emulated: peak RSS growth {growth / 2**20:.1f} MiB"
                             f" > budget {args.cpu_budget_mb} MiB")


# ---------------------------------------------------------------------------------------------
# The search (parent process).


def search_length(attempt, start, granularity, cap, budget, fill=FILL):
    """The longest length that trains, from as few trials as the memory's shape allows.

    attempt(seq) -> (True, peak bytes) trained, (False, None) failed, or None: stop (the
    deadline, or the mode cannot run here). Lengths are multiples of `granularity` (start
    rounded up to one). Tries `start`, then twice the longest ok length until two lengths have
    trained; then the length at which the line through the two longest ok (length, peak) points
    reaches fill x budget, kept strictly between the longest ok and the shortest failure. Where
    the line is off: a length it chose trained and the line says no more, so one granularity
    more is tried, and if that trains too, doubling (no failure yet) or bisection takes over;
    after two failures in a row, bisection too. A length that reaches `cap` and trains ends it
    (capped). Returns largest_ok (0: nothing trained; None: no trial), first_failed, capped,
    incomplete and trials (the lengths tried, in order)."""
    g = granularity
    s = {"g": g, "start": max(g, -(-start // g) * g), "cap": max(g, cap // g * g),
         "budget": budget, "fill": fill, "points": {}, "low": 0, "high": None,
         "failures_in_row": 0, "line_trained": False}
    found = {"largest_ok": None, "first_failed": None, "capped": False, "incomplete": False,
             "trials": []}
    while s["high"] is None or s["high"] - s["low"] > g:
        seq, from_line = _next_length(s)
        if seq is None:
            break
        answer = attempt(seq)
        found["trials"].append(seq)
        if answer is None:
            found["incomplete"] = True
            break
        ok, peak = answer
        s["line_trained"] = ok and from_line
        if ok:
            s["low"], s["failures_in_row"] = max(s["low"], seq), 0
            if peak is not None:
                s["points"][seq] = peak
            if seq >= s["cap"]:
                found["capped"] = True
                break
        else:
            s["high"] = seq if s["high"] is None else min(s["high"], seq)
            s["failures_in_row"] += 1
    found["largest_ok"] = s["low"] if found["trials"] else None
    found["first_failed"] = s["high"]
    return found


def _next_length(s):
    """(the next length to try or None, whether the line chose it)."""
    g, low, high = s["g"], s["low"], s["high"]
    if low == 0:  # nothing trained yet: start, then halves below the first failure
        seq = s["start"] if high is None else (high // 2) // g * g
        return (seq if seq >= g and (high is None or seq < high) else None), False
    lo, hi = low + g, (high - g) if high is not None else s["cap"]
    if lo > hi:
        return None, False
    line = None
    if len(s["points"]) >= 2 and s["failures_in_row"] < 2:
        (s1, p1), (s2, p2) = sorted(s["points"].items())[-2:]
        slope = (p2 - p1) / (s2 - s1)
        if slope > 0:
            line = int(s2 + (s["fill"] * s["budget"] - p2) / slope) // g * g
    if line is not None and line >= lo:
        return min(line, hi), True
    if line is not None and s["line_trained"]:
        return lo, False  # the line's length trained and it says no more: one step more
    guess = 2 * low if high is None else low + (high - low) // 2 // g * g
    return min(max(guess, lo), hi), False


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
    except spillarena.errors.GdsUnavailableError as e:
        return first_line(e)
    except spillarena.Error:
        return None  # not cuFile's doing: the trials report it
    return None


def budget_bytes(args, runner):
    if args.device.startswith("cuda"):
        env = runner.env or {}
        return env.get("budget_bytes") or args.device_memory_gb * 1e9
    return args.cpu_budget_mb * 2**20


def record_trial(runner, mode, state, result, on_trial):
    """Keeps a trial's result in the mode's state; the search's answer for it."""
    runner.env = runner.env or result.pop("env", None)
    result.pop("env", None)
    state["trials"].append(result)
    if result["status"] == "ok":
        state["largest_ok_seq"] = max(result["seq"], state["largest_ok_seq"] or 0)
    on_trial(mode, state)
    if result["status"] == "skipped":
        state["skipped"] = result["message"]
        return None
    if result["status"] == "timeout" and runner.time_left() <= 0:
        state["incomplete"] = True
        return None
    return (True, result.get("peak_bytes")) if result["status"] == "ok" else (False, None)


def search(mode, runner, on_trial):
    args = runner.args
    state = new_state()

    def attempt(seq):
        if runner.time_left() <= 0:
            state["incomplete"] = True
            return None
        return record_trial(runner, mode, state, runner.trial(mode, seq), on_trial)

    found = search_length(attempt, args.start_seq, args.granularity, args.max_seq,
                          budget_bytes(args, runner))
    state["capped"] = found["capped"]
    state["incomplete"] = state["incomplete"] or found["incomplete"]
    state["first_failed_seq"] = found["first_failed"]
    return state


def ok_trial(state, seq):
    return next((t for t in (state or {}).get("trials", [])
                 if t["seq"] == seq and t["status"] == "ok"), None)


def _shared_lengths(results):
    """(a, b, seq) for each compared pair that both trained: the shorter of their longest."""
    for a, b in COMPARE_PAIRS:
        if a not in results or b not in results:
            continue
        lengths = [results[m]["largest_ok_seq"] for m in (a, b)]
        if all(lengths):
            yield a, b, min(lengths)


def compare(runner, results, on_trial):
    """Both modes of each pair at the shorter of their longest lengths, where one has not
    trained there yet (deadline permitting)."""
    for a, b, seq in _shared_lengths(results):
        for mode in (a, b):
            if ok_trial(results[mode], seq) is None and runner.time_left() > 0:
                record_trial(runner, mode, results[mode], runner.trial(mode, seq), on_trial)


def summarize(args, runner, results, started):
    base = (results.get(BASELINE) or {}).get("largest_ok_seq")
    for mode, state in results.items():
        seq = state["largest_ok_seq"]
        state["ratio_vs_hf_checkpointing"] = round(seq / base, 3) if seq and base else None
        at = ok_trial(state, seq) or {}
        state["at_longest"] = {k: at.get(k) for k in (
            "step_ms", "peak_bytes", "peak_reserved_bytes", "host_peak_rss_bytes",
            "host_rss_growth_bytes")} if at else None
        if at:
            state["at_longest"]["ms_per_1k_tokens"] = round(at["step_ms"][-1] / seq * 1024, 3)
        if mode in SPILLING:
            ratio = state["ratio_vs_hf_checkpointing"]
            state["meets_goal"] = None if ratio is None else ratio >= GOAL
    settings = {k: v for k, v in vars(args).items() if k not in ("child", "seq")}
    settings["pytorch_cuda_alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    settings["environment"] = runner.env
    settings["peak_bytes_means"] = (
        "torch.cuda.max_memory_allocated (weights and grads included)"
        if args.device.startswith("cuda") else
        "host peak RSS growth during the steps (VmHWM), the fake budget")
    return {"date": started.isoformat(timespec="seconds"), "commit": commit_of(args.commit),
            "settings": settings,
            "goals": {"longest_vs_hf_checkpointing": GOAL,
                      "step_per_token_vs_hf_checkpointing": STEP_GOAL,
                      "host_rss": "below hf_offload's at the same length"},
            "goal_met": {m: results[m]["meets_goal"] for m in SPILLING if m in results},
            "same_length": same_length(results),
            "modes": results}


def same_length(results):
    """Each compared pair at the shorter of their longest lengths, from the trials there."""
    out = []
    for a, b, seq in _shared_lengths(results):
        ta, tb = ok_trial(results[a], seq), ok_trial(results[b], seq)
        row = {"modes": [a, b], "seq": seq, "measured": bool(ta and tb)}
        if ta and tb:
            row["step_ratio"] = round(ta["step_ms"][-1] / tb["step_ms"][-1], 3)
            row["host_peak_rss_bytes"] = [ta.get("host_peak_rss_bytes"),
                                          tb.get("host_peak_rss_bytes")]
            if b == BASELINE:
                row["meets_step_goal"] = row["step_ratio"] <= STEP_GOAL
            if b == "hf_offload":
                row["host_rss_below"] = (ta.get("host_peak_rss_bytes") or 0) < \
                    (tb.get("host_peak_rss_bytes") or 0)
        out.append(row)
    return out


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
        f"{'mode':18s} {'longest ok':>10s} {'vs HF ckpt':>10s} {'goal ' + str(GOAL):>8s}"
        f" {'trials':>6s} {'peak':>10s} {'step ms':>8s} {'ms/1k tok':>9s} {'host RSS':>9s}")
    rows = [f"{report['date']} commit {report['commit']}", budget_line(report["settings"]),
            header]
    for mode, state in report["modes"].items():
        if state["skipped"]:
            rows.append(f"{mode:18s} skipped: {state['skipped'][:120]}")
            continue
        seq, ratio, at = state["largest_ok_seq"], state["ratio_vs_hf_checkpointing"], \
            state.get("at_longest") or {}
        goal = {True: "met", False: "missed", None: "-"}[state.get("meets_goal")]
        note = " (capped)" if state["capped"] else " (incomplete)" if state["incomplete"] else ""
        peak, rss = at.get("peak_bytes"), at.get("host_peak_rss_bytes")
        step = (at.get("step_ms") or [None])[-1]
        rows.append(
            f"{mode:18s} {seq or '-':>10} {(f'{ratio:.2f}x' if ratio else '-'):>10s} {goal:>8s}"
            f" {len(state['trials']):6d} {(f'{peak / 2**30:.2f} GiB' if peak else '-'):>10s}"
            f" {(f'{step:.0f}' if step else '-'):>8s}"
            f" {at.get('ms_per_1k_tokens') or '-':>9}"
            f" {(f'{rss / 2**30:.2f} GiB' if rss else '-'):>9s}{note}")
    for row in report["same_length"]:
        a, b = row["modes"]
        if row["measured"]:
            rows.append(f"at {row['seq']} tokens: {a} step {row['step_ratio']:.2f}x {b}'s;"
                        f" host RSS {row['host_peak_rss_bytes'][0] / 2**30:.2f} vs"
                        f" {row['host_peak_rss_bytes'][1] / 2**30:.2f} GiB")
        else:
            rows.append(f"at {row['seq']} tokens: {a} vs {b} not measured (deadline)")
    return "\n".join(rows)


def run_searches(args, runner, started):
    """Every mode's search, then the same-length trials; the report is rewritten after each
    trial, a progress line on stderr."""
    results = {}

    def on_trial(mode, state):
        results[mode] = state
        t = state["trials"][-1]
        peak = f"{t['peak_bytes'] / 2**20:10.1f} MiB" if t.get("peak_bytes") else ""
        print(f"  {mode:18s} seq {t['seq']:7d} {t['status']:8s} {peak} {t.get('trial_s', '')} s",
              file=sys.stderr, flush=True)
        h2h_support.write_report(args.out, summarize(args, runner, dict(results), started))

    for mode in args.modes:
        reason = gds_unavailable(runner.spill_dir) if mode == "spillarena_gds" else None
        if reason:
            print(f"  {mode:18s} skipped: {reason}", file=sys.stderr, flush=True)
            results[mode] = new_state(skipped=reason)
            h2h_support.write_report(args.out, summarize(args, runner, dict(results), started))
            continue
        results[mode] = search(mode, runner, on_trial)
    if not args.no_compare:
        compare(runner, results, on_trial)
    return summarize(args, runner, results, started)


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

    started = datetime.datetime.now(datetime.timezone.utc)
    args.spill_dir = args.spill_dir or spillarena.default_spill_directory()
    with tempfile.TemporaryDirectory(prefix="spillarena-longest-", dir=args.spill_dir) as spill:
        report = run_searches(args, Runner(args, spill), started)
    h2h_support.write_report(args.out, report)
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
