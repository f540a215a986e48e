"""Who holds the device memory at each mode's peak, and the host pool at 1x, 2x and 4x its
default: the Python half of issue 50's first GPU call (scripts/gpu-check.sh 1).

    python bench/python/gpu_peak_snapshot.py --device cuda --out peaks.json --raw peaks.tar
    python bench/python/gpu_peak_snapshot.py --classify peaks.tar     # again, from saved traces
    python bench/python/gpu_peak_snapshot.py --device cpu --dry-run --out /tmp/peaks.json

The model is BM_AcceleratorStep's (bench/accelerator_benchmark.cc, models/tiny_gpt.cc) written
in Python: 16 pre-norm GPT blocks at Llama-7B width in bf16 (batch 4, seq 4096, hidden 4096, 32
heads: a 128 MiB input per block), each through spillarena.checkpoint (the reentrant form by
default, as spill::checkpoint is one autograd node per layer), the loss the mean square of the
last output, which the step keeps until backward ends as the C++ benchmark's `y`. Modes, with
the C++ benchmark's settings (keep_last 1, prefetch_depth 2, asynchronous):
  recompute    spillarena.make_in_memory_stash(): inputs kept on the device, nothing spilled
  ram          a RAM arena (backing="ram") through the pinned host pool
  disk_async   a disk arena, buffered I/O
  disk_direct  a disk arena, O_DIRECT through the host pool
each with the automatic pool (prefetch_depth + 2 inputs, at least 64 MiB, grown after a step
whose store()s waited: host_pool_grows), then --pool-modes again with host_pool_bytes fixed at
--pool-factors times that default (a pool the user sized never grows).

Each run is a fresh process (pinned host memory stays cached by torch for a process's life, so
a run after another would look free): a warm-up step; one step recorded with
torch.cuda.memory._record_memory_history(context="alloc", stacks="python"), whose trace is
replayed to the peak of allocated bytes and every block alive there given an owner
(bench/python/peak_owners.py): weights, grads, the stack's output, layer inputs held into
backward, copies in flight (layer inputs freed before backward began: held until their copy to
the host completed), restored inputs (device memory spillarena's device_copies.empty allocated
for reads: prefetched or restored), the forward's other allocations, the recomputed layer, the
rest of backward, and the allocator's cache (reserved - allocated) with the part of it pending
on another stream; then --steps timed steps: step time, the allocator's peak over them (what
BM_AcceleratorStep reports as gpu_peak_bytes), host VmHWM and what the mode added to it, and
arena.stash_stats() (device_bytes_held, peak_device_bytes_held, copy_waits,
inputs_back_before_copied, host_pool_bytes, host_pool_grows, pool_waits ...) before and after.
The parent adds each mode's step time over recompute's and the issue's goal for its peak:
recompute's less (inputs spilled per step - prefetch_depth - 1) inputs. Every run ends by
--deadline-s (one starts only where 1.5 times the slowest so far fits; the others are listed as
not run); the JSON is rewritten after every run, so a call cut short keeps what it found.

--device cpu --dry-run runs the same processes on the CPU at BM_AcceleratorStep's smoke shape
(batch 2, seq 32, hidden 64, 4 heads, 3 blocks, fp32): no trace can be recorded there (the
snapshot says so), everything else — modes, pool sizes, stats, JSON — is exercised
(tests/python/test_gpu_scripts.py, which also feeds peak_owners fabricated snapshots).
"""

import argparse
import datetime
import gzip
import json
import os
import pickle
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_args
import peak_owners
from provenance import commit_of

import h2h_support  # status_bytes, write_report

MODES = ("recompute", "ram", "disk_async", "disk_direct")
PREFETCH_DEPTH, KEEP_LAST = 2, 1  # BM_AcceleratorStep's stash settings
MIN_POOL_BYTES = 64 << 20         # the automatic pool's floor (src/core/stash/host_pool.cc)
PHASES = ("forward", "backward", "end")
MARK_UNIT = 512  # the allocator rounds to 512 bytes: phase k's marker is 512 * (k + 1) bytes
THIS_FILE = os.path.basename(__file__)
RULES = peak_owners.Rules(
    layer_output=(THIS_FILE, ("block_output", "first_input")),
    layer_code=(THIS_FILE, ("forward", "attention", "mlp", "block_output")),
    marker=(THIS_FILE, ("phase_mark",)))

