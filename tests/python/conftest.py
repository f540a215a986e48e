"""Shared fixtures of the spillarena Python tests (CPU only, tiny models, nothing downloaded)."""

import errno
import os
import pathlib
import shutil
import subprocess
import tempfile
import time

import pytest
import torch

import spillarena

REPO = pathlib.Path(__file__).resolve().parents[2]
BUNDLED_TEXT = REPO / "data" / "kjv-genesis-exodus.txt"

# Two cores on the CI machine; more threads only contend.
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture
def spill_dir():
    """A fresh directory on disk (never tmpfs); the test fails if anything is left in it."""
    path = pathlib.Path(
        tempfile.mkdtemp(prefix="spillarena-pytest-", dir=spillarena.default_spill_directory()))
    yield path
    leftovers = sorted(p.name for p in path.iterdir())
    shutil.rmtree(path, ignore_errors=True)
    assert leftovers == [], f"files left in the spill directory: {leftovers}"


@pytest.fixture
def arena(spill_dir):
    """A 64 MiB disk arena that spills every layer input (keep_last=0), drained at the end."""
    a = spillarena.SpillArena(64 << 20, spill_dir, keep_last=0)
    yield a
    assert_drained(a)


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB ext4 file system loop-mounted for the test, no blocks reserved for root; skipped
    where that is impossible (not root, no mkfs.ext4, no loop devices)."""
    if os.geteuid() != 0 or shutil.which("mkfs.ext4") is None:
        pytest.skip("needs root and mkfs.ext4 to loop-mount a small file system")
    image, mount_point = tmp_path / "fs.img", tmp_path / "mnt"
    mount_point.mkdir()
    subprocess.run(["truncate", "-s", "16M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True,
                   capture_output=True)
    if subprocess.run(["mount", "-o", "loop", str(image), str(mount_point)],
                      capture_output=True).returncode != 0:
        pytest.skip("loop mount failed (no loop devices?)")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=False)  # a file still open


def fill(directory):
    """Writes one file into ``directory`` until its file system has less than a page free;
    returns its path."""
    filler = pathlib.Path(directory) / "filler"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (1 << 20, 4096):
            try:
                while True:
                    f.write(bytes(chunk))
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
        os.fsync(f.fileno())
    return filler


def assert_drained(arena, wait_s=0.0):
    """No region live; `wait_s`: after a step that failed, writes still in flight hold their
    regions until they complete, so they get that long to drain."""
    deadline = time.monotonic() + wait_s
    while arena.stats()["live_regions"] and time.monotonic() < deadline:
        time.sleep(0.001)
    stats = arena.stats()
    assert stats["live_regions"] == 0, stats
    assert stats["bytes_in_use"] == 0, stats
    assert stats["allocations"] == stats["frees"], stats


def bundled_text_ids(max_bytes=None):
    """The bundled corpus as byte ids (a 256-symbol vocabulary: no tokenizer to download)."""
    data = BUNDLED_TEXT.read_bytes()
    if max_bytes is not None:
        data = data[:max_bytes]
    return torch.tensor(list(data), dtype=torch.long)


def open_fds():
    return len(os.listdir("/proc/self/fd"))
