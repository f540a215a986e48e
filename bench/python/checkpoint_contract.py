"""What the drop-in checkpoint contract costs and saves (issue 39), in one process.

    .venv/bin/python bench/python/checkpoint_contract.py early_stop
    .venv/bin/python bench/python/checkpoint_contract.py overhead [--label NAME]
    .venv/bin/python bench/python/checkpoint_contract.py selective

early_stop: a layer whose tail backward does not need (a statistic computed under no_grad, as
a layer that logs or tracks a metric has), checkpointed through spillarena.checkpoint on a
disk arena, with torch's default early stop and with set_checkpoint_early_stop(False), in
alternating rounds. Prints the tail's runs per recomputation (a counter in the layer) and the
median step time of each, and their ratio.

selective: one MLP layer (8 MiB input, 4x wide) through spillarena.checkpoint with a
selective-checkpoint policy that keeps the matmul outputs (context_fn; they stay in memory, in
torch's cache) against no policy (everything recomputed from the spilled input), alternating:
median step time and the peak of process RSS growth over the step.

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


def _peak_rss_growth(fn):
    """Seconds ``fn`` took and the most the process's resident memory grew meanwhile (bytes),
    sampled every millisecond by a thread."""
    import threading

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    base, peak, done = rss(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss() - base)
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    return seconds, peak[0]


def selective(_args):
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    def keep_matmuls(ctx, op, *args, **kwargs):
        return (CheckpointPolicy.MUST_SAVE if op in (torch.ops.aten.mm.default,
                                                     torch.ops.aten.addmm.default)
                else CheckpointPolicy.PREFER_RECOMPUTE)

    torch.manual_seed(0)
    width, rows = 1024, 2048
    layer = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                torch.nn.Linear(4 * width, width))
    x0 = torch.randn(rows, width)
    options = {"no policy": {},
               "keep matmuls": {"context_fn": lambda: create_selective_checkpoint_contexts(
                   keep_matmuls)}}
    with tempfile.TemporaryDirectory(dir=spillarena.default_spill_directory()) as directory:
        arena = spillarena.SpillArena(64 << 20, directory, keep_last=0)

        def step(name):
            x = x0.clone().requires_grad_()
            spillarena.checkpoint(layer, x, arena=arena, **options[name]).pow(2).mean().backward()
            layer.zero_grad(set_to_none=True)

        results = {name: [] for name in options}
        for name in options:
            step(name)  # warm-up
        for r in range(ROUNDS):
            for name in (list(options) if r % 2 == 0 else list(reversed(options))):
                results[name].append(_peak_rss_growth(lambda n=name: step(n)))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, one MLP layer "
          f"{rows}x{width} -> {4 * width} -> {width} float32, input spilled to disk, "
          f"{ROUNDS} alternating rounds (medians)")
    for name, runs in results.items():
        seconds = statistics.median(s for s, _ in runs)
        growth = statistics.median(g for _, g in runs)
        print(f"{name:13s}: step {seconds * 1e3:7.1f} ms, "
              f"peak RSS growth {growth / 2**20:6.1f} MiB")


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
    parser.add_argument("part", choices=["early_stop", "overhead", "selective"])
    parser.add_argument("--label", default="this package")
    args = parser.parse_args()
    torch.set_num_threads(2)
    {"early_stop": early_stop, "overhead": overhead, "selective": selective}[args.part](args)


if __name__ == "__main__":
    main()