FULL = dict(batch=4, seq=4096, hidden=4096, heads=32, layers=16)
DRY = dict(batch=2, seq=32, hidden=64, heads=4, layers=3)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--dry-run", action="store_true",
                   help=f"the smoke shape {DRY} (on the CPU: no trace, plumbing only)")
    for name, value in FULL.items():
        p.add_argument("--" + name, type=bench_args.count(1, 1 << 20), default=None,
                       help=f"default {value} ({DRY[name]} with --dry-run)")
    p.add_argument("--modes", type=names(MODES), default=list(MODES))
    p.add_argument("--pool-modes", type=names(MODES), default=["disk_direct", "disk_async"],
                   help="modes run again with host_pool_bytes = each factor x the default")
    p.add_argument("--pool-factors", type=bench_args.counts(1, 64), default=[1, 2, 4])
    p.add_argument("--form", default="reentrant", choices=("reentrant", "non_reentrant"),
                   help="spillarena.checkpoint's use_reentrant")
    p.add_argument("--steps", type=bench_args.count(1, 100), default=3, help="timed steps")
    p.add_argument("--max-entries", type=bench_args.count(1000, 10_000_000), default=200_000,
                   help="the allocator trace's ring (a truncated trace is reported)")
    p.add_argument("--deadline-s", type=bench_args.seconds(1, 86400), default=240.0,
                   help="every run ends by then: one starts only where 1.5 times the slowest"
                   " so far still fits (each run's timeout is what is left)")
    p.add_argument("--run-timeout-s", type=bench_args.seconds(1, 3600), default=90.0)
    p.add_argument("--spill-dir", default=None,
                   help="default: spillarena.default_spill_directory()")
    p.add_argument("--commit", default=os.environ.get("SPILLARENA_COMMIT"),
                   help="the commit measured (default $SPILLARENA_COMMIT, else git's HEAD)")
    p.add_argument("--out", default=None, help="the report (JSON)")
    p.add_argument("--raw", default=None,
                   help="a tar of every run's snapshot (gzipped pickles: pytorch.org/memory_viz "
                   "reads them gunzipped)")
    p.add_argument("--classify", default=None, metavar="RAW_TAR",
                   help="classify the snapshots of a --raw tar again and print the table")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--pool-factor", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--snapshot-to", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name, value in (DRY if args.dry_run else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.hidden % args.heads:
        p.error(f"--hidden ({args.hidden}) must be a multiple of --heads ({args.heads})")
    if args.batch * args.seq * args.hidden > 1 << 36:
        p.error("--batch x --seq x --hidden must be at most 2^36 elements per input")
    if args.child and args.child not in MODES:
        p.error(f"unknown mode {args.child}")
    return args


def names(allowed):
    """argparse type: a comma-separated list of names, each one of `allowed`."""
    def parse(text):
        items = [item.strip() for item in text.split(",")]
        unknown = [item for item in items if item not in allowed]
        if unknown or not all(items):
            raise argparse.ArgumentTypeError(
                f"{text!r}: choose from {','.join(allowed)} (comma-separated)")
        return items
    return parse


def default_pool_bytes(input_bytes):
    """The automatic pool's first size: prefetch_depth + 2 inputs, at least 64 MiB."""
    return max(MIN_POOL_BYTES, (PREFETCH_DEPTH + 2) * input_bytes)


def runs(args):
    """[(mode, pool factor)]: factor 0 is the automatic pool."""
    return [(m, 0) for m in args.modes] + [(m, f) for m in args.pool_modes
                                           for f in args.pool_factors]


def label(mode, factor):
    return mode if factor == 0 else f"{mode}/pool_x{factor}"


# ---------------------------------------------------------------------------------------------
# One run (child process).


def build_blocks(args, torch, device, dtype):
    """BM_AcceleratorStep's GptBlock stack (models/tiny_gpt.cc), dropout 0."""
    import torch.nn.functional as F

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            h = args.hidden
            kw = dict(device=device, dtype=dtype)
            self.ln1, self.ln2 = torch.nn.LayerNorm(h, **kw), torch.nn.LayerNorm(h, **kw)
            self.qkv, self.proj = torch.nn.Linear(h, 3 * h, **kw), torch.nn.Linear(h, h, **kw)
            self.fc1, self.fc2 = torch.nn.Linear(h, 4 * h, **kw), torch.nn.Linear(4 * h, h, **kw)

        def attention(self, x):
            b, t, c = x.shape
            qkv = self.qkv(x).view(b, t, 3, args.heads, c // args.heads).permute(2, 0, 3, 1, 4)
            out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
            return self.proj(out.transpose(1, 2).reshape(b, t, c))

        def mlp(self, x):
            return self.fc2(F.gelu(self.fc1(x)))

        def forward(self, x):
            x = x + self.attention(self.ln1(x))
            return block_output(x, self.mlp(self.ln2(x)))

    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(Block() for _ in range(args.layers))
    blocks.train()
    return blocks


def block_output(x, mlp):
    """A layer's output, the next layer's input: its allocations are found by this name."""
    return x + mlp


def first_input(x0):
    """The first layer's input, found by this name as the others are by block_output's."""
    return x0.clone().requires_grad_(True)


def phase_mark(torch, device, phase):
    """Shows the start of a phase in the allocator's trace: MARK_UNIT * (its number + 1) bytes,
    freed at once (peak_owners.phase_marks)."""
    torch.empty(MARK_UNIT * (PHASES.index(phase) + 1), dtype=torch.uint8, device=device)


def make_stash(args, mode, factor, input_bytes, spillarena):
    """(the arena= argument of spillarena.checkpoint, the SpillArena or None, its options)."""
    if mode == "recompute":
        return spillarena.make_in_memory_stash(), None, {}
    options = dict(asynchronous=True, keep_last=KEEP_LAST, prefetch_depth=PREFETCH_DEPTH)
    if mode == "ram":
        options["backing"] = "ram"
    else:
        options["io"] = "direct" if mode == "disk_direct" else "buffered"
    if factor:
        options["host_pool_bytes"] = factor * default_pool_bytes(input_bytes)
    capacity = args.layers * input_bytes + (64 << 20)  # BM_AcceleratorStep's capacity_for
    arena = spillarena.SpillArena(capacity, args.spill_dir, **options)
    return arena, arena, options


def one_step(blocks, x0, stash, args, torch, spillarena, mark):
    """Forward, loss, backward; returns the stack's output (kept until here, as in C++)."""
    mark("forward")
    x = first_input(x0)
    for block in blocks:
        x = spillarena.checkpoint(block, x, arena=stash, use_reentrant=args.form == "reentrant")
    loss = x.float().square().mean()
    mark("backward")
    loss.backward()
    if x0.is_cuda:
        torch.cuda.synchronize()
    mark("end")
    return x


def recorded_step(args, blocks, x0, stash, torch, spillarena):
    """One step under the allocator's trace: (the peak, classified; the raw snapshot)."""
    device = x0.device

    def mark(phase):
        phase_mark(torch, device, phase)

    memory = torch.cuda.memory
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                  max_entries=args.max_entries)
    try:
        y = one_step(blocks, x0, stash, args, torch, spillarena, mark)
        snapshot = memory._snapshot()
    finally:
        memory._record_memory_history(enabled=None)
    params = list(blocks.parameters())
    known = [("weights", [p.data_ptr() for p in params]),
             ("grads", [p.grad.data_ptr() for p in params if p.grad is not None]),
             ("stack_output", [y.data_ptr()])]
    del y
    blocks.zero_grad(set_to_none=True)
    index = device.index if device.index is not None else torch.cuda.current_device()
    snapshot["spillarena"] = {"device": index, "known": known, "phases": list(PHASES),
                              "unit": MARK_UNIT}
    return classify(snapshot, args.max_entries, torch.cuda.max_memory_allocated()), snapshot


def classify(snapshot, max_entries=None, allocator_peak=None):
    """peak_owners.at_peak with what the run saved beside the snapshot."""
    extra = snapshot["spillarena"]
    peak = peak_owners.at_peak(snapshot, extra["device"], RULES, known=extra["known"],
                               phase_names=extra["phases"], unit=extra["unit"])
    peak["owners_add_up"] = peak_owners.check_sum(peak)
    if max_entries is not None:
        peak["trace_truncated"] = peak["events"] >= max_entries
    if allocator_peak is not None:
        peak["allocator_peak_bytes"] = allocator_peak  # max_memory_allocated over the step
        peak["replay_matches_allocator"] = allocator_peak == peak["allocated_bytes"]
    return peak


def timed_steps(args, blocks, x0, stash, torch, spillarena):
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        one_step(blocks, x0, stash, args, torch, spillarena, lambda phase: None)
        times.append(time.perf_counter() - start)
        blocks.zero_grad(set_to_none=True)
    return times


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def run_child(args):
    import torch

    import spillarena

    mode, factor = args.child, args.pool_factor
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    blocks = build_blocks(args, torch, device, dtype)
    input_bytes = args.batch * args.seq * args.hidden * torch.finfo(dtype).bits // 8
    before_mode = h2h_support.status_bytes("VmRSS")
    result = {"mode": mode, "pool_factor": factor, "input_bytes": input_bytes,
              "default_pool_bytes": default_pool_bytes(input_bytes)}
    try:
        stash, arena, options = make_stash(args, mode, factor, input_bytes, spillarena)
    except spillarena.Error as e:  # a pool over RLIMIT_MEMLOCK, no room on the disk...
        result["error"] = f"{type(e).__name__}: {e}"
        return result
    result["options"] = options
    torch.manual_seed(1)
    x0 = torch.randn(args.batch, args.seq, args.hidden, device=device, dtype=dtype)

    def stats():
        return arena.stash_stats() if arena else None

    one_step(blocks, x0, stash, args, torch, spillarena, lambda phase: None)  # warm-up
    blocks.zero_grad(set_to_none=True)
    result["stash_after_warmup"] = stats()
    if cuda:
        result["peak"], snapshot = recorded_step(args, blocks, x0, stash, torch, spillarena)
        # the stash's own account beside the snapshot's: device bytes it held at most so far
        # (layer inputs stored and not yet copied off, inputs read back and not yet restored)
        result["stash_after_recorded_step"] = stats()
        if args.snapshot_to:
            with gzip.open(args.snapshot_to, "wb") as f:
                pickle.dump(snapshot, f)
        del snapshot
        torch.cuda.reset_peak_memory_stats()
    else:
        result["peak"] = {"skipped": "torch.cuda.memory._record_memory_history needs CUDA"}
    before = stats()
    written = arena.stats()["bytes_written"] if arena else 0
    reset_peak_rss()
    times = timed_steps(args, blocks, x0, stash, torch, spillarena)
    after = stats()
    result.update(
        step_ms=[round(t * 1e3, 2) for t in times],
        median_step_ms=round(statistics.median(times) * 1e3, 2),
        gpu_peak_bytes=torch.cuda.max_memory_allocated() if cuda else None,
        gpu_peak_reserved_bytes=torch.cuda.max_memory_reserved() if cuda else None,
        host_peak_rss=h2h_support.status_bytes("VmHWM"),
        host_rss_added=h2h_support.status_bytes("VmHWM") - before_mode,
        stash=after)
    if arena:
        result["spilled_bytes_per_step"] = (arena.stats()["bytes_written"] - written) / args.steps
        result["inputs_spilled_per_step"] = (
            (after["inputs_spilled"] - before["inputs_spilled"]) / args.steps)
        # Counters of the timed steps alone (None: this build's stash has no such counter).
        result["timed_steps"] = {k: after[k] - before[k] if k in after else None for k in (
            "pool_waits", "pool_wait_ns", "copy_waits", "copy_wait_ns",
            "inputs_back_before_copied", "restore_waits", "restore_wait_ns",
            "inputs_kept_on_device", "host_pool_grows")}
        result["io"] = {k: arena.stats()[k] for k in ("io_mode", "io_backend", "io_note")}
    return result


# ---------------------------------------------------------------------------------------------
# The runs (parent process).


def environment(args):
    import torch

    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
           "cores": os.cpu_count()}
    if args.device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(device_name=props.name, total_memory_bytes=props.total_memory)
    try:
        import spillarena

        env["spillarena"] = spillarena.__version__
    except ImportError as e:
        env["spillarena"] = f"not importable: {e}"
    env["pytorch_cuda_alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    return env


def start_run(args, mode, factor, spill, raw_dir, time_left):
    flags = [f"--{k}={getattr(args, k)}" for k in FULL] + [
        f"--device={args.device}", f"--form={args.form}", f"--steps={args.steps}",
        f"--max-entries={args.max_entries}", f"--spill-dir={spill}", f"--child={mode}",
        f"--pool-factor={factor}"]
    if raw_dir:
        flags.append("--snapshot-to=" + os.path.join(raw_dir, raw_name(mode, factor)))
    timeout = max(1.0, min(args.run_timeout_s, time_left))
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, os.path.abspath(__file__), *flags],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"mode": mode, "pool_factor": factor, "run_s": round(timeout, 1),
                "error": f"timeout: no result within {timeout:.0f} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        result = json.loads(lines[-1])
    else:
        tail = done.stderr.strip().splitlines()[-3:] or [f"exit {done.returncode}"]
        result = {"mode": mode, "pool_factor": factor,
                  "error": f"exit {done.returncode}: " + " | ".join(tail)[-600:]}
    result["run_s"] = round(time.monotonic() - start, 1)
    return result


