"""Where spilling's fixed cost per layer goes at small inputs (issue 40): the sweep's 4-block
stack at one input size, torch's in-RAM checkpointing against spillarena.checkpoint with an
in-memory stash and on disk arenas that differ in one option each, alternating, 7 rounds of 3
steps; prints the median step of each and its ratio to torch's.

    .venv/bin/python bench/python/spill_parts.py 1      # MiB per layer input
"""

import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spill_sweep as sweep

import spillarena

LAYERS = 4
ROUNDS = 7
STEPS = 3


def main():
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    torch.manual_seed(0)
    blocks = [sweep.Block() for _ in range(LAYERS)]
    x = torch.randn(mib * sweep.ROWS_PER_MIB, sweep.HIDDEN, requires_grad=True)
    directory = tempfile.mkdtemp(dir=os.environ.get("SPILL_DIR", "/var/tmp"))
    capacity = LAYERS * (mib << 20) * 2

    def arena(**options):
        return spillarena.SpillArena(capacity, directory, **options)

    stashes = {
        "torch (in RAM)": None,
        "spillarena, in-memory stash": spillarena.make_in_memory_stash(),
        "spillarena, disk (default)": arena(),
        "  io_backend=thread_pool": arena(io_backend="thread_pool"),
        "  verify_integrity=False": arena(verify_integrity=False),
        "  start_writeback_after_write=False": arena(start_writeback_after_write=False),
    }
    times = {name: [] for name in stashes}
    for _ in range(ROUNDS):
        for name, stash in stashes.items():
            if stash is None:
                def checkpoint(block, h):
                    return torch.utils.checkpoint.checkpoint(block, h, use_reentrant=False)
            else:
                def checkpoint(block, h, stash=stash):
                    return spillarena.checkpoint(block, h, arena=stash)
            sweep.step(blocks, x, checkpoint)  # warm-up
            start = time.perf_counter()
            for _ in range(STEPS):
                sweep.step(blocks, x, checkpoint)
            times[name].append((time.perf_counter() - start) / STEPS * 1e3)
    base = statistics.median(times["torch (in RAM)"])
    print(f"{mib} MiB per layer input, {LAYERS} layers, median of {ROUNDS} rounds:")
    for name, values in times.items():
        ms = statistics.median(values)
        print(f"{name:38s} {ms:8.2f} ms  {ms / base:.3f}")


if __name__ == "__main__":
    main()
