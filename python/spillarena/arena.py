"""spillarena.SpillArena: one preallocated spill file (or host-memory block) carved into regions
for layer inputs. The arena itself is C++ (spill::SpillArena); this class holds it::

    arena = spillarena.SpillArena(8 << 30, "/mnt/nvme")   # options of spill::ArenaOptions
    arena.stats()["bytes_in_use"], arena.options()["io"], arena.directory
"""

from __future__ import annotations

from . import _C
from .errors import InvalidArgumentError
from .shared_on_copy import SharedOnCopy


class SpillArena(SharedOnCopy):
    """One preallocated spill file (or host-memory block) carved into regions for layer inputs.
    Options as in spill::ArenaOptions and spill::StashOptions. Copies share it; it cannot be
    pickled."""

    _pickle_refusal = (
        "spillarena: a SpillArena cannot be pickled: it is an open spill file of this process. "
        "Save the model's state_dict(), or call spillarena.disable(model) before pickling it "
        "(copy.deepcopy works: the copy shares the arena)"
    )

    def __init__(self, capacity_bytes, directory=None, **options):
        self._handle = _C._arena_new(capacity_bytes, directory, options)
        # What never changes once it is made (backing, directory, file system, unnamed file).
        self._made = _C._arena_describe(self._handle)

    def stats(self) -> dict:
        """A dict keyed by spill::ArenaStats field names."""
        return _C._arena_stats(self._handle)

    def stash_stats(self) -> dict:
        """A dict keyed by spill::StashStats field names: what spillarena.checkpoint did with this
        arena's host budget (host pool, device bytes held, bytes in flight, waits)."""
        return _C._arena_stash_stats(self._handle)

    def options(self) -> dict:
        """The options as resolved (directory, I/O mode, rounded sizes), keyed by the field names
        of spill::ArenaOptions, then spill::StashOptions."""
        return _C._arena_options(self._handle)

    @property
    def capacity_bytes(self) -> int:
        return _C._arena_stats(self._handle)["capacity_bytes"]

    @property
    def backing(self) -> str:
        return self._made["backing"]

    @property
    def directory(self) -> str:
        return self._made["directory"]

    @property
    def file_system_type(self) -> str:
        return self._made["file_system_type"]

    @property
    def opened_without_name(self) -> bool:
        return self._made["opened_without_name"]

    def __repr__(self) -> str:
        d = _C._arena_describe(self._handle)
        where = (
            f"directory={d['directory']!r} ({d['file_system_type']})"
            if d["backing"] == "disk"
            else "backing='ram'"
        )
        return (
            f"<spillarena.SpillArena capacity_bytes={d['capacity_bytes']} {where} "
            f"bytes_in_use={d['bytes_in_use']}>"
        )


def handle_of(arena, what: str):
    """The C++ arena of a SpillArena, for the extension's functions."""
    if not isinstance(arena, SpillArena):
        raise InvalidArgumentError(
            f"spillarena: {what} needs a spillarena.SpillArena, got {type(arena).__name__}"
        )
    return arena._handle
