"""Shared fixtures and checks of the spillarena Python tests (CPU only, tiny models, nothing
downloaded): among them assert_as_torch, the one rule for comparing gradients with torch's."""

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


def wait_for_exit_code(pid, timeout_s=120):
    """A forked child's exit code (its verdict), or "timed out" after killing it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return "timed out"


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


def our_warnings(caught):
    """spillarena's own warnings among those caught with ``record=True``: a SpillArenaWarning, or
    a message that starts with "spillarena" as all of ours do. A test counts only these; how many
    torch or transformers give is theirs to change."""
    return [w for w in caught if issubclass(w.category, spillarena.SpillArenaWarning)
            or str(w.message).startswith("spillarena")]


# Note [As torch's own checkpoint, and as no checkpointing only where torch's own is]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# spillarena promises the floats of torch's own checkpointing of the same form, bit for bit:
# torch.utils.checkpoint.checkpoint with the same use_reentrant, or transformers' own
# activation_checkpointing_enable. Whether torch's own checkpointing gives the floats of no
# checkpointing is torch's arithmetic on the CPU at hand: on one CPU torch's own non-reentrant
# checkpointing of T5 differed from no checkpointing in 94 gradients, the shared position bias's
# gradient summed in another order (issue 49). So every comparison of a result of ours with no
# checkpointing goes through assert_as_torch: ours equal to torch's own always, ours equal to no
# checkpointing only where torch's own equals it in the same run. Which cases did is printed and
# listed at the end of the run (pytest_terminal_summary below), never asserted.

# (test, case, where torch's own differs from no checkpointing) for each comparison with one.
AS_TORCH_OUTCOMES = []


def _leaves(value, path="result"):
    """(path, leaf) for every tensor, number or None inside nested dicts, lists and tuples."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, f"{path}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _leaves(item, f"{path}[{i}]")
    else:
        yield path, value


def _same(a, b, values=True):
    """The same kind of leaf, dtype and shape; with ``values``, every value too (NaN never)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if (a.dtype, a.shape) != (b.dtype, b.shape):
            return False
        return torch.equal(a, b) if values else True
    if not values:
        return (a is None) == (b is None) and type(a) is type(b)
    return type(a) is type(b) and a == b


def differing(a, b, values=True):
    """The paths at which two results differ: a leaf one of them lacks, or a leaf not the same."""
    a, b = dict(_leaves(a)), dict(_leaves(b))
    paths = list(a) + [p for p in b if p not in a]
    return [p for p in paths if p not in a or p not in b or not _same(a[p], b[p], values)]


def _shown(paths, most=8):
    more = f" and {len(paths) - most} more" if len(paths) > most else ""
    return ", ".join(paths[:most]) + more


def assert_as_torch(ours, torchs, plain=None, case="", same_form=True):
    """Asserts a result of ours as torch's own checkpoint's, and as no checkpointing's only where
    torch's own equals that in this run (Note [As torch's own checkpoint, and as no
    checkpointing only where torch's own is]).

    ``ours``, ``torchs`` and ``plain`` (no checkpointing; None: not compared) are tensors, numbers
    or None, or dicts, lists and tuples of them, compared leaf by leaf with torch.equal, dtypes
    and shapes included. ``same_form=False``: torch has no checkpoint of ours' form for this case
    (its reentrant form gives no gradient to a layer whose inputs need none, and sees no tensor
    inside a container), so ``torchs`` comes from its other form: ours gets a gradient wherever
    that form gives one, and equals it where it equals no checkpointing. Returns whether ours was
    also asserted equal to no checkpointing (None without ``plain``)."""
    torchs_off_plain = None if plain is None else differing(torchs, plain)
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    as_plain = torchs_off_plain == []
    if plain is not None:
        AS_TORCH_OUTCOMES.append((test, case, torchs_off_plain))
        print(f"{test} {case}: torch's own checkpoint "
              + ("equals no checkpointing, ours asserted equal to both" if as_plain else
                 f"differs from no checkpointing at {_shown(torchs_off_plain)}: ours asserted "
                 "equal to torch's own only"))
    form = "torch's own checkpoint" if same_form else "torch's checkpoint of the other form"
    unlike_torchs = differing(ours, torchs, values=same_form)
    assert unlike_torchs == [], (
        f"{case}: ours differs from {form} at {_shown(unlike_torchs)}"
        + ("" if plain is None else f" (torch's equals no checkpointing: {as_plain})"))
    if as_plain:
        # Implied by the assertion above where the form is the same (equality is transitive);
        # the whole check where only the shapes could be compared with torch's other form.
        unlike_plain = differing(ours, plain)
        assert unlike_plain == [], (
            f"{case}: ours differs from no checkpointing at {_shown(unlike_plain)}, where "
            f"{form} equals it")
    return None if plain is None else as_plain


def pytest_terminal_summary(terminalreporter):
    """Which comparisons with no checkpointing torch's own checkpointing met in this run."""
    if not AS_TORCH_OUTCOMES:
        return
    off = [(test, case, paths) for test, case, paths in AS_TORCH_OUTCOMES if paths]
    terminalreporter.section("torch's own checkpointing against no checkpointing (information)")
    terminalreporter.line(
        f"{len(AS_TORCH_OUTCOMES) - len(off)} of {len(AS_TORCH_OUTCOMES)} comparisons: torch's "
        "own equal to no checkpointing, ours asserted equal to both; the rest: ours asserted "
        "equal to torch's own only")
    for test, case, paths in off:
        terminalreporter.line(f"  {test} {case}: torch's own differs at {len(paths)}: "
                              f"{_shown(paths, 3)}")