def raw_name(mode, factor):
    return label(mode, factor).replace("/", "-") + ".pickle.gz"


def summarize(args, results, started, raw_left_out=()):
    """The report: settings, each run, and what the parent computes across runs."""
    base = next((r for r in results if r["mode"] == "recompute" and not r["pool_factor"]
                 and "median_step_ms" in r), None)
    for r in results:
        if base is None or "median_step_ms" not in r:
            continue
        r["vs_recompute"] = round(r["median_step_ms"] / base["median_step_ms"], 3)
        if r["mode"] != "recompute" and base.get("gpu_peak_bytes") and r.get("gpu_peak_bytes"):
            spilled = r.get("inputs_spilled_per_step", 0)
            r["gpu_goal_bytes"] = int(base["gpu_peak_bytes"]
                                      - (spilled - PREFETCH_DEPTH - 1) * r["input_bytes"])
            r["meets_gpu_goal"] = r["gpu_peak_bytes"] <= r["gpu_goal_bytes"]
    settings = {k: v for k, v in vars(args).items()
                if k not in ("child", "pool_factor", "snapshot_to", "classify")}
    return {"date": started.isoformat(timespec="seconds"), "commit": commit_of(args.commit),
            "settings": settings, "environment": environment(args),
            "goal": "gpu_peak_bytes <= recompute's - (inputs spilled per step - prefetch_depth"
                    " - 1) x input_bytes (issue 50)",
            "raw_snapshots_left_out": list(raw_left_out),  # over write_raw's limit
            "runs": results}


