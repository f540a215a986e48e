"""What the drop-in checkpoint contract costs and saves (issue 39), in one process.

    .venv/bin/python bench/python/checkpoint_contract.py early_stop
    .venv/bin/python bench/python/checkpoint_contract.py overhead [--label NAME]

early_stop: a layer whose tail backward does not need (a statistic computed under no_grad, as
a layer that logs or tracks a metric has), checkpointed through spillarena.checkpoint on a
disk arena, with torch's default early stop and with set_checkpoint_early_stop(False), in
alternating rounds. Prints the tail's runs per recomputation (a counter in the layer) and the
median step time of each, and their ratio.

overhead: per-call time of spillarena.checkpoint for a one-tensor call (64 KiB input, x.sin(),
forward and backward) through make_in_memory_stash(), so only the Python boundary is timed.
Run it under two versions of the package (PYTHONPATH) to compare them; --label names the run.
"""

import argparse
import statistics
import tempfile
import time

import torch
import torch.utils.checkpoint as torch_checkpoint

import spillarena

ROUNDS = 7


class HeadAndTail(torch.nn.Module):
    """Backward needs the head; the tail computes a statistic under no_grad (a layer that logs
    or tracks a metric): it saves nothing, so early stop ends the recomputation before it."""

    def __init__(self, width):
        super().__init__()
        self.head = torch.nn.Linear(width, width)
        self.tail = torch.nn.Linear(width, width)
        self.tail_runs = 0

    def forward(self, x):
        y = torch.nn.functional.gelu(self.head(x))
        self.tail_runs += 1
        with torch.no_grad():
            statistic = self.tail(y).softmax(-1).amax()
        return y, statistic


def early_stop_step(layers, x, arena, early_stop):
    for layer in layers:
        layer.tail_runs = 0
    start = time.perf_counter()
    with torch_checkpoint.set_checkpoint_early_stop(early_stop):
        h = x
        for layer in layers:
            h, _ = spillarena.checkpoint(layer, h, arena=arena)
        h.pow(2).mean().backward()
    seconds = time.perf_counter() - start
    recomputed_tails = sum(layer.tail_runs for layer in layers) - len(layers)
    return seconds, recomputed_tails / len(layers)


def early_stop(_args):
    torch.manual_seed(0)
    width, rows, depth = 1024, 2048, 8
    layers = [HeadAndTail(width) for _ in range(depth)]
    x = torch.randn(rows, width, requires_grad=True)
    with tempfile.TemporaryDirectory(dir=spillarena.default_spill_directory()) as directory:
        arena = spillarena.SpillArena(depth * rows * width * 4 * 2, directory, keep_last=0)
        times = {True: [], False: []}
        tails = {}
        for enabled in (True, False):  # warm-up
            early_stop_step(layers, x, arena, enabled)
        for r in range(ROUNDS):
            for enabled in ((True, False) if r % 2 == 0 else (False, True)):
                seconds, tails[enabled] = early_stop_step(layers, x, arena, enabled)
                times[enabled].append(seconds)
        del arena
    on, off = statistics.median(times[True]), statistics.median(times[False])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {depth} layers of "
          f"{rows}x{width} float32 inputs ({rows * width * 4 >> 20} MiB each), disk arena, "
          f"{ROUNDS} alternating rounds (medians)")
    print(f"early stop on : step {on * 1e3:8.1f} ms, tail runs per recomputation {tails[True]}")
    print(f"early stop off: step {off * 1e3:8.1f} ms, tail runs per recomputation {tails[False]}")
    print(f"on / off: {on / off:.3f}")


def overhead(args):
    stash = spillarena.make_in_memory_stash()
    x0 = torch.randn(16 * 1024)  # 64 KiB
    calls = 2000

    def round_():
        start = time.perf_counter()
        for _ in range(calls):
            x = x0.clone().requires_grad_()
            spillarena.checkpoint(torch.sin, x, arena=stash).sum().backward()
        return (time.perf_counter() - start) / calls

    round_()  # warm-up
    per_call = statistics.median(round_() for _ in range(ROUNDS))
    print(f"{args.label}: {per_call * 1e6:.1f} us per checkpointed call (forward + backward, "
          f"64 KiB input, in-memory stash, median of {ROUNDS} rounds of {calls})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("part", choices=["early_stop", "overhead"])
    parser.add_argument("--label", default="this package")
    args = parser.parse_args()
    torch.set_num_threads(2)
    {"early_stop": early_stop, "overhead": overhead}[args.part](args)


if __name__ == "__main__":
    main()
