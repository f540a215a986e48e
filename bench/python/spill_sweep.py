"""What spilling costs as the layer input grows (issue 40): spillarena's step ÷ in-RAM
checkpointing's step, in one process, per input size.

    .venv/bin/python bench/python/spill_sweep.py [--mib 1,8,32,64,128] [--layers 4]
        [--rounds 3] [--steps 2] [--min-block-s 0.5] [--dir /var/tmp] [--hash/--no-hash]

A stack of --layers blocks (LayerNorm, Linear 256 -> 256, GELU, a residual), each checkpointed;
the batch is chosen so that each block's input is the given MiB (1024 rows of 256 float32 per
MiB). Per size and round, in alternating order: torch.utils.checkpoint (non-reentrant: the input
stays in memory) and spillarena.checkpoint on a disk arena (buffered, sized for the step, the
default malloc policy), one warm-up and at least --steps timed steps each, more until the timed
steps last --min-block-s (small inputs get many steps). Prints, per size, the median step of
each, the median of the rounds' ratios (each round's median spilled step over its median in-RAM
step) with every round's, the ratio of the fastest steps (noise on a shared machine only adds
time, so the fastest steps are the least disturbed), and for spillarena the per-step counters from
the arena and its stash: bytes written and read, restores that waited and the time waited,
waits for room in the host budget, staging waits, bytes hashed and verified, and malloc trims.
The breakdown names where the spill's time goes; docs/benchmarks.md, "What spilling costs as the
input grows", has a run.
"""

import argparse
import statistics
import tempfile
import time

import torch
import torch.utils.checkpoint as torch_checkpoint
from bench_args import count, counts, seconds

import spillarena

HIDDEN = 256
ROWS_PER_MIB = (1 << 20) // (HIDDEN * 4)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.linear = torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.linear(self.norm(x)))


def step(blocks, x, checkpoint):
    h = x
    for block in blocks:
        h = checkpoint(block, h)
    h.float().pow(2).mean().backward()


def timed(blocks, x, checkpoint, steps, min_block_s, run=None):
    """Seconds of each timed step: at least `steps`, and more until they add up to min_block_s.
    `run` replaces `step` (tests)."""
    run = run or step
    run(blocks, x, checkpoint)  # warm-up: the arena's regions, the allocator
    times, total = [], 0.0
    while len(times) < steps or total < min_block_s:
        start = time.perf_counter()
        run(blocks, x, checkpoint)
        times.append(time.perf_counter() - start)
        total += times[-1]
    return times


def counters(arena):
    a, s, m = arena.stats(), arena.stash_stats(), spillarena.malloc.state()
    return {"written": a["bytes_written"], "read": a["bytes_read"],
            "hashed": a["bytes_hashed"], "verified": a["bytes_verified"],
            "staging_wait_ns": a["staging_wait_ns"], "restore_waits": s["restore_waits"],
            "restore_wait_ns": s["restore_wait_ns"], "pool_wait_ns": s["pool_wait_ns"],
            "restores": s["restores"], "trims": m.get("trims", 0)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=counts(1, 4096), default=[1, 8, 32, 64, 128],
                   help="layer input sizes, comma-separated MiB")
    p.add_argument("--layers", type=count(1, 256), default=4)
    p.add_argument("--rounds", type=count(1, 1000), default=3)
    p.add_argument("--steps", type=count(1, 100_000), default=2)
    p.add_argument("--min-block-s", type=seconds(0, 600), default=0.5)
    p.add_argument("--dir", default="/var/tmp")
    p.add_argument("--hash", action=argparse.BooleanOptionalAction, default=True)
    args = p.parse_args()
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(Block() for _ in range(args.layers))

    print("MiB\tin-RAM ms\tspill ms\tspill/in-RAM (rounds)\tfastest steps' ratio\tsteps\t"
          "per spilled step: written MiB, read MiB, restore waits (ms), pool wait ms, "
          "staging wait ms, hashed MiB, trims")
    for mib in args.mib:
        sweep_one(args, blocks, mib)


def in_ram(block, h):
    return torch_checkpoint.checkpoint(block, h, use_reentrant=False)


def sweep_one(args, blocks, mib):
    """One input size: the rounds, then its line."""
    x = torch.randn(mib * ROWS_PER_MIB, HIDDEN, requires_grad=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        steps, ratios, per_step = alternate(args, blocks, x, directory)
    c = per_step
    print(f"{mib}\t{statistics.median(steps['ram']) * 1e3:.0f}\t"
          f"{statistics.median(steps['spill']) * 1e3:.0f}\t"
          f"{statistics.median(ratios):.3f} ({', '.join(f'{v:.2f}' for v in ratios)})\t"
          f"{min(steps['spill']) / min(steps['ram']):.3f}\t"
          f"{len(steps['ram'])}+{len(steps['spill'])}\t"
          f"{c['written'] / 2**20:.0f}, {c['read'] / 2**20:.0f}, "
          f"{c['restore_waits']:.1f} ({c['restore_wait_ns'] / 1e6:.1f}), "
          f"{c['pool_wait_ns'] / 1e6:.1f}, {c['staging_wait_ns'] / 1e6:.1f}, "
          f"{c['hashed'] / 2**20:.0f}, {c['trims']:.1f}", flush=True)


def alternate(args, blocks, x, directory):
    """The rounds, in-RAM and spilled in alternating order, on an arena in `directory`: the step
    times of each kind, each round's ratio and the last spilled block's counters per step. The
    arena is closed when this returns, before its directory goes."""
    arena = spillarena.SpillArena(
        spillarena.bytes_for_layer_inputs(args.layers, (1, *x.shape), torch.float32),
        directory, verify_integrity=args.hash)

    def spilled(block, h):
        return spillarena.checkpoint(block, h, arena=arena)

    steps = {"ram": [], "spill": []}
    ratios, per_step = [], None
    for r in range(args.rounds):
        order = [("ram", in_ram), ("spill", spilled)]
        if r % 2:
            order.reverse()
        got = {}
        for name, checkpoint in order:
            before = counters(arena)
            got[name] = timed(blocks, x, checkpoint, args.steps, args.min_block_s)
            if name == "spill":
                after = counters(arena)
                n = len(got[name]) + 1  # and the warm-up
                per_step = {k: (after[k] - before[k]) / n for k in after}
            steps[name] += got[name]
        ratios.append(statistics.median(got["spill"]) / statistics.median(got["ram"]))
    return steps, ratios, per_step


if __name__ == "__main__":
    main()