def table(report):
    lines = [f"{report['date']} commit {report['commit']}; "
             f"{(report['environment'] or {}).get('device_name', report['settings']['device'])}"]
    lines.append(f"{'run':24s} {'step ms':>8s} {'÷ rec.':>6s} {'GPU peak GB':>11s} {'goal':>6s}"
                 f" {'host +GB':>8s} {'pool MiB':>8s} {'grows':>5s} {'pool w.':>7s}"
                 f" {'copy w.':>7s} {'spilled':>7s} {'held MiB':>8s}")
    for r in report["runs"]:
        name = label(r["mode"], r["pool_factor"])
        if "median_step_ms" not in r:
            lines.append(f"{name:24s} {(r.get('error') or r.get('skipped', ''))[:150]}")
            continue
        s, t = r.get("stash") or {}, r.get("timed_steps") or {}
        lines.append(
            f"{name:24s} {r['median_step_ms']:8.0f} {r.get('vs_recompute', 0):6.2f}"
            f" {_gb(r.get('gpu_peak_bytes')):>11s} {_gb(r.get('gpu_goal_bytes')):>6s}"
            f" {_gb(r.get('host_rss_added')):>8s} {_mib(s.get('host_pool_bytes')):>8s}"
            f" {_n(s.get('host_pool_grows')):>5s} {_n(t.get('pool_waits')):>7s}"
            f" {_n(t.get('copy_waits')):>7s} {r.get('inputs_spilled_per_step', 0):7.1f}"
            f" {_mib(s.get('peak_device_bytes_held')):>8s}")
    peaks = [(label(r["mode"], r["pool_factor"]), r["peak"]) for r in report["runs"]
             if "owners" in (r.get("peak") or {})]
    if peaks:
        lines.append(peak_owners.table(peaks))
    return "\n".join(lines)


