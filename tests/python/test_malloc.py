"""spillarena.malloc: freed host memory goes back to the system while a spilling arena is used."""

import ctypes
import os

import pytest

import spillarena
from spillarena import malloc

_libc = ctypes.CDLL("libc.so.6")
_libc.malloc.restype, _libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
_libc.free.argtypes = [ctypes.c_void_p]
_libc.malloc_trim.restype, _libc.malloc_trim.argtypes = ctypes.c_int, [ctypes.c_size_t]


@pytest.fixture
def fresh(monkeypatch):
    """A process that has not put the policy in force yet (the state is process-wide)."""
    monkeypatch.setattr(
        malloc, "_state",
        dict(malloc._state, policy=None, active=False, reason=None, applications=0, trims=0,
             trim_seconds=0.0, skipped=0, pressure=None, pressure_reads=0))
    monkeypatch.delenv(malloc.ENVIRONMENT_VARIABLE, raising=False)
    return monkeypatch


@pytest.fixture
def tight(fresh):
    """As `fresh`, with memory reported as tight (pressure 0.9): the default policy trims."""
    fresh.setattr(malloc, "_memory_pressure", lambda: 0.9)
    return fresh


def rss_anon_bytes():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def leave_freed_heap_memory(blocks=160, block_bytes=1 << 20):
    """Frees ~160 MiB inside the heap, below a block still in use, as a layer's working set is
    freed between live tensors: glibc keeps those pages resident. Returns the live block."""
    # Freeing one mapped block raises glibc's dynamic mmap threshold above block_bytes, so the
    # blocks below come from the heap, as tensors do in a training step.
    _libc.free(_libc.malloc(4 << 20))
    pointers = [_libc.malloc(block_bytes) for _ in range(blocks)]
    for p in pointers:
        ctypes.memset(p, 1, block_bytes)
    keep = _libc.malloc(block_bytes)  # above the freed blocks: the heap's top cannot shrink
    for p in pointers:
        _libc.free(p)
    return keep


def glibc_keeps_then_returns_freed_heap_pages():
    """Whether, in this process now, the pages leave_freed_heap_memory frees stay resident until
    glibc's own malloc_trim(0), called directly, returns them. That is glibc's, not ours (a fixed
    mmap threshold in GLIBC_TUNABLES, for one, returns the blocks on free): the resident sizes
    below are asserted only where it holds, spillarena's trims counted always."""
    keep = leave_freed_heap_memory()
    try:
        held = rss_anon_bytes()
        _libc.malloc_trim(0)
        returned = rss_anon_bytes() < held - (128 << 20)
    finally:
        _libc.free(keep)
    print(f"glibc keeps freed heap pages until malloc_trim returns them: {returned}")
    return returned


def test_a_disk_arena_turns_the_policy_on_once(fresh, arena):
    assert malloc.use_for_spilling(arena) is True
    assert malloc.use_for_spilling(arena) is True
    assert malloc.use_for_spilling(spillarena.arena_stash.shared_arena_stash(arena)) is True
    state = malloc.state()
    assert (state["policy"], state["active"], state["applications"]) == ("pressure", True, 1)
    assert state["reason"].startswith("glibc ")


def test_keep_in_the_environment_leaves_malloc_alone(fresh, arena):
    fresh.setenv(malloc.ENVIRONMENT_VARIABLE, "keep")
    assert malloc.use_for_spilling(arena) is False
    malloc.layer_done()
    fresh.delenv(malloc.ENVIRONMENT_VARIABLE)  # read once: a later call does not switch it on
    assert malloc.use_for_spilling(arena) is False
    state = malloc.state()
    assert (state["policy"], state["active"]) == ("keep", False)
    assert (state["trims"], state["applications"]) == (0, 0)


