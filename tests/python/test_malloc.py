"""spillarena.malloc: freed host memory goes back to the system while a spilling arena is used."""

import ctypes
import os

import pytest

import spillarena
from spillarena import malloc

_libc = ctypes.CDLL("libc.so.6")
_libc.malloc.restype, _libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
_libc.free.argtypes = [ctypes.c_void_p]


@pytest.fixture
def fresh(monkeypatch):
    """A process that has not put the policy in force yet (the state is process-wide)."""
    monkeypatch.setattr(malloc, "_state", dict(malloc._state, policy=None, active=False, reason=None,
                                               applications=0, trims=0, trim_seconds=0.0))
    monkeypatch.delenv(malloc.ENVIRONMENT_VARIABLE, raising=False)
    return monkeypatch


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


def test_a_disk_arena_turns_the_policy_on_once(fresh, arena):
    assert malloc.use_for_spilling(arena) is True
    assert malloc.use_for_spilling(arena) is True
    assert malloc.use_for_spilling(spillarena.shared_arena_stash(arena)) is True
    state = malloc.state()
    assert (state["policy"], state["active"], state["applications"]) == ("return", True, 1)
    assert state["reason"].startswith("glibc ")


def test_keep_in_the_environment_leaves_malloc_alone(fresh, arena):
    fresh.setenv(malloc.ENVIRONMENT_VARIABLE, "keep")
    assert malloc.use_for_spilling(arena) is False
    malloc.layer_done()
    fresh.delenv(malloc.ENVIRONMENT_VARIABLE)  # read once: a later call does not switch it on
    assert malloc.use_for_spilling(arena) is False
    state = malloc.state()
    assert (state["policy"], state["active"], state["trims"], state["applications"]) == ("keep", False, 0, 0)


def test_stashes_that_keep_inputs_in_the_process_do_not_turn_it_on(fresh):
    for stash in (spillarena.make_in_memory_stash(), spillarena.SpillArena(1 << 20, backing="ram"),
                  spillarena.shared_arena_stash(spillarena.SpillArena(1 << 20, backing="ram"))):
        assert malloc.use_for_spilling(stash) is False
    assert malloc.state()["policy"] is None
    malloc.layer_done()
    assert malloc.state()["trims"] == 0


def test_an_unknown_policy_is_refused_with_the_choices(fresh, arena):
    fresh.setenv(malloc.ENVIRONMENT_VARIABLE, "sometimes")
    with pytest.raises(ValueError, match="'return'.*'keep'"):
        malloc.use_for_spilling(arena)


@pytest.mark.skipif("mmap_threshold" in os.environ.get("GLIBC_TUNABLES", ""),
                    reason="a fixed mmap threshold returns the blocks on free: nothing is left to trim")
def test_layer_done_returns_freed_heap_pages(fresh, arena):
    keep = leave_freed_heap_memory()
    try:
        held = rss_anon_bytes()
        malloc.layer_done()  # not in force yet: nothing happens
        assert rss_anon_bytes() > held - (32 << 20)
        malloc.use_for_spilling(arena)
        malloc.layer_done()
        assert rss_anon_bytes() < held - (128 << 20)
        assert malloc.state()["trims"] == 1
    finally:
        _libc.free(keep)


def test_accelerator_layers_are_not_trimmed(fresh, arena):
    malloc.use_for_spilling(arena)
    malloc.layer_done("cuda")
    assert malloc.state()["trims"] == 0


def test_the_checkpoint_trims_after_each_spilled_layers_forward_and_backward(fresh, arena):
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
