"""What a checkpointed layer costs beyond its bytes (issue 40): four tiny blocks (Linear 64 -> 64,
GELU) on a 4 KiB input, a forward and backward per step, through torch's own non-reentrant
checkpoint, spillarena.checkpoint with an in-memory stash (no spill) and on a buffered disk
arena; the kinds alternate in each round. Prints the median microseconds per step (CPU time of
the process and wall time) of each kind, and per layer beyond torch's checkpoint.

    .venv/bin/python bench/python/fixed_cost.py [--rounds 7] [--steps 200] [--rows 16]

At this size the step is almost all fixed cost: Python, the stash's calls, thread wake-ups.
One LibTorch thread, so that the step's own work does not depend on the machine's other load.
Run it under two versions of the package (PYTHONPATH) in alternating processes to compare them;
docs/benchmarks.md, "A small spill's fixed cost", has the figures.
"""

import argparse
import statistics
import tempfile
import time

import torch
from bench_args import count

import spillarena

LAYERS = 4
HIDDEN = 64


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=count(1, 1000), default=7)
    parser.add_argument("--steps", type=count(10, 100_000), default=200)
    parser.add_argument("--rows", type=count(1, 1 << 16), default=16,
                        help="rows of the input (HIDDEN floats; up to 16 MiB)")
    parser.add_argument("--label", default=spillarena.__version__)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.GELU())
              for _ in range(LAYERS)]
    x = torch.randn(args.rows, HIDDEN, requires_grad=True)
    with tempfile.TemporaryDirectory(dir="/var/tmp") as directory:
        disk = spillarena.SpillArena(64 << 20, directory)
        in_memory = spillarena.make_in_memory_stash()
        kinds = {
            "torch": lambda b, h: torch.utils.checkpoint.checkpoint(b, h, use_reentrant=False),
            "in-memory stash": lambda b, h: spillarena.checkpoint(b, h, arena=in_memory),
            "disk arena": lambda b, h: spillarena.checkpoint(b, h, arena=disk),
        }
        cpu = {kind: [] for kind in kinds}
        wall = {kind: [] for kind in kinds}

        def step(checkpoint):
            h = x
            for block in blocks:
                h = checkpoint(block, h)
            h.sum().backward()

        for _ in range(args.rounds):
            for kind, checkpoint in kinds.items():
                for _ in range(args.steps // 10):  # warm-up
                    step(checkpoint)
                started_cpu, started = time.process_time(), time.perf_counter()
                for _ in range(args.steps):
                    step(checkpoint)
                cpu[kind].append((time.process_time() - started_cpu) / args.steps * 1e6)
                wall[kind].append((time.perf_counter() - started) / args.steps * 1e6)
    base = statistics.median(wall["torch"])
    print(f"{args.label}: {args.rows * HIDDEN * 4} bytes per input, {LAYERS} layers, median of "
          f"{args.rounds} rounds of {args.steps} steps")
    for kind in kinds:
        w = statistics.median(wall[kind])
        print(f"{args.label}\t{kind:16s}\tcpu {statistics.median(cpu[kind]):7.0f} us/step\t"
              f"wall {w:7.0f} us/step\t{(w - base) / LAYERS:+6.0f} us per layer over torch")


if __name__ == "__main__":
    main()