def _gb(value):
    return f"{value / 1e9:.2f}" if isinstance(value, (int, float)) else "-"


def _mib(value):
    return f"{value / 2**20:.0f}" if isinstance(value, (int, float)) else "-"


def _n(value):
    return str(value) if value is not None else "-"


RAW_LIMIT_BYTES = 15 << 20  # the device machine returns at most 8 files of 16 MiB each


def write_raw(raw_dir, path, limit=RAW_LIMIT_BYTES):
    """One tar of the runs' snapshots, in the order they were made, as many as fit in `limit`;
    returns the names left out."""
    left_out, total = [], 0
    names = sorted(os.listdir(raw_dir), key=lambda n: os.path.getmtime(os.path.join(raw_dir, n)))
    with tarfile.open(path + ".tmp", "w") as tar:
        for name in names:
            size = os.path.getsize(os.path.join(raw_dir, name)) + 1024
            if total + size > limit:
                left_out.append(name)
                continue
            total += size
            tar.add(os.path.join(raw_dir, name), arcname=name)
    os.replace(path + ".tmp", path)
    return left_out


def classify_raw(path):
    """--classify: the table of a --raw tar's snapshots, classified again."""
    rows = []
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            with gzip.open(tar.extractfile(member)) as f:
                snapshot = pickle.load(f)
            rows.append((member.name.replace(".pickle.gz", ""), classify(snapshot)))
    print(peak_owners.table(rows))
    return 0


