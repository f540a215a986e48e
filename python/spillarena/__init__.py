"""spillarena: gradient checkpointing whose saved layer inputs live in one preallocated spill file.

    import spillarena
    spillarena.enable(model)                          # any transformers PreTrainedModel
    print(spillarena.arena_of(model).stats())         # made at the first layer input, grows
    # or, in a plain loop:
    h = spillarena.checkpoint(block, h)               # like torch.utils.checkpoint.checkpoint
    # or an arena sized and placed by hand:
    arena = spillarena.SpillArena(
        spillarena.bytes_for_layer_inputs(32, (1, 8192, 4096), torch.bfloat16), "/mnt/nvme")
    spillarena.enable(model, arena)

The arena, its allocator and its I/O are C++ (spillarena._C); Python holds no spilled bytes.
"""

import torch

from . import _build_info

__version__ = _build_info.SPILLARENA_VERSION


def _release(torch_version: str) -> str:
    return ".".join(torch_version.split("+")[0].split(".")[:2])


def _check_torch_version(running: str, built: str) -> None:
    # Importing _C under another torch release fails with undefined c10 symbols, or worse, loads
    # and misbehaves (Note [Build against the installed torch] in python/CMakeLists.txt). pip
    # refuses such an install already (Note [A wheel is pinned to its torch release]); this is
    # for the one forced past it (--no-deps) or a torch changed after the install.
    if _release(running) != _release(built):
        raise ImportError(
            f"spillarena {_build_info.SPILLARENA_VERSION} was built against torch {built} and "
            f"needs torch {_release(built)}.*, but torch {running} is installed. Install the "
            f"spillarena wheel built for torch {_release(running)} (scripts/build_wheel.sh in an "
            "environment with that torch makes one), or build it from source against this torch: "
            "pip install --no-build-isolation --force-reinstall --no-deps <spillarena source>"
        )


_check_torch_version(torch.__version__, _build_info.TORCH_VERSION)

from . import _C  # noqa: E402,F401  (after the version check, on purpose)
from ._C import (  # noqa: E402
    ARENA_OPTIONS,
    ARENA_STATS,
    MAX_CAPACITY_BYTES,
    MAX_STAGING_BYTES,
    STASH_OPTIONS,
    STASH_STATS,
    SpillArena,
    StashedTensor,
    TensorStash,
    default_spill_directory,
    make_arena_stash,
    make_in_memory_stash,
    make_per_file_stash,
    memory_limits,
    shared_arena_stash,
)
from . import errors  # noqa: E402  (its classes come from _C's table of error types)
from .errors import *  # noqa: E402,F403  (Error, IoError, ...: errors.__all__)
from . import malloc  # noqa: E402  (the freed-memory policy of spilling arenas; see its Note)
from .automatic import AutomaticArena, default_arena  # noqa: E402
from .checkpoint import checkpoint  # noqa: E402
from .hf import arena_of, disable, enable  # noqa: E402
from .sequential import checkpoint_sequential  # noqa: E402
from .sizing import bytes_for_layer_input, bytes_for_layer_inputs  # noqa: E402

__all__ = [
    "ARENA_OPTIONS",
    "ARENA_STATS",
    "MAX_CAPACITY_BYTES",
    "MAX_STAGING_BYTES",
    "STASH_OPTIONS",
    "STASH_STATS",
    "AutomaticArena",
    "SpillArena",
    "StashedTensor",
    "TensorStash",
    "arena_of",
    "bytes_for_layer_input",
    "bytes_for_layer_inputs",
    "checkpoint",
    "checkpoint_sequential",
    "default_arena",
    "default_spill_directory",
    "disable",
    "enable",
    "make_arena_stash",
    "make_in_memory_stash",
    "make_per_file_stash",
    "malloc",
    "memory_limits",
    "shared_arena_stash",
    *errors.__all__,
]
