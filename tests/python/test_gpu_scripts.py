"""The GPU check's scripts cannot rot on a machine without a GPU.

scripts/gpu-check.sh runs only where a GPU is lent (rarely, for 15 minutes), so everything of it
that a CPU can run runs here: its argument lines are parsed by the scripts' own parsers (with
the values its shell arithmetic can give), its budget and benchmark filter are checked, the peak
classifier (bench/python/peak_owners.py) takes fabricated allocator snapshots in torch's format,
gpu_peak_snapshot.py runs its modes and pool sizes on the CPU and records a step through torch's
recording API (faked, but bound to the real signature), and longest_sequence.py's search runs
against a memory model and end to end on a tiny model.
"""

import gzip
import importlib.util
import inspect
import json
import os
import pickle
import re
import shlex
import shutil
import subprocess
import sys
import tarfile

import pytest
import torch

from conftest import assert_as_torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "bench", "python")
GPU_CHECK = os.path.join(REPO, "scripts", "gpu-check.sh")
SCRIPTS = ("gpu_peak_snapshot.py", "longest_sequence.py")
MiB = 1 << 20


def load(script):
    spec = importlib.util.spec_from_file_location(script[:-3], os.path.join(BENCH, script))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gpu_check_text():
    with open(GPU_CHECK) as f:
        return f.read().replace("\\\n", " ")


def shell_value(word, cap):
    """A word of gpu-check.sh as the shell gives it when `cap` seconds are left: its arithmetic
    evaluated by bash, "$out/..." kept as text."""
    if "$((" not in word:
        return word
    done = subprocess.run(["bash", "-c", f'cap={cap}; echo "{word}"'], capture_output=True,
                          text=True, check=True)
    return done.stdout.strip()


def gpu_check_lines(script):
    """The command lines of gpu-check.sh (continuations joined) that run `script`."""
    return [line for line in gpu_check_text().splitlines()
            if "bench/python/" + script in line and not line.lstrip().startswith("#")]


def gpu_check_argument_lines(script, cap=300):
    """The arguments gpu-check.sh passes to `script`, one list per call."""
    calls = []
    for line in gpu_check_lines(script):
        words = shlex.split(line[line.find("bench/python/" + script):])[1:]
        ends = [i for i, w in enumerate(words) if w in (">", ">>", "2>&1", "||", "|")]
        calls.append([shell_value(w, cap) for w in words[:ends[0] if ends else None]])
    return calls


# ---------------------------------------------------------------------------------------------
# gpu-check.sh


@pytest.mark.parametrize("cap", [1, 60, 300, 600])
@pytest.mark.parametrize("script", SCRIPTS)
def test_gpu_check_passes_arguments_the_script_accepts(script, cap):
    calls = gpu_check_argument_lines(script, cap)
    assert calls, f"scripts/gpu-check.sh no longer runs bench/python/{script}"
    parse_args = load(script).parse_args
    for argv in calls:
        parse_args(argv)  # SystemExit (argparse's error) fails the test, naming the flag


def test_gpu_check_searches_the_modes_issues_50_and_51_name():
    parse_args = load("longest_sequence.py").parse_args
    (argv,) = gpu_check_argument_lines("longest_sequence.py")
    args = parse_args(argv)
    assert args.modes == ["none", "hf_checkpointing", "hf_offload", "spillarena_direct",
                          "spillarena_attention"]
    assert (args.layers, args.hidden, args.heads, args.kv_heads, args.intermediate) == \
        (16, 4096, 32, 8, 14336)
    assert args.dtype == "bfloat16" and args.device_memory_gb == 24.0


def test_gpu_check_snapshots_every_mode_and_three_pool_sizes():
    parse_args = load("gpu_peak_snapshot.py").parse_args
    (argv,) = gpu_check_argument_lines("gpu_peak_snapshot.py")
    args = parse_args(argv)
    assert args.modes == ["recompute", "ram", "disk_async", "disk_direct"]
    assert args.pool_factors == [1, 2, 4] and "disk_direct" in args.pool_modes
    assert (args.batch, args.seq, args.hidden, args.heads, args.layers) == (4, 4096, 4096, 32, 16)
    assert args.raw and args.out


