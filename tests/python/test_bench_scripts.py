"""The issue-40 benchmark scripts refuse bad numbers before running anything, and the sweep runs
end to end at a tiny size (its figures are in docs/benchmarks.md; this only keeps it working).
"""

import argparse
import math
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "bench", "python")
sys.path.insert(0, BENCH)
from bench_args import count, counts, seconds  # noqa: E402


@pytest.mark.parametrize("text, message", [
    ("x", "'x' is not a whole number"), ("1.5", "'1.5' is not a whole number"),
    ("0", "0 is outside 1 to 10"), ("-3", "-3 is outside 1 to 10"),
    ("11", "11 is outside 1 to 10"), (str(2**70), f"{2**70} is outside 1 to 10"),
])
def test_count_refuses_each_class(text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        count(1, 10)(text)


def test_count_and_counts_take_the_bounds():
    assert count(1, 10)("1") == 1 and count(1, 10)("10") == 10
    assert counts(1, 10)("1, 8,10") == [1, 8, 10]
    with pytest.raises(argparse.ArgumentTypeError, match="'1,,2' has an empty item"):
        counts(1, 10)("1,,2")
    with pytest.raises(argparse.ArgumentTypeError, match="11 is outside 1 to 10"):
        counts(1, 10)("1,11")


@pytest.mark.parametrize("text, message", [
    ("nan", "'nan' is not a finite number"), ("inf", "'inf' is not a finite number"),
    ("-inf", "'-inf' is not a finite number"), ("1e400", "'1e400' is not a finite number"),
    ("-0.5", "-0.5 is outside 0 to 600"), ("601", "601 is outside 0 to 600"),
    ("soon", "'soon' is not a number of seconds"),
])
def test_seconds_refuses_each_class(text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        seconds(0, 600)(text)


def test_seconds_takes_the_bounds():
    assert seconds(0, 600)("0") == 0 and seconds(0, 600)("600") == 600
    assert math.isclose(seconds(0, 600)("0.25"), 0.25)


def test_timed_runs_past_steps_until_the_block_lasts_min_block_s(monkeypatch):
    import spill_sweep

    clock = [0.0]  # a step of 1/8 s each, whatever the machine's load
    monkeypatch.setattr(spill_sweep.time, "perf_counter", lambda: clock[0])
    calls = []

    def eighth_of_a_second(blocks, x, checkpoint):
        calls.append(checkpoint)
        clock[0] += 0.125

    times = spill_sweep.timed(None, None, "c", 2, 1.0, run=eighth_of_a_second)
    assert len(calls) == len(times) + 1  # the warm-up is not timed
    assert times == [0.125] * 8  # past the 2 steps asked for, until the block lasts 1 s
    assert len(spill_sweep.timed(None, None, "c", 3, 0.0, run=eighth_of_a_second)) == 3


def run(script, *args):
    return subprocess.run([sys.executable, os.path.join(BENCH, script), *args],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("script, args, message", [
    ("spill_sweep.py", ["--mib", "1,x"], "--mib: 'x' is not a whole number"),
    ("spill_sweep.py", ["--min-block-s", "nan"], "--min-block-s: 'nan' is not a finite"),
    ("spill_sweep.py", ["--rounds", "0"], "--rounds: 0 is outside 1 to 1000"),
    ("fixed_cost.py", ["--steps", "-1"], "--steps: -1 is outside 10 to 100000"),
])
def test_scripts_refuse_bad_numbers_with_the_option(script, args, message):
    done = run(script, *args)
    assert done.returncode == 2
    assert message in done.stderr


def test_sweep_runs_with_counters_per_step(tmp_path):
    done = run("spill_sweep.py", "--mib", "1", "--layers", "2", "--rounds", "2", "--steps", "1",
               "--min-block-s", "0.05", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    _header, line = done.stdout.strip().splitlines()
    fields = line.split("\t")
    assert fields[0] == "1"
    ram_steps, spill_steps = (int(n) for n in fields[5].split("+"))
    # At least one step per block and round; how many more fit in 0.05 s depends on the machine
    # (the count is tested with a stand-in clock above).
    assert ram_steps >= 2 and spill_steps >= 2
    # How fast spilling is beside in-RAM checkpointing is the machine's and its load's: only
    # that the figures are ratios of times, and the median the one of the rounds printed.
    ratio, rounds = fields[3].split(" ", 1)
    rounds = [float(r) for r in rounds.strip("()").split(", ")]
    assert len(rounds) == 2 and all(0 < r < math.inf for r in rounds)
    assert abs(float(ratio) - (rounds[0] + rounds[1]) / 2) <= 0.006  # printed to 0.01 and 0.001
    assert 0 < float(fields[4]) < math.inf  # the fastest steps' ratio
    # 1 MiB written and read back per step: of 2 layers, the last one's input stays (keep_last)
    assert fields[6].startswith("1, 1, ")


def test_offload_modes_ratios_come_from_the_medians_of_its_rounds():
    import offload_modes

    def row(mode, step, anon):
        return {"mode": mode, "step_s": step, "times_s": [step, step + 0.5],
                "peak_added_mib": anon + 10, "peak_anon_added_mib": anon, "inputs_stored": 8}

    results = [row("recompute", 2.0, 100), row("inputs", 2.2, 80), row("inputs", 2.4, 90),
               row("inputs+attention", 2.0, 88), row("offload", 1.2, 300), row("none", 1.0, 400),
               row("inputs", 9.0, 70)]  # a disturbed round: the median keeps it out
    table, ratios = offload_modes.summary(results)
    assert table["inputs"]["step_s"] == 2.4 and table["inputs"]["peak_anon_added_mib"] == 80
    assert ratios["inputs+attention_step_vs_inputs"] == pytest.approx(2.0 / 2.4)
    assert ratios["inputs+attention_anon_peak_vs_inputs"] == pytest.approx(88 / 80)
    assert ratios["offload_step_vs_none"] == pytest.approx(1.2)
    assert ratios["offload_fastest_vs_none"] == pytest.approx(1.2)
    assert table["inputs"]["fastest_s"] == 2.2  # the fastest step of any round
    assert table["recompute"]["step_vs_none"] == pytest.approx(2.0)


@pytest.mark.parametrize("hidden", ["66", "68"])
def test_offload_modes_refuses_a_width_its_heads_do_not_divide_evenly(capsys, hidden):
    import offload_modes

    with pytest.raises(SystemExit):
        offload_modes.main(["--hidden", hidden])
    assert f"--hidden {hidden} must be a multiple of 8" in capsys.readouterr().err


def test_offload_modes_ratios_of_modes_not_run_are_none_and_unknown_modes_refused(capsys):
    import offload_modes

    table, ratios = offload_modes.summary([
        {"mode": "offload", "step_s": 1.2, "times_s": [1.2], "peak_added_mib": 30,
         "peak_anon_added_mib": 26, "inputs_stored": 8},
        {"mode": "none", "step_s": 1.0, "times_s": [1.0], "peak_added_mib": 340,
         "peak_anon_added_mib": 336, "inputs_stored": 0}])
    assert ratios["offload_step_vs_none"] == pytest.approx(1.2)
    assert ratios["inputs+attention_step_vs_inputs"] is None
    assert table["offload"]["step_vs_recompute"] is None
    with pytest.raises(SystemExit):
        offload_modes.main(["--modes", "offload,everything"])
    assert "--modes: unknown everything" in capsys.readouterr().err