def test_stashes_that_keep_inputs_in_the_process_do_not_turn_it_on(fresh):
    in_memory = spillarena.SpillArena(1 << 20, backing="ram")
    for stash in (spillarena.make_in_memory_stash(), spillarena.SpillArena(1 << 20, backing="ram"),
                  spillarena.arena_stash.shared_arena_stash(in_memory)):
        assert malloc.use_for_spilling(stash) is False
    assert malloc.state()["policy"] is None
    malloc.layer_done()
    assert malloc.state()["trims"] == 0


def test_an_unknown_policy_is_refused_with_the_choices(fresh, arena):
    fresh.setenv(malloc.ENVIRONMENT_VARIABLE, "sometimes")
    with pytest.raises(ValueError, match=r"'pressure'.*'return'.*'keep'"):
        malloc.use_for_spilling(arena)


def test_layer_done_returns_freed_heap_pages(tight, arena):
    glibc_does = glibc_keeps_then_returns_freed_heap_pages()
    keep = leave_freed_heap_memory()
    try:
        held = rss_anon_bytes()
        malloc.layer_done()  # not in force yet: nothing happens
        assert malloc.state()["trims"] == 0
        assert not glibc_does or rss_anon_bytes() > held - (32 << 20)
        malloc.use_for_spilling(arena)
        malloc.layer_done()
        assert malloc.state()["trims"] == 1
        assert not glibc_does or rss_anon_bytes() < held - (128 << 20)
    finally:
        _libc.free(keep)


def test_accelerator_layers_are_not_trimmed(fresh, arena):
    malloc.use_for_spilling(arena)
    malloc.layer_done("cuda")
    assert malloc.state()["trims"] == 0


def test_the_checkpoint_trims_after_each_spilled_layers_forward_and_backward(tight, arena):
    import torch

    layers = [torch.nn.Linear(16, 16) for _ in range(3)]
    x = torch.randn(4, 16, requires_grad=True)
    h = x
    for layer in layers:
        h = spillarena.checkpoint(layer, h, arena=arena)
    assert malloc.state()["trims"] == len(layers)  # one per forward
    h.sum().backward()
    assert malloc.state()["trims"] == 2 * len(layers)  # and one per backward
    in_memory = spillarena.make_in_memory_stash()
    spillarena.checkpoint(layers[0], x, arena=in_memory).sum().backward()
    assert malloc.state()["trims"] == 2 * len(layers) + 2  # the policy is process-wide once on


def test_below_the_pressure_threshold_freed_pages_stay_and_the_step_pays_nothing(fresh, arena):
    fresh.setattr(malloc, "_memory_pressure", lambda: malloc.PRESSURE_THRESHOLD - 0.01)
    glibc_does = glibc_keeps_then_returns_freed_heap_pages()
    keep = leave_freed_heap_memory()
    try:
        held = rss_anon_bytes()
        malloc.use_for_spilling(arena)
        malloc.layer_done()
        assert malloc.state()["trims"] == 0
        assert not glibc_does or rss_anon_bytes() > held - (32 << 20)
        fresh.setattr(malloc, "_memory_pressure", lambda: malloc.PRESSURE_THRESHOLD)
        malloc.layer_done()
        assert not glibc_does or rss_anon_bytes() < held - (128 << 20)
    finally:
        _libc.free(keep)
    state = malloc.state()
    expected = (1, 1, malloc.PRESSURE_THRESHOLD)
    assert (state["skipped"], state["trims"], state["pressure"]) == expected


def test_return_trims_after_every_layer_whatever_the_pressure(fresh, arena):
    fresh.setenv(malloc.ENVIRONMENT_VARIABLE, "return")
    fresh.setattr(malloc, "_memory_pressure",
                  lambda: pytest.fail("'return' does not read the pressure"))
    assert malloc.use_for_spilling(arena) is True
    malloc.layer_done()
    malloc.layer_done()
    state = malloc.state()
    assert (state["policy"], state["trims"], state["skipped"]) == ("return", 2, 0)


