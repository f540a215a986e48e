"""The exceptions of spillarena: one class per C++ ``spill::Error`` type, same names, same messages.

The C++ extension raises these (see Note [Exception classes live in Python] in
python/src/errors_binding.cc) and sets the numbers each C++ error carries as attributes::

    try:
        arena = spillarena.SpillArena(64 << 30, "/mnt/nvme")
    except spillarena.InsufficientSpaceError as e:
        print(e, e.needed_bytes, e.available_bytes)
    except spillarena.Error as e:          # any other spillarena problem
        print(e)
"""


class Error(RuntimeError):
    """spill::Error: the base of every spillarena error."""


class InvalidArgumentError(Error, ValueError):
    """An option or argument out of range (capacity 0, a non-tensor layer input, ...)."""


class PathError(Error):
    """A file system call on ``path`` failed with ``errno``: the base of the two below."""


class DirectoryError(PathError):
    """The spill directory is missing, not a directory or not writable (``path``, ``errno``)."""


class MemoryBackedDirectoryError(Error):
    """The spill directory lives in RAM (tmpfs, ...) (``path``, ``file_system_type``)."""


# The name before 0.2 ("RAM-backed" read like the RAM arena); kept as an alias for now.
RamBackedDirectoryError = MemoryBackedDirectoryError


class InsufficientSpaceError(Error):
    """Less room than the capacity asked (``path``, ``needed_bytes``, ``available_bytes``)."""


class PreallocationError(PathError):
    """The file system cannot preallocate, or the mapping failed (``path``, ``errno``)."""


class ArenaExhaustedError(Error):
    """No free block is large enough (``requested_bytes``, ``free_bytes``, ``largest_free_block``).

    The arena is unchanged and stays usable."""


class MovedFromRegionError(Error):
    """A region handle was used after it was moved from or freed."""


class IoError(Error):
    """A read or write of region data failed (``errno``)."""


class IntegrityError(Error):
    """Bytes read back from a region are not those written there: the spill file or the disk
    changed behind the arena's back (``region_offset``, ``offset_in_region``, ``bytes``,
    ``expected_hash``, ``found_hash``). Raised before the bytes are used."""


class GdsUnavailableError(Error):
    """io="gds" was asked but GPUDirect Storage cannot run here: libcufile could not be loaded
    (``cufile_status`` 0) or cuFile refused to start (its CU_FILE_... code); ``library`` is the
    library searched."""


class ForkedProcessError(Error):
    """An arena (or a stash or region of it) was used in a child of fork(): an arena belongs to
    the process that made it (``creator_pid``, ``current_pid``). Make a new arena in the child."""


class CheckpointError(Error):
    """Misuse of the checkpoint wrapper, e.g. a second backward through the same graph."""


__all__ = [
    "Error",
    "InvalidArgumentError",
    "PathError",
    "DirectoryError",
    "MemoryBackedDirectoryError",
    "InsufficientSpaceError",
    "PreallocationError",
    "ArenaExhaustedError",
    "MovedFromRegionError",
    "IoError",
    "IntegrityError",
    "GdsUnavailableError",
    "ForkedProcessError",
    "CheckpointError",
]
