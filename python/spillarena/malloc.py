"""Giving freed host memory back to the system while layer inputs are spilled (glibc malloc).

    arena = spillarena.SpillArena(capacity, "/mnt/nvme/spill")
    spillarena.enable(model, arena)          # puts the policy in force (use_for_spilling)
    spillarena.malloc.state()  # {'policy': 'pressure', 'active': True, 'trims': 0, ...}

    SPILLARENA_MALLOC=return python train.py # trim after every spilled layer, whatever the pressure
    SPILLARENA_MALLOC=keep python train.py   # opt out: glibc's own behaviour, untouched

Note [Returning freed memory from Python]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Spilling moves the saved layer inputs out of the process, but a memory cgroup kills on RssAnon,
and glibc keeps freed tensor memory in heap holes, so RssAnon follows malloc's high-water mark and
the saving is lost. Fixed malloc thresholds (Note [Returning freed memory]) would remap every
large tensor on each allocation. Instead, once a spilling arena is used (disk backing or a
per-file stash), malloc_trim(0) runs after a CPU layer's forward and backward, returning whole
free pages; by default ("pressure") only when spillarena.memory_limits()["pressure"] is at least
PRESSURE_THRESHOLD, because a trim costs time. "return" trims after every layer. The policy is
process-wide, as malloc is, read once from SPILLARENA_MALLOC; without glibc nothing is done.
Figures: docs/benchmarks.md, "Returning freed memory from Python (spillarena.malloc)".

Note [Reading the pressure once in a while]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Reading the pressure (the cgroup's files and /proc/meminfo) takes 30-140 us, twice per layer: at
1 MiB layer inputs that was about a fifth of what spilling added to a step (issue 40). A reading
below half the threshold is reused for PRESSURE_READING_S: memory that fills at the rate pages can
be faulted in on this machine (2-3 GB/s: docs/benchmarks_archive.md, "Hashing beside the kernel's
copy") moves less than a quarter of a 2.9 GB limit in that time, so no reading skipped can have
crossed the threshold. Near it, every layer reads again.
"""

import ctypes
import ctypes.util
import os
import threading
import time

from . import _C
from . import arena as _arena
from .errors import InvalidArgumentError

ENVIRONMENT_VARIABLE = "SPILLARENA_MALLOC"
POLICIES = ("pressure", "return", "keep")
PRESSURE_THRESHOLD = 0.5
PRESSURE_READING_S = 0.05  # Note [Reading the pressure once in a while]

_lock = threading.Lock()
_state = {"policy": None, "active": False, "reason": None, "applications": 0, "trims": 0,
          "trim_seconds": 0.0, "skipped": 0, "pressure": None, "pressure_reads": 0}
_pressure_read_at = 0.0  # time.monotonic() of _state["pressure"]
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
    """Whether `arena` (a SpillArena or a stash) keeps layer inputs outside the process."""
    if isinstance(arena, _arena.SpillArena):
        return arena.backing == "disk"
    return arena.spills


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


def _pressure() -> float:
    """The last reading while it is recent and low, else a new one (see the Note)."""
    global _pressure_read_at
    last, now = _state["pressure"], time.monotonic()
    recent = now - _pressure_read_at < PRESSURE_READING_S
    if last is not None and last < PRESSURE_THRESHOLD / 2 and recent:
        return last
    pressure = _memory_pressure()
    with _lock:
        _state["pressure"], _state["pressure_reads"] = pressure, _state["pressure_reads"] + 1
        _pressure_read_at = now
    return pressure


def layer_done(device_type="cpu"):
    """The checkpoint's hook once a spilled layer's forward or backward has run on
    `device_type`: gives the freed working set back (a no-op unless the policy is in force;
    under "pressure", only once memory is tight — see the Note)."""
    if not _state["active"] or device_type != "cpu":
        return
    if _state["policy"] == "pressure":
        pressure = _pressure()
        with _lock:  # layers may end on several threads at once: the counters stay exact
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
    their seconds), skipped (layers under the pressure threshold), pressure (the last read),
    pressure_reads (how many were read: Note [Reading the pressure once in a while])."""
    return dict(_state)