def test_gpu_check_benchmarks_the_four_modes_at_16_blocks_and_the_prefetch_a_b():
    with open(os.path.join(REPO, "bench", "accelerator_benchmark.cc")) as f:
        source = f.read()
    registered = re.findall(r'"(\w+)"', re.search(r"for \(const std::string mode :\s*\{([^}]*)\}",
                                                    source).group(1))
    text = gpu_check_text()
    filters = re.findall(r"--benchmark_filter='([^']*)'", text)
    assert len(filters) == 2, filters
    assert "SPILLARENA_BENCH_ACCEL_SHAPE" not in text  # the default shape: 16 blocks
    names = [f"BM_AcceleratorStep/{m}/iterations:3/real_time" for m in registered]
    chosen = [[m for m, name in zip(registered, names) if re.search(f, name)] for f in filters]
    assert chosen == [["recompute", "ram", "disk_async", "disk_direct"],
                      ["recompute", "disk_async"]]
    # the second with the predecessors' prefetches on a worker (Note [Prefetching off the
    # training thread]), the name the library reads
    assert "env SPILLARENA_PREFETCH_THREAD=worker" in text
    with open(os.path.join(REPO, "src", "core", "stash", "chain.cc")) as f:
        assert 'std::getenv("SPILLARENA_PREFETCH_THREAD")' in f.read()


