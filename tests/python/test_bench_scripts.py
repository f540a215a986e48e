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
    with pytest.raises(argparse.ArgumentTypeError, match="'' is not a whole number"):
        counts(1, 10)("1,,2")


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "-0.5", "601", "1e400", "soon"])
def test_seconds_refuses_each_class(text):
    with pytest.raises(argparse.ArgumentTypeError, match=repr(text) if text == "soon" else text):
        seconds(0, 600)(text)


def test_seconds_takes_the_bounds():
    assert seconds(0, 600)("0") == 0 and seconds(0, 600)("600") == 600
    assert math.isclose(seconds(0, 600)("0.25"), 0.25)


def run(script, *args):
    return subprocess.run([sys.executable, os.path.join(BENCH, script), *args],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("script, args, message", [
    ("spill_sweep.py", ["--mib", "1,x"], "--mib: 'x' is not a whole number"),
    ("spill_sweep.py", ["--min-block-s", "nan"], "--min-block-s: nan is outside"),
    ("spill_sweep.py", ["--rounds", "0"], "--rounds: 0 is outside 1 to 1000"),
    ("fixed_cost.py", ["--steps", "-1"], "--steps: -1 is outside 10 to 100000"),
])
def test_scripts_refuse_bad_numbers_with_the_option(script, args, message):
    done = run(script, *args)
    assert done.returncode == 2
    assert message in done.stderr


def test_sweep_runs_and_leaves_nothing(tmp_path):
    done = run("spill_sweep.py", "--mib", "1", "--layers", "2", "--rounds", "2", "--steps", "1",
               "--min-block-s", "0", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    header, line = done.stdout.strip().splitlines()
    assert header.startswith("MiB\t")
    fields = line.split("\t")
    assert fields[0] == "1" and fields[5] == "2+2"  # one step per block, two rounds
    ratio, rounds = fields[3].split(" ", 1)
    assert float(ratio) > 0 and rounds.count(",") == 1
    # 1 MiB written and read back per step: of 2 layers, the last one's input stays (keep_last)
    assert fields[6].startswith("1, 1, ")
    assert list(tmp_path.iterdir()) == []
