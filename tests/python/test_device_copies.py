"""The device path of the Python front end through its CopyEngine (python/src/device_engine.cc:
Note [Device copies through Python]), exercised on the CPU: device_copies' functions are
replaced by CPU stand-ins that copy on a thread of their own, and inputs are stored as
accelerator inputs. What runs for real is the extension's side: capsules both ways, the host
pool, the progress thread calling into Python under the GIL, the out-of-memory message."""

import threading
import time

import pytest
import torch
from torch.utils import dlpack

import spillarena
from spillarena import device_copies
from conftest import assert_drained


class CpuCopy:
    """A copy on a thread of its own after a short delay: done() turns true when it ran."""

    def __init__(self, source, dest):
        self.finished = threading.Event()
        self.thread = threading.Thread(target=self.run, args=(source, dest))
        self.thread.start()

    def run(self, source, dest):
        time.sleep(0.001)
        if dest is not None:
            dest.copy_(source)
        self.finished.set()

    def done(self):
        return self.finished.is_set()

    def synchronize(self):
        self.finished.wait()

    def order_current_stream(self):
        self.finished.wait()


@pytest.fixture
def cpu_device(monkeypatch):
    calls = {"copy": 0, "empty": 0, "pinned_host": 0, "fail_empty": 0}

    def copy(src, dst, dl_type, index):
        calls["copy"] += 1
        return CpuCopy(dlpack.from_dlpack(src), dlpack.from_dlpack(dst))

    def empty(dl_type, index, nbytes, explain):
        calls["empty"] += 1
        if calls["fail_empty"]:
            calls["fail_empty"] -= 1
            raise torch.OutOfMemoryError(explain("CPU stand-in out of memory"))
        return dlpack.to_dlpack(torch.empty(nbytes, dtype=torch.uint8))

    def pinned_host(nbytes):
        calls["pinned_host"] += 1
        return dlpack.to_dlpack(torch.empty(nbytes, dtype=torch.uint8))

    monkeypatch.setattr(device_copies, "copy", copy)
    monkeypatch.setattr(device_copies, "empty", empty)
    monkeypatch.setattr(device_copies, "pinned_host", pinned_host)
    return calls


def store_on_device(stash, tensor):
    """store() as for a device tensor: the chain's accelerator path."""
    bytes_ = tensor.contiguous().reshape(-1).view(torch.uint8)
    return stash._chain.store(dlpack.to_dlpack(bytes_), True, "layer input of the test", True,
                              tensor, tensor._version)


def restored(handle, like):
    return dlpack.from_dlpack(handle.restore()).view(like.dtype).view(like.shape)


def wait_for_spills(stash, count):
    deadline = time.monotonic() + 10
    while stash.stats()["inputs_spilled"] < count and time.monotonic() < deadline:
        time.sleep(0.01)


def test_inputs_go_through_the_pool_and_come_back_bit_for_bit(cpu_device, arena):
    stash = spillarena.make_arena_stash(arena, keep_last=0)
    inputs = [torch.randn(64, 64) for _ in range(6)]
    handles = [store_on_device(stash, x) for x in inputs]
    wait_for_spills(stash, 6)  # copied off the "device" and written, on the progress thread
    for handle, x in zip(reversed(handles), reversed(inputs)):
        assert torch.equal(restored(handle, x), x)
    stats = stash.stats()
    assert stats["inputs_spilled"] == 6 and stats["host_pool_pinned"] is True
    assert cpu_device["copy"] >= 12 and cpu_device["pinned_host"] == 1
    del handles, stash
    assert_drained(arena)


def test_no_device_memory_at_restore_is_torchs_error_naming_the_input(cpu_device, arena):
    stash = spillarena.make_arena_stash(arena, keep_last=0, prefetch_depth=0)
    x = torch.randn(32, 32)
    handle = store_on_device(stash, x)
    wait_for_spills(stash, 1)
    cpu_device["fail_empty"] = 1
    with pytest.raises(torch.OutOfMemoryError, match="no device memory to restore the stashed "
                                                     "layer input of the test"):
        handle.restore()
    del handle, stash
    assert_drained(arena)


def test_a_copy_that_fails_in_python_reaches_the_training_thread(cpu_device, arena, monkeypatch):
    def refuse(src, dst, dl_type, index):
        raise RuntimeError("the stand-in device refuses the copy")

    monkeypatch.setattr(device_copies, "copy", refuse)
    stash = spillarena.make_arena_stash(arena, keep_last=0)
    with pytest.raises(RuntimeError, match="the stand-in device refuses the copy"):
        store_on_device(stash, torch.randn(16))
    del stash
    assert_drained(arena)