def check_device(args):
    if args.device == "cpu":
        return None if args.dry_run else (
            "--device cpu has no device memory to take apart; this needs CUDA. For a check of "
            "the runs and the JSON on the CPU, pass --device cpu --dry-run.")
    import torch

    if not torch.cuda.is_available():
        return "CUDA is not available (torch.cuda.is_available() is False)"
    return None


def main(argv):
    args = parse_args(argv)
    if args.classify:
        return classify_raw(args.classify)
    if args.child:
        print(json.dumps(run_child(args)))
        return 0
    reason = check_device(args)
    if reason:
        print(f"gpu_peak_snapshot: {reason}", file=sys.stderr)
        return 2
    import spillarena  # only for the default spill directory (never tmpfs)

    started = datetime.datetime.now(datetime.timezone.utc)
    clock = time.monotonic()
    parent = args.spill_dir or spillarena.default_spill_directory()
    results = []
    with tempfile.TemporaryDirectory(prefix="spillarena-peaks-", dir=parent) as spill, \
            tempfile.TemporaryDirectory(prefix="spillarena-raw-") as raw_dir:
        slowest, left_out = 0.0, []
        for mode, factor in runs(args):
            left = args.deadline_s - (time.monotonic() - clock)
            if left < max(10.0, 1.5 * slowest):
                results.append({"mode": mode, "pool_factor": factor, "skipped": (
                    f"not run: {max(left, 0):.0f} s left of --deadline-s {args.deadline_s:g},"
                    f" the slowest run took {slowest:.0f} s")})
            else:
                results.append(start_run(args, mode, factor, spill,
                                         raw_dir if args.raw else None, left))
                r = results[-1]
                slowest = max(slowest, r.get("run_s", 0.0))
                print(f"  {label(mode, factor):24s} {r.get('run_s', '')} s"
                      f" {r.get('error', '')[:200]}", file=sys.stderr, flush=True)
            if args.raw and os.listdir(raw_dir):
                left_out = write_raw(raw_dir, args.raw)
            h2h_support.write_report(args.out, summarize(args, results, started, left_out))
    report = summarize(args, results, started, left_out)
    h2h_support.write_report(args.out, report)
    print(table(report))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
