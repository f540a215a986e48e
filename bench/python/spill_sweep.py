"""What spilling costs as the layer input grows (issue 40): spillarena's step ÷ in-RAM
checkpointing's step, in one process, per input size.

    .venv/bin/python bench/python/spill_sweep.py [--mib 1,8,32,64,128] [--layers 4]
        [--rounds 3] [--steps 2] [--dir /var/tmp] [--hash/--no-hash]

A stack of --layers blocks (LayerNorm, Linear 256 -> 256, GELU, a residual), each checkpointed;
the batch is chosen so that each block's input is the given MiB (1024 rows of 256 float32 per
MiB). Per size and round, in alternating order: torch.utils.checkpoint (non-reentrant: the input
stays in memory) and spillarena.checkpoint on a disk arena (buffered, sized for the step, the
default malloc policy), one warm-up and --steps timed steps each. Prints, per size, the median
step of each and the median of the rounds' ratios, and for spillarena the per-step counters from
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


def timed(blocks, x, checkpoint, steps):
    step(blocks, x, checkpoint)  # warm-up: the arena's regions, the allocator
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step(blocks, x, checkpoint)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def counters(arena):
    a, s, m = arena.stats(), arena.stash_stats(), spillarena.malloc.state()
    return {"written": a["bytes_written"], "read": a["bytes_read"],
            "hashed": a["bytes_hashed"], "verified": a["bytes_verified"],
            "staging_wait_ns": a["staging_wait_ns"], "restore_waits": s["restore_waits"],
            "restore_wait_ns": s["restore_wait_ns"], "pool_wait_ns": s["pool_wait_ns"],
            "restores": s["restores"], "trims": m.get("trims", 0)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", default="1,8,32,64,128")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--dir", default="/var/tmp")
    p.add_argument("--hash", action=argparse.BooleanOptionalAction, default=True)
    args = p.parse_args()
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(Block() for _ in range(args.layers))

    def in_ram(block, h):
        return torch_checkpoint.checkpoint(block, h, use_reentrant=False)

    print("MiB\tin-RAM ms\tspill ms\tspill/in-RAM (rounds)\tper spilled step: written MiB, "
          "read MiB, restore waits (ms), pool wait ms, staging wait ms, hashed MiB, trims")
    for mib in (int(v) for v in args.mib.split(",")):
        x = torch.randn(mib * ROWS_PER_MIB, HIDDEN, requires_grad=True)
        with tempfile.TemporaryDirectory(dir=args.dir) as directory:
            arena = spillarena.SpillArena(
                spillarena.bytes_for_layer_inputs(args.layers, (1, *x.shape), torch.float32),
                directory, verify_integrity=args.hash)

            def spilled(block, h, arena=arena):
                return spillarena.checkpoint(block, h, arena=arena)

            ram_ms, spill_ms, ratios, per_step = [], [], [], None
            for r in range(args.rounds):
                order = [("ram", in_ram), ("spill", spilled)]
                if r % 2:
                    order.reverse()
                got = {}
                for name, checkpoint in order:
                    before = counters(arena)
                    got[name] = timed(blocks, x, checkpoint, args.steps) * 1e3
                    if name == "spill":
                        after = counters(arena)
                        per_step = {k: (after[k] - before[k]) / (args.steps + 1) for k in after}
                ram_ms.append(got["ram"])
                spill_ms.append(got["spill"])
                ratios.append(got["spill"] / got["ram"])
            c = per_step
            print(f"{mib}\t{statistics.median(ram_ms):.0f}\t{statistics.median(spill_ms):.0f}\t"
                  f"{statistics.median(ratios):.3f} ({', '.join(f'{v:.2f}' for v in ratios)})\t"
                  f"{c['written'] / 2**20:.0f}, {c['read'] / 2**20:.0f}, "
                  f"{c['restore_waits']:.1f} ({c['restore_wait_ns'] / 1e6:.1f}), "
                  f"{c['pool_wait_ns'] / 1e6:.1f}, {c['staging_wait_ns'] / 1e6:.1f}, "
                  f"{c['hashed'] / 2**20:.0f}, {c['trims']:.1f}", flush=True)
            del arena


if __name__ == "__main__":
    main()