def test_device_types_torch_has_no_copies_for_are_named():
    with pytest.raises(RuntimeError, match="DLPack device type 7"):
        device_copies.marker(7, 0)


EXIT_WITH_A_COPY_IN_FLIGHT = """
import sys, threading, time, torch
from torch.utils import dlpack
import spillarena
from spillarena import device_copies
sys.path.insert(0, sys.argv[1])
from test_device_copies import CpuCopy

class SlowCopy(CpuCopy):
    def run(self, source, dest):
        time.sleep(0.5)
        super().run(source, dest)

device_copies.copy = lambda s, d, t, i: SlowCopy(dlpack.from_dlpack(s), dlpack.from_dlpack(d))
device_copies.pinned_host = lambda n: dlpack.to_dlpack(torch.empty(n, dtype=torch.uint8))
arena = spillarena.SpillArena(1 << 20, backing="ram")
stash = spillarena.make_arena_stash(arena, keep_last=0)
x = torch.randn(1024).view(torch.uint8)
held = stash._chain.store(dlpack.to_dlpack(x), True, "in flight at exit", True, x, x._version)
print("exiting", flush=True)
"""


def test_exiting_with_a_device_copy_in_flight_is_an_orderly_exit(tmp_path):
    # Note [No Python once the interpreter ends] in python/src/python_call.cc: the progress
    # thread meets a finalizing interpreter; the process once died of SIGSEGV here.
    import pathlib
    import subprocess
    import sys

    here = str(pathlib.Path(__file__).parent)
    for _ in range(3):
        child = subprocess.run([sys.executable, "-c", EXIT_WITH_A_COPY_IN_FLIGHT, here],
                               capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
        assert "exiting" in child.stdout


EXIT_WITH_SPILLED_CPU_INPUTS = """
import torch, spillarena
arena = spillarena.SpillArena(1 << 24, ".")
stash = spillarena.arena_stash.shared_arena_stash(arena)
held = [stash.store(torch.ones(1 << 18, dtype=torch.uint8)) for _ in range(3)]
print("exiting", flush=True)
"""


def test_exiting_with_spilled_cpu_inputs_alive_is_an_orderly_exit(tmp_path):
    # The progress thread lets go of torch's tensors (their DLPack deleter takes the GIL) while
    # the interpreter finalizes: the process ended in std::terminate, 3 runs in 4, before the
    # deleter went through the door of Note [No Python once the interpreter ends].
    import subprocess
    import sys

    for _ in range(4):
        child = subprocess.run([sys.executable, "-c", EXIT_WITH_SPILLED_CPU_INPUTS],
                               capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
        assert "exiting" in child.stdout


class FailingSynchronize(CpuCopy):
    """A copy whose synchronize() raises now and then (a device error surfacing late)."""

    failures = 0

    def synchronize(self):
        super().synchronize()
        FailingSynchronize.failures += 1
        if FailingSynchronize.failures % 5 == 0:
            raise RuntimeError("the stand-in device failed to synchronize")


def test_errors_while_a_stash_dies_keep_their_type(cpu_device, spill_dir, monkeypatch):
    # Note [C++ objects Python holds]: a stored input's capsule may die while an exception
    # propagates, and its destructor calls into Python (synchronize). The pending exception once
    # became "SystemError: error return without exception set" one time in ten. (An arena of its
    # own, not drained at the end: a failure the chain keeps for its next store holds the Python
    # exception, whose traceback holds the frame that holds the stash: a cycle through C++.)
    arena = spillarena.SpillArena(64 << 20, spill_dir, keep_last=0)
    monkeypatch.setattr(device_copies, "copy",
                        lambda s, d, t, i: FailingSynchronize(dlpack.from_dlpack(s),
                                                              dlpack.from_dlpack(d)))
    seen = set()
    for _ in range(60):
        try:
            stash = spillarena.make_arena_stash(arena, keep_last=0)
            held = [store_on_device(stash, torch.randn(64)) for _ in range(4)]
            for h in held:
                dlpack.from_dlpack(h.restore())
        except Exception as e:  # the type is what is checked
            seen.add(type(e).__name__)
        finally:
            held = stash = None
    assert "SystemError" not in seen, seen
    assert "RuntimeError" in seen, seen  # the stand-in's own error, as raised
