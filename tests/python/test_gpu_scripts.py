"""The GPU check's Python scripts cannot rot on a machine without a GPU.

scripts/gpu-check.sh runs only where a GPU is lent (rarely), so its argument lines are parsed here
by the scripts' own parsers (gds among the modes it runs), the GPU head-to-head runs end to end on
the CPU at a tiny size, and the longest-sequence search skips gds where libcufile does not load.
"""

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import assert_as_torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = ("gpu_head_to_head.py", "longest_sequence.py")


def load(script):
    spec = importlib.util.spec_from_file_location(script[:-3],
                                                  os.path.join(REPO, "bench", "python", script))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gpu_check_argument_lines(script):
    """The arguments gpu-check.sh passes to `script`, one list per call, "$out/..." kept as text."""
    with open(os.path.join(REPO, "scripts", "gpu-check.sh")) as f:
        text = f.read().replace("\\\n", " ")
    calls = []
    for line in text.splitlines():
        at = line.find("bench/python/" + script)
        if at < 0 or line.lstrip().startswith("#"):
            continue
        words = shlex.split(line[at:].split(">>")[0].split("||")[0])
        calls.append(words[1:])
    return calls


@pytest.mark.parametrize("script", SCRIPTS)
def test_gpu_check_passes_arguments_the_script_accepts(script):
    calls = gpu_check_argument_lines(script)
    assert calls, f"scripts/gpu-check.sh no longer runs bench/python/{script}"
    parse_args = load(script).parse_args
    for argv in calls:
        parse_args(argv)  # SystemExit (argparse's error) fails the test, naming the flag


def test_gpu_check_searches_the_longest_sequence_with_gds_too():
    parse_args = load("longest_sequence.py").parse_args
    for argv in gpu_check_argument_lines("longest_sequence.py"):
        modes = parse_args(argv).modes.split(",")
        assert {"recompute", "spillarena_direct", "spillarena_gds"} <= set(modes), modes


def test_gpu_check_benchmarks_disk_gds_at_both_depths():
    with open(os.path.join(REPO, "bench", "accelerator_benchmark.cc")) as f:
        assert '"disk_gds"' in f.read(), "BM_AcceleratorStep no longer registers disk_gds"
    with open(os.path.join(REPO, "scripts", "gpu-check.sh")) as f:
        filters = re.findall(r"--benchmark_filter='([^']*)'", f.read())
    assert len(filters) == 2, filters  # 16 layers, then 8
    for pattern in filters:  # google-benchmark's filter is a regular expression, searched
        assert re.search(pattern, "BM_AcceleratorStep/disk_gds"), pattern


def test_longest_sequence_skips_gds_without_libcufile_before_any_trial(tmp_path, spill_dir):
    missing = str(tmp_path / "no-such-libcufile.so.0")
    out = tmp_path / "longest.json"
    env = dict(os.environ, SPILLARENA_CUFILE_LIBRARY=missing)
    script = os.path.join(REPO, "bench", "python", "longest_sequence.py")
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


def test_gpu_head_to_head_runs_on_the_cpu_with_equal_losses(tmp_path, spill_dir):
    pytest.importorskip("transformers")
    out = tmp_path / "h2h.json"
    argv = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
            "--intermediate", "128", "--vocab", "128", "--seq", "32", "--steps", "1",
            "--spill-dir", spill_dir, "--out", str(out)]
    for extra in ([], ["--append", "--seq", "48", "--modes", "none"]):  # a second length, same file
        script = os.path.join(REPO, "bench", "python", "gpu_head_to_head.py")
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
