"""Giving freed host memory back to the system while layer inputs are spilled (glibc malloc).

    arena = spillarena.SpillArena(capacity, "/mnt/nvme/spill")
    spillarena.enable(model, arena)          # puts the policy in force (use_for_spilling)
    spillarena.malloc.state()  # {'policy': 'pressure', 'active': True, 'trims': 0, ...}

    SPILLARENA_MALLOC=return python train.py # trim after every spilled layer, whatever the pressure
    SPILLARENA_MALLOC=keep python train.py   # opt out: glibc's own behaviour, untouched

Note [Returning freed memory from Python]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A spilling arena moves the saved layer inputs out of the process, but a memory cgroup kills on
RssAnon, and glibc keeps freed tensor memory: blocks below its dynamic mmap threshold (which
rises to the size of the largest block freed, up to 32 MiB) come from the heap, and a free
in the middle of the heap stays resident. Every layer's recomputation frees its working set
into holes that the next layer only partly reuses, so RssAnon follows malloc's high-water mark,
not the live tensors, and the spilled inputs' saving is lost in the holes (measured: RssAnon grew
~65 MiB per unit of batch against 6 MiB of layer inputs). The C++ side's answer
(Note [Returning freed memory], `spill::return_freed_memory_promptly`) fixes the mmap and trim
thresholds at 128 KiB: every large tensor is then mapped and faulted afresh on each allocation,
which costs 1.8x step time on a CPU model.

What this module does instead, once a spilling arena is put to use (backing "disk", or a
per-file stash; never for the RAM backing or an in-memory stash, which keep the inputs in the
process anyway): each time a checkpointed layer has run on the CPU, its forward and its backward,
malloc_trim(0) may return the free pages of every malloc arena (madvise(MADV_DONTNEED) on whole
free pages, not only the top of the heap). A layer's working set is faulted again once by the
next layer, instead of on every allocation; blocks keep their addresses; the thresholds are left
alone. Accelerator layers skip it (their working set is device memory).

A trim is not free: madvise over the freed working set and the faults that bring it back cost
~0.2 ms per MiB each (measured 2026-12-02, 2 cores: 8 layers, hidden 256, seq 128, batch 8 —
each trim returned 20-45 MiB in 5-11 ms, and trimming after every layer made the step 1.2x
slower). So by default ("pressure") a layer trims only when memory is tight: when
spillarena.memory_limits()["pressure"] — the memory cgroup's anonymous memory over its limit
(the lowest of its own and its ancestors'), or the system's memory in use over its total,
whichever is higher — is at least PRESSURE_THRESHOLD (one half), read as each layer ends. Below
it, a heap whose free holes equal everything in use still fits under the ceiling, and the step
runs at glibc's speed (one layer's growth past the threshold is trimmed when that layer ends);
above it, every layer gives its working set back,
which is what lets a spilled run train 2x the batch of in-RAM checkpointing under one limit
(docs/head_to_head.md). Reading the pressure costs ~0.1 ms a layer (a few small /proc and cgroup
files). "return" trims after every layer whatever the pressure (the earlier default).

Measured before the pressure test existed (2026-12-01, 2 shared cores; StableLM-as-Llama, 12
layers, hidden 256, seq 128, batch 8, hidden dropout on; RssAnon growth over the built model
during 2 steps): transformers' checkpointing 230 MiB; spillarena with glibc as it is 170;
trimming after each backward 118; after each forward and backward 85; fixed 128 KiB thresholds
67, at ~1.2-1.8x the step time.

The policy is process-wide, as malloc is, and set once; SPILLARENA_MALLOC (read on first use)
chooses it. Without glibc (musl, or jemalloc/mimalloc preloaded, whose own decay returns memory)
malloc_trim is absent or a no-op and nothing is done.
"""

import ctypes
import ctypes.util
import os
import threading
import time

from . import _C
from .errors import InvalidArgumentError

ENVIRONMENT_VARIABLE = "SPILLARENA_MALLOC"
POLICIES = ("pressure", "return", "keep")
PRESSURE_THRESHOLD = 0.5

_lock = threading.Lock()
_state = {"policy": None, "active": False, "reason": None, "applications": 0, "trims": 0,
          "trim_seconds": 0.0, "skipped": 0, "pressure": None}
_malloc_trim = None


def _glibc_malloc_trim():
    """libc's malloc_trim, or None with the reason (not glibc)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        version = libc.gnu_get_libc_version
    except (OSError, AttributeError):
        return None, "not glibc: malloc_trim unavailable"
    version.restype = ctypes.c_char_p
    trim = libc.malloc_trim
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim, f"glibc {version().decode()}"


def _policy_from_environment():
    value = os.environ.get(ENVIRONMENT_VARIABLE, "pressure").strip().lower() or "pressure"
    if value not in POLICIES:
        raise InvalidArgumentError(
            f"{ENVIRONMENT_VARIABLE}={value!r}: use 'pressure' (the default: give freed memory "
            "back after a spilled layer once memory is at least half used), 'return' (after every "
            "spilled layer) or 'keep' (leave glibc's malloc alone)"
        )
    return value


def _spills(arena) -> bool:
    """Whether `arena` (a SpillArena or TensorStash) keeps layer inputs outside the process."""
    backing = getattr(arena, "backing", None)
    if backing is not None:
        return backing == "disk"
    return getattr(arena, "name", None) in ("disk", "per_file")


def use_for_spilling(arena) -> bool:
    """Puts the policy in force when `arena` spills (see the Note); once per process, later
    calls only report. Returns whether layer_done() trims."""
    if _state["policy"] is not None or not _spills(arena):
        return _state["active"]  # decided already (once per process), or nothing spills
    global _malloc_trim
    with _lock:
        if _state["policy"] is not None:
            return _state["active"]
        policy = _policy_from_environment()
        if policy != "keep":
            _malloc_trim, _state["reason"] = _glibc_malloc_trim()
            _state["active"] = _malloc_trim is not None
            _state["applications"] += int(_state["active"])
        else:
            _state["reason"] = f"{ENVIRONMENT_VARIABLE}=keep"
        _state["policy"] = policy  # last: a concurrent caller sees a finished decision
    return _state["active"]


def _memory_pressure() -> float:
    return _C.memory_limits()["pressure"]


def layer_done(device_type="cpu"):
    """The checkpoint's hook once a spilled layer's forward or backward has run on
    `device_type`: gives the freed working set back (a no-op unless the policy is in force;
    under "pressure", only once memory is tight — see the Note)."""
    if not _state["active"] or device_type != "cpu":
        return
    if _state["policy"] == "pressure":
        pressure = _memory_pressure()
        with _lock:  # layers may end on several threads at once: the counters stay exact
            _state["pressure"] = pressure
            if pressure < PRESSURE_THRESHOLD:
                _state["skipped"] += 1
                return
    start = time.perf_counter()
    _malloc_trim(0)
    with _lock:
        _state["trims"] += 1
        _state["trim_seconds"] += time.perf_counter() - start


def state() -> dict:
    """A copy of what was decided and done: policy, active, reason, applications, trims (and
    their seconds), skipped (layers under the pressure threshold), pressure (the last read)."""
    return dict(_state)