def test_memory_limits_reports_this_process(fresh):
    limits = spillarena.memory_limits()
    assert 0 < limits["mem_available_bytes"] <= limits["mem_total_bytes"]
    assert 0.0 <= limits["pressure"] <= 1.0
    assert 0 <= limits["usable_bytes"] <= limits["mem_available_bytes"]  # 0: a cgroup at its limit
    assert 0.0 <= malloc._memory_pressure() <= 1.0


_CGROUP_CHILD = """
import json, os, sys
with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as procs:
    procs.write(str(os.getpid()))
import spillarena
print(json.dumps(spillarena.memory_limits()))
"""


def _memory_cgroup_root():
    """(version, root) of a memory cgroup hierarchy this process may create nested cgroups in."""
    for version, root in ((2, "/sys/fs/cgroup"), (1, "/sys/fs/cgroup/memory")):
        if not (os.path.isdir(root) and os.access(root, os.W_OK)):
            continue
        if version == 2:
            try:
                with open(os.path.join(root, "cgroup.subtree_control")) as f:
                    if "memory" not in f.read().split():
                        continue  # children of the root get no memory controller
            except OSError:
                continue
        return version, root
    return None, None


def test_pressure_inside_a_memory_cgroup_uses_the_tightest_limit_above_it(tmp_path):
    """The child runs in a cgroup without a limit of its own, below one that has it (a pod's
    limit above its container): that limit binds, and the pressure is measured against it."""
    import json
    import subprocess
    import sys

    version, root = _memory_cgroup_root()
    if root is None:
        pytest.skip("no writable memory cgroup hierarchy here (not root, or no memory controller)")
    parent = os.path.join(root, f"spillarena-test-{os.getpid()}")
    leaf = os.path.join(parent, "leaf")
    os.mkdir(parent)
    try:
        limit = 2 << 30
        with open(os.path.join(parent, "memory.max" if version == 2 else "memory.limit_in_bytes"),
                  "w") as f:
            f.write(str(limit))
        if version == 2:
            with open(os.path.join(parent, "cgroup.subtree_control"), "w") as f:
                f.write("+memory")
        os.mkdir(leaf)
        try:
            out = subprocess.run([sys.executable, "-c", _CGROUP_CHILD, leaf], capture_output=True,
                                 text=True, timeout=120, check=True).stdout
        finally:
            os.rmdir(leaf)
        limits = json.loads(out.strip().splitlines()[-1])
        assert (limits["cgroup_version"], limits["cgroup_limit_bytes"]) == (version, limit)
        assert 0 < limits["cgroup_anon_bytes"] < limit  # the child's Python, torch and spillarena
        assert limits["pressure"] >= limits["cgroup_anon_bytes"] / limit
    finally:
        os.rmdir(parent)


def test_a_low_pressure_is_read_once_in_a_while_a_high_one_every_layer(fresh, arena):
    # Note [Reading the pressure once in a while]: the reading costs 30-140 us per layer.
    reads = []

    def pressure_of(value):
        return lambda: reads.append(value) or value

    clock = [100.0]
    fresh.setattr(malloc.time, "monotonic", lambda: clock[0])
    malloc.use_for_spilling(arena)
    fresh.setattr(malloc, "_malloc_trim", lambda pad: 0)
    fresh.setattr(malloc, "_memory_pressure", pressure_of(0.1))
    for _ in range(5):
        malloc.layer_done()
    assert reads == [0.1]  # four layers reused the first reading
    clock[0] += malloc.PRESSURE_READING_S * 1.01
    malloc.layer_done()
    assert reads == [0.1, 0.1]  # too old: read again
    fresh.setattr(malloc, "_memory_pressure", pressure_of(malloc.PRESSURE_THRESHOLD / 2))
    clock[0] += malloc.PRESSURE_READING_S * 1.01
    malloc.layer_done()
    malloc.layer_done()
    malloc.layer_done()
    assert reads[2:] == [malloc.PRESSURE_THRESHOLD / 2] * 3  # near the threshold: every layer
    state = malloc.state()
    assert (state["pressure_reads"], state["skipped"], state["trims"]) == (5, 9, 0)