def test_gpu_check_fits_each_call_in_8_minutes():
    text = gpu_check_text()
    budget = int(re.search(r"SPILLARENA_GPU_BUDGET_S:-(\d+)", text).group(1))
    assert budget <= 480
    caps = {name: int(cap) for name, cap in re.findall(r'step "?(install|b[^"]*)"? (\d+) ', text)}
    assert set(caps) == {"install", "b (BM_AcceleratorStep, 16 blocks)",
                         "b2 (BM_AcceleratorStep, prefetches on a worker)"}, caps
    tests_cap = int(re.search(r"cap=\$\(\((\d+) - \(SECONDS - start\)\)\)", text).group(1))
    # call 1: the installs, a, b, b2 and at least a minute for c's first runs
    assert caps["install"] + tests_cap + sum(v for k, v in caps.items() if k != "install") \
        + 60 <= budget
    # every Python step runs under `step` (a timeout), within what is left
    for script in SCRIPTS:
        (line,) = gpu_check_lines(script)
        assert re.match(r'\s*step "[^"]+" "\$cap" ', line), line


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="needs shellcheck")
def test_gpu_scripts_pass_shellcheck():
    scripts = [os.path.join(REPO, "scripts", s)
               for s in ("gpu-check.sh", "gpu-prepare.sh", "gpu-fetch-debs.sh")]
    for script in scripts:
        subprocess.run(["bash", "-n", script], check=True)
    done = subprocess.run(["shellcheck", *scripts], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_gpu_check_refuses_a_call_it_does_not_know(tmp_path):
    done = subprocess.run(["bash", GPU_CHECK, "3"], capture_output=True, text=True,
                          env=dict(os.environ, OUT=str(tmp_path)))
    assert done.returncode == 2 and "usage" in done.stdout


# ---------------------------------------------------------------------------------------------
# peak_owners: the replay of a fabricated snapshot, in torch.cuda.memory._snapshot()'s format.

SNAP = "gpu_peak_snapshot.py"


def frames(name, file=SNAP, line=1):
    return [{"filename": f"/repo/bench/python/{file}", "line": line, "name": name}]


class Trace:
    def __init__(self):
        self.events = []

    def __call__(self, action, addr, size, where=None):
        self.events.append({"action": action, "addr": addr, "size": size, "stream": 0,
                            "time_us": len(self.events), "frames": where or []})

    def alloc(self, addr, size, where=None):
        self("alloc", addr, size, where)

    def free(self, addr, size, completed=True):
        self("free_requested", addr, size)
        if completed:
            self("free_completed", addr, size)

    def mark(self, phase):
        self.alloc(9 << 30, 512 * (phase + 1), frames("phase_mark"))
        self.free(9 << 30, 512 * (phase + 1))


def rules():
    owners = load("peak_owners.py")
    return owners, owners.Rules(layer_output=(SNAP, ("block_output",)),
                                layer_code=(SNAP, ("forward", "block_output")),
                                marker=(SNAP, ("phase_mark",)))


def backward_peak_snapshot():
    """Weights (32 MiB) and a buffer (16 MiB) from before the trace; a forward that keeps one
    layer input into backward and frees another before it (its copy completed); a backward that
    reads an input back, recomputes, makes a gradient that outlives the step and frees a block
    another stream still uses."""
    t = Trace()
    t.mark(0)
    t.alloc(100 * MiB, 8 * MiB, frames("block_output"))  # held into backward
    t.alloc(200 * MiB, 8 * MiB, frames("block_output"))  # freed before backward
    t.alloc(300 * MiB, 4 * MiB, frames("forward"))
    t.free(300 * MiB, 4 * MiB)
    t.free(200 * MiB, 8 * MiB)
    t.mark(1)
    t.alloc(400 * MiB, 8 * MiB, frames("empty", "spillarena/device_copies.py"))
    t.alloc(500 * MiB, 2 * MiB, frames("block_output"))  # recomputed
    t("segment_alloc", 2 << 30, 20 * MiB)
    t.alloc(600 * MiB, 2 * MiB)  # autograd's kernels: no Python frame
    t.alloc(700 * MiB, 1 * MiB)  # a grad
    t.free(500 * MiB, 2 * MiB)   # the peak was just before this: 69 MiB
    t.free(600 * MiB, 2 * MiB, completed=False)  # another stream may still use it
    t.free(400 * MiB, 8 * MiB)
    t.free(100 * MiB, 8 * MiB)
    t.free(50 * MiB, 16 * MiB)  # allocated before the trace
    t.mark(2)
    blocks = [
        {"address": 10 * MiB, "size": 32 * MiB, "requested_size": 32 * MiB,
         "state": "active_allocated", "frames": []},
        {"address": 600 * MiB, "size": 2 * MiB, "requested_size": 2 * MiB,
         "state": "active_pending_free", "frames": []},
        {"address": 700 * MiB, "size": 1 * MiB, "requested_size": 1 * MiB,
         "state": "active_allocated", "frames": []},
    ]
    segments = [{"device": 0, "address": 0, "total_size": 1 << 30, "stream": 0,
                 "segment_type": "large", "allocated_size": 33 * MiB, "active_size": 35 * MiB,
                 "blocks": blocks},
                {"device": 1, "address": 0, "total_size": 1 << 30, "blocks": []}]
    return {"segments": segments, "device_traces": [t.events, []]}


def test_the_peak_is_found_and_every_block_there_has_one_owner():
    owners, r = rules()
    peak = owners.at_peak(backward_peak_snapshot(), 0, r,
                          known=[("weights", [10 * MiB]), ("grads", [700 * MiB + 4096])],
                          phase_names=("forward", "backward", "end"))
    got = {name: o["bytes"] // MiB for name, o in peak["owners"].items() if o["bytes"]}
    assert got == {"weights": 32, "grads": 1, "layer_inputs_held": 8, "restored_inputs": 8,
                   "recompute": 2, "backward": 2, "before_step": 16}
    assert peak["allocated_bytes"] == 69 * MiB and owners.check_sum(peak)
    assert peak["phase"] == "backward"
    # reserved: the snapshot's device-0 gigabyte, no segment added after the peak
    assert peak["reserved_bytes"] == 1 << 30
    assert peak["allocator_cache_bytes"] == (1 << 30) - 69 * MiB
    assert peak["pending_free_bytes"] == 0
    assert {k: v // MiB for k, v in peak["peak_bytes_per_phase"].items()} == \
        {"before_phases": 48, "forward": 68, "backward": 69, "end": 33}
    assert peak["end_allocated_bytes"] == 33 * MiB
    assert peak["bytes_per_stream"] == {"0": 21 * MiB, "before the trace": 48 * MiB}
    assert peak["largest"][0] == {"bytes": 32 * MiB, "owner": "weights",
                                  "where": "(no Python frame)"}
    assert "device_copies.py:1 empty" in [b["where"] for b in peak["largest"]]


def test_a_forward_peak_shows_the_copies_in_flight_and_what_another_stream_holds():
    owners, r = rules()
    t = Trace()
    t.mark(0)
    t.alloc(310 * MiB, 2 * MiB, frames("forward"))
    t.free(310 * MiB, 2 * MiB, completed=False)  # another stream still uses it
    t.alloc(100 * MiB, 8 * MiB, frames("block_output"))
    t.alloc(200 * MiB, 8 * MiB, frames("block_output"))
    t.alloc(300 * MiB, 4 * MiB, frames("forward"))
    t("segment_alloc", 2 << 30, 64 * MiB)  # the cache grows after the peak
    t.free(300 * MiB, 4 * MiB)
    t.free(100 * MiB, 8 * MiB)  # its copy to the host completed
    t.mark(1)
    t.alloc(400 * MiB, 1 * MiB)
    t.free(400 * MiB, 1 * MiB)
    t.free(200 * MiB, 8 * MiB)
    t.mark(2)
    # The older block format: frames inside "history".
    block = {"address": 310 * MiB, "size": 2 * MiB, "state": "active_pending_free",
             "history": [{"addr": 310 * MiB, "real_size": 2 * MiB, "frames": []}]}
    snapshot = {"segments": [{"address": 0, "total_size": 512 * MiB, "blocks": [block]}],
                "device_traces": [t.events]}
    peak = owners.at_peak(snapshot, 0, r, phase_names=("forward", "backward", "end"))
    got = {name: o["bytes"] // MiB for name, o in peak["owners"].items() if o["bytes"]}
    assert got == {"layer_inputs_held": 8, "copies_in_flight": 8, "forward_working": 4}
    assert peak["phase"] == "forward" and peak["allocated_bytes"] == 20 * MiB
    assert peak["pending_free_bytes"] == 2 * MiB
    assert peak["reserved_bytes"] == 512 * MiB - 64 * MiB  # what came after the peak, less
    assert owners.check_sum(peak)
    assert "inputs held" in owners.table([("disk_direct", peak)])


def test_a_trace_that_began_mid_step_still_accounts_for_every_byte():
    owners, r = rules()
    t = Trace()  # no markers, no allocs: only frees of blocks from before the trace
    t("free_completed", 5 * MiB, 1 * MiB)  # requested before the trace began
    t.free(10 * MiB, 4 * MiB)
    t.alloc(20 * MiB, 2 * MiB, frames("forward"))
    snapshot = {"segments": [{"address": 0, "total_size": 64 * MiB, "blocks": [
        {"address": 20 * MiB, "size": 2 * MiB, "state": "active_allocated", "frames": []},
        {"address": 30 * MiB, "size": 3 * MiB, "state": "active_allocated", "frames": []}]}],
        "device_traces": [t.events]}
    peak = owners.at_peak(snapshot, 0, r)
    assert peak["peak_event"] == -1 and peak["allocated_bytes"] == 7 * MiB  # before the frees
    assert peak["owners"]["before_step"]["bytes"] == 7 * MiB and owners.check_sum(peak)
    assert peak["pending_free_bytes"] == 1 * MiB
    assert peak["end_allocated_bytes"] == 5 * MiB


# ---------------------------------------------------------------------------------------------
# gpu_peak_snapshot.py


def test_gpu_peak_snapshot_runs_every_mode_and_pool_size_on_the_cpu(tmp_path, spill_dir):
    out = tmp_path / "peaks.json"
    done = subprocess.run([sys.executable, os.path.join(BENCH, "gpu_peak_snapshot.py"),
                           "--device", "cpu", "--dry-run", "--pool-modes", "disk_direct",
                           "--pool-factors", "1,4", "--steps", "2", "--spill-dir", str(spill_dir),
                           "--commit", "abc123", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["commit"] == "abc123" and re.match(r"\d{4}-\d\d-\d\dT", report["date"])
    runs = {(r["mode"], r["pool_factor"]): r for r in report["runs"]}
    assert list(runs) == [("recompute", 0), ("ram", 0), ("disk_async", 0), ("disk_direct", 0),
                          ("disk_direct", 1), ("disk_direct", 4)]
    for (mode, factor), r in runs.items():
        assert "error" not in r, r
        assert len(r["step_ms"]) == 2 and r["vs_recompute"] > 0
        assert "needs CUDA" in r["peak"]["skipped"]
        if mode == "recompute":
            assert r["stash"] is None
            continue
        assert r["inputs_spilled_per_step"] == 2  # 3 blocks, keep_last 1
        assert {"copy_waits", "host_pool_grows", "inputs_back_before_copied"} <= set(r["stash"])
        expected = factor * r["default_pool_bytes"] if factor else None
        assert r["options"].get("host_pool_bytes") == expected
    assert runs[("recompute", 0)]["default_pool_bytes"] == 64 * MiB  # the floor, tiny inputs
    assert "disk_direct/pool_x4" in done.stdout
    assert os.listdir(spill_dir) == []


def test_gpu_peak_snapshot_records_one_step_through_torchs_recording_api(monkeypatch):
    snap = load("gpu_peak_snapshot.py")
    memory = torch.cuda.memory
    calls = []

    def record(*args, **kwargs):
        inspect.signature(real_record).bind(*args, **kwargs)  # as torch's own would take them
        calls.append(kwargs)

    # _record_memory_history(enabled, *args, **kwargs) passes them on to this one
    real_record = getattr(memory, "_record_memory_history_impl", memory._record_memory_history)
    fake = backward_peak_snapshot()
    monkeypatch.setattr(memory, "_record_memory_history", record)
    monkeypatch.setattr(memory, "_snapshot", lambda *a, **k: json.loads(json.dumps(fake)))
    for name, value in (("synchronize", None), ("reset_peak_memory_stats", None),
                        ("max_memory_allocated", 69 * MiB), ("current_device", 0)):
        monkeypatch.setattr(torch.cuda, name, lambda *a, _v=value, **k: _v)
    import spillarena

    args = snap.parse_args(["--device", "cpu", "--dry-run"])
    blocks = snap.build_blocks(args, torch, torch.device("cpu"), torch.float32)
    x0 = torch.randn(args.batch, args.seq, args.hidden)
    peak, raw = snap.recorded_step(args, blocks, x0, spillarena.make_in_memory_stash(), torch,
                                   spillarena)
    assert calls[0]["stacks"] == "python" and calls[0]["max_entries"] == args.max_entries
    assert calls[-1] == {"enabled": None}  # recording stopped
    assert peak["allocated_bytes"] == 69 * MiB and peak["replay_matches_allocator"]
    assert peak["owners_add_up"] and not peak["trace_truncated"]
    known = dict(raw["spillarena"]["known"])
    assert len(known["weights"]) == len(list(blocks.parameters())) == len(known["grads"])
    assert all(p.grad is None for p in blocks.parameters())  # zeroed after the snapshot


def test_gpu_peak_snapshot_classifies_a_saved_tar_again(tmp_path):
    snapshot = backward_peak_snapshot()
    snapshot["spillarena"] = {"device": 0, "known": [("weights", [10 * MiB])],
                              "phases": ["forward", "backward", "end"], "unit": 512}
    member = tmp_path / "disk_direct.pickle.gz"
    with gzip.open(member, "wb") as f:
        pickle.dump(snapshot, f)
    raw = tmp_path / "raw.tar"
    with tarfile.open(raw, "w") as tar:
        tar.add(member, arcname=member.name)
    done = subprocess.run([sys.executable, os.path.join(BENCH, "gpu_peak_snapshot.py"),
                           "--classify", str(raw)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    row = next(ln for ln in done.stdout.splitlines() if ln.startswith("disk_direct"))
    assert row.split()[1:5] == ["0.07", "1.00", "0.00", "backward"], done.stdout


def test_the_raw_snapshots_stay_under_what_a_device_call_returns(tmp_path):
    snap = load("gpu_peak_snapshot.py")
    raw_dir = tmp_path / "raw"
    raw_dir.mkdir()
    for i, name in enumerate(("recompute", "ram", "disk_async")):
        (raw_dir / f"{name}.pickle.gz").write_bytes(b"x" * 4000)
        os.utime(raw_dir / f"{name}.pickle.gz", (i, i))  # made in this order
    left_out = snap.write_raw(str(raw_dir), str(tmp_path / "raw.tar"), limit=10_500)
    assert left_out == ["disk_async.pickle.gz"]
    with tarfile.open(tmp_path / "raw.tar") as tar:
        assert tar.getnames() == ["recompute.pickle.gz", "ram.pickle.gz"]
    assert snap.RAW_LIMIT_BYTES < 16 << 20


@pytest.mark.parametrize("argv, message", [
    (["--pool-factors", "0"], "outside 1 to 64"),
    (["--pool-factors", "1,,2"], "empty item"),
    (["--modes", "recompute,disk"], "choose from"),
    (["--hidden", "100", "--heads", "3"], "multiple of --heads"),
    (["--deadline-s", "nan"], "not a finite"),
    (["--steps", "-1"], "outside 1 to 100"),
    (["--seq", "1048576", "--batch", "4096"], "at most 2^36"),
])
def test_gpu_peak_snapshot_refuses_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit):
        load("gpu_peak_snapshot.py").parse_args(argv)
    assert message in capsys.readouterr().err


def test_gpu_peak_snapshot_without_cuda_says_what_to_run_instead():
    done = subprocess.run([sys.executable, os.path.join(BENCH, "gpu_peak_snapshot.py"),
                           "--device", "cpu"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--device cpu --dry-run" in done.stderr


# ---------------------------------------------------------------------------------------------
# longest_sequence.py


def linear_card(boundary_tokens, base=14e9, per_token=300e3, budget=24e9):
    """attempt() of a card whose peak grows by per_token from base, failing past the budget;
    (attempt, the lengths tried)."""
    tried = []

    def attempt(seq):
        tried.append(seq)
        peak = base + per_token * seq
        return (True, peak) if seq <= boundary_tokens else (False, None)
    return attempt, tried


def test_the_search_fits_a_line_and_needs_few_trials():
    search = load("longest_sequence.py").search_length
    # the budget's boundary where the line crosses 97 % of 24 GB: (23.28e9 - 14e9) / 300e3
    attempt, tried = linear_card(boundary_tokens=30_900)
    found = search(attempt, 2048, 1024, 262144, budget=24e9)
    assert found["largest_ok"] == 30_720 and found["first_failed"] == 31_744
    assert len(tried) <= 5, tried  # doubling and bisecting from 2048 take 9
    assert found["trials"] == tried and not found["capped"] and not found["incomplete"]


@pytest.mark.parametrize("boundary", [1000, 2047, 3000, 9000, 50_000, 100_000])
def test_the_search_finds_the_boundary_when_the_line_is_wrong(boundary):
    """A card the line misjudges (memory that jumps, or a budget far from the peaks): the search
    still ends within one granularity of the truth, by bisection after two misses."""
    search = load("longest_sequence.py").search_length
    attempt, tried = linear_card(boundary_tokens=boundary)
    found = search(attempt, 2048, 1024, 262144, budget=24e9)
    ok, failed = found["largest_ok"], found["first_failed"]
    assert ok <= boundary < failed and failed - ok <= 1024, (found, tried)
    assert len(tried) <= 12, tried


def test_the_search_stops_at_the_cap_and_when_asked():
    search = load("longest_sequence.py").search_length
    attempt, tried = linear_card(boundary_tokens=10**9)
    found = search(attempt, 2048, 1024, 16384, budget=24e9)
    assert found["capped"] and found["largest_ok"] == 16384 and tried[-1] == 16384

    calls = []

    def stop_at_third(seq):
        calls.append(seq)
        return None if len(calls) == 3 else (True, 1e9 * seq)
    found = search(stop_at_third, 2048, 1024, 262144, budget=24e9)
    assert found["incomplete"] and found["largest_ok"] == max(calls[:2])


def test_the_search_reports_nothing_trained_when_even_the_smallest_length_fails():
    search = load("longest_sequence.py").search_length
    attempt, tried = linear_card(boundary_tokens=0)
    found = search(attempt, 2048, 1024, 262144, budget=24e9)
    assert found["largest_ok"] == 0 and found["first_failed"] == 1024 and tried == [2048, 1024]


@pytest.mark.parametrize("argv, message", [
    (["--device-memory-gb", "nan"], "not a finite"),
    (["--device-memory-gb", "0"], "outside 0.5 to 4096 GB"),
    (["--modes", "none,none"], "names a mode twice"),
    (["--modes", "recompute"], "unknown mode"),
    (["--steps", "0"], "outside 1 to 100"),
    (["--start-seq", "4096", "--max-seq", "2048"], "must not exceed"),
    (["--trial-timeout-s", "inf"], "not a finite"),
])
def test_longest_sequence_refuses_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit):
        load("longest_sequence.py").parse_args(argv)
    assert message in capsys.readouterr().err


def test_longest_sequence_runs_transformers_offload_and_ours_on_the_cpu(tmp_path, spill_dir):
    pytest.importorskip("transformers")
    out = tmp_path / "longest.json"
    done = subprocess.run([sys.executable, os.path.join(BENCH, "longest_sequence.py"),
                           "--device", "cpu", "--smoke", "--max-seq", "256", "--start-seq", "128",
                           "--modes", "hf_checkpointing,hf_offload,spillarena_direct",
                           "--spill-dir", str(spill_dir), "--commit", "abc123", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["commit"] == "abc123" and re.match(r"\d{4}-\d\d-\d\dT", report["date"])
    modes = report["modes"]
    for mode, state in modes.items():
        assert state["largest_ok_seq"] == 256 and state["capped"], (mode, state)
        at = state["at_longest"]
        assert len(at["step_ms"]) == 2 and at["host_peak_rss_bytes"] > 0, at
        assert at["ms_per_1k_tokens"] > 0
    function = {m: modes[m]["trials"][0]["checkpoint_function"]
                for m in ("hf_checkpointing", "hf_offload")}
    assert function["hf_checkpointing"] == "torch.utils.checkpoint.checkpoint"
    assert "checkpoint_func" in function["hf_offload"]  # transformers' offload wrapper
    assert modes["spillarena_direct"]["trials"][-1]["stash"]["inputs_spilled"] > 0
    assert modes["spillarena_direct"]["ratio_vs_hf_checkpointing"] == 1.0
    pairs = {tuple(row["modes"]): row for row in report["same_length"]}
    assert set(pairs) == {("spillarena_direct", "hf_checkpointing"),
                          ("spillarena_direct", "hf_offload")}
    assert all(row["measured"] and row["seq"] == 256 for row in pairs.values())
    assert "host_rss_below" in pairs[("spillarena_direct", "hf_offload")]
    assert "commit abc123" in done.stdout


def test_longest_sequence_skips_gds_without_libcufile_before_any_trial(tmp_path, spill_dir):
    missing = str(tmp_path / "no-such-libcufile.so.0")
    out = tmp_path / "longest.json"
    env = dict(os.environ, SPILLARENA_CUFILE_LIBRARY=missing)
    script = os.path.join(BENCH, "longest_sequence.py")
    done = subprocess.run([sys.executable, script, "--device", "cpu", "--smoke",
                           "--modes", "spillarena_gds", "--spill-dir", str(spill_dir),
                           "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    gds = report["modes"]["spillarena_gds"]
    assert gds["trials"] == []  # no model was built to find out
    assert gds["skipped"].startswith("GdsUnavailableError") and missing in gds["skipped"], gds
    assert report["goal_met"] == {"spillarena_gds": None}
    assert "spillarena_gds     skipped: GdsUnavailableError" in done.stdout, done.stdout


# ---------------------------------------------------------------------------------------------
# gpu_head_to_head.py (no longer in gpu-check.sh's two calls; kept working)


def test_gpu_head_to_head_runs_on_the_cpu_with_equal_losses(tmp_path, spill_dir):
    pytest.importorskip("transformers")
    out = tmp_path / "h2h.json"
    argv = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
            "--intermediate", "128", "--vocab", "128", "--seq", "32", "--steps", "1",
            "--spill-dir", spill_dir, "--out", str(out)]
    for extra in ([], ["--append", "--seq", "48", "--modes", "none"]):  # a second length, same file
        script = os.path.join(BENCH, "gpu_head_to_head.py")
        done = subprocess.run([sys.executable, script, *argv, *extra],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    runs = json.loads(out.read_text())["runs"]
    assert [r["args"]["seq"] for r in runs] == [32, 48]
    results = {r["mode"]: r for r in runs[0]["results"]}
    assert set(results) == set(load("gpu_head_to_head.py").MODES)
    first = runs[0]["results"][0]["losses"]
    for mode in ("none", "hf_checkpointing", "hf_offload", "spillarena_direct"):
        assert results[mode]["losses_equal_to_first"] is (results[mode]["losses"] == first), mode
    # The losses of ours are transformers' own checkpointing's in the same run, and no
    # checkpointing's (the first mode) where those are.
    assert_as_torch(results["spillarena_direct"]["losses"], results["hf_checkpointing"]["losses"],
                    results["none"]["losses"])
    assert results["spillarena_direct"]["spilled_bytes_per_step"] > 0
    gds = results["spillarena_gds"]
    assert "losses" in gds or re.search("cufile|gds", gds.get("skipped", ""), re.I), gds
    assert [r["mode"] for r in runs[1]["results"]] == ["none"] and "losses" in runs[1]["results"][0]
    assert os.listdir(spill_dir) == []  # each run's spill directory went with it

