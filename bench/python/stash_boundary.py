"""What crossing into the stash costs per input (issue 38): store + restore of one tensor
through an arena stash, timed in one process of one package version.

    .venv/bin/python bench/python/stash_boundary.py [--label NAME] [--rounds N] [--kib 64,65536]

For a 64 KiB and a 64 MiB float32 input (or the sizes --kib lists): make_arena_stash(arena,
keep_last=0) on a disk arena (buffered: the bytes stay in the page cache) and on a RAM arena,
store() then restore() at once, repeated; prints the median microseconds per round trip of each.
The disk arena's round trip includes the write and the read; the RAM arena's is the boundary and
one copy in. Run it under two versions of the package (two virtualenvs holding the same torch) to
compare them, in alternating processes; docs/benchmarks.md, "One wheel for every torch", has the
figures.
"""

import argparse
import statistics
import tempfile
import time

import torch

import spillarena


def round_trip_us(stash, tensor, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        held = stash.store(tensor)
        restored = held.restore()
        times.append((time.perf_counter() - start) * 1e6)
        assert restored.shape == tensor.shape
        held.free()
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default=spillarena.__version__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kib", default="64,65536", help="input sizes in KiB, comma-separated")
    args = parser.parse_args()
    sizes = {f"{k} KiB": int(k) << 10 for k in args.kib.split(",")}
    with tempfile.TemporaryDirectory(dir="/var/tmp") as directory:
        disk = spillarena.SpillArena(256 << 20, directory)
        ram = spillarena.SpillArena(256 << 20, backing="ram")
        stashes = {"disk": spillarena.make_arena_stash(disk, keep_last=0),
                   "ram": spillarena.make_arena_stash(ram, keep_last=0)}
        for size_name, nbytes in sizes.items():
            tensor = torch.randn(nbytes // 4)
            repeats = 200 if nbytes < (1 << 20) else 10
            for arena_name, stash in stashes.items():
                round_trip_us(stash, tensor, 3)  # warm: the region's pages, the allocator
                medians = [round_trip_us(stash, tensor, repeats) for _ in range(args.rounds)]
                print(f"{args.label}\t{arena_name}\t{size_name}\t"
                      f"{statistics.median(medians):.1f} us\t(rounds: "
                      + ", ".join(f"{m:.1f}" for m in medians) + ")", flush=True)


if __name__ == "__main__":
    main()
