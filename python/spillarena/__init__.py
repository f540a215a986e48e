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

Errors are spillarena.errors.X (Error and the few a user catches are also spillarena.X); the
option and stats names are spillarena.fields. The arena, its allocator and its I/O are C++
(spillarena._C); Python holds no spilled bytes.
"""

import atexit
import re

import torch

from . import _build_info

__version__ = _build_info.SPILLARENA_VERSION


def _check_torch_version(running: str) -> None:
    # The extension links no torch (Note [One wheel for every torch] in python/CMakeLists.txt);
    # what it needs of torch's Python API is there from 2.11 on, the oldest release
    # scripts/wheel_matrix.sh checks. pip refuses an older torch (Requires-Dist: torch>=2.11);
    # this is for the one forced past it.
    release = tuple(int(p) for p in re.findall(r"\d+", running.split("+")[0])[:2])
    if release < _build_info.MINIMUM_TORCH:
        minimum = ".".join(map(str, _build_info.MINIMUM_TORCH))
        raise ImportError(
            f"spillarena {_build_info.SPILLARENA_VERSION} needs torch >= {minimum}, but torch "
            f"{running} is installed; install a newer torch (pip install 'torch>={minimum}')"
        )


_check_torch_version(torch.__version__)

from . import _C  # noqa: E402  (after the version check, on purpose)

# Note [No Python once the interpreter ends] in python/src/python_call.cc.
atexit.register(_C._close_python)
from ._C import default_spill_directory, memory_limits  # noqa: E402
from . import errors  # noqa: E402  (its classes come from _C's table of error types)
from . import fields  # noqa: E402  (ARENA_STATS, STASH_OPTIONS, ...: the C++ structs' fields)
from .errors import (  # noqa: E402  (the errors a user catches; the rest: spillarena.errors.X)
    ArenaExhaustedError,
    Error,
    InsufficientSpaceError,
    InvalidArgumentError,
    SpillArenaWarning,
)

# The other error classes stay attributes, as in 0.1.0, outside __all__: spillarena.errors.IoError
# is their name.
from .errors import (  # noqa: E402,F401
    CheckpointError,
    DirectoryError,
    ForkedProcessError,
    GdsUnavailableError,
    IntegrityError,
    IoError,
    MemoryBackedDirectoryError,
    MovedFromRegionError,
    PathError,
    PreallocationError,
)
from .arena import SpillArena  # noqa: E402
from . import malloc  # noqa: E402  (the freed-memory policy of spilling arenas; see its Note)
from .automatic import AutomaticArena, default_arena  # noqa: E402
from .checkpoint import checkpoint  # noqa: E402
from .hf import arena_of, disable, enable  # noqa: E402
from .offload import offload  # noqa: E402
from .policy import ATTENTION_OPS, selective_checkpoint_contexts  # noqa: E402
from .sequential import checkpoint_sequential  # noqa: E402
from .sizing import bytes_for_layer_input, bytes_for_layer_inputs  # noqa: E402
from .stash import StashedTensor, TensorStash  # noqa: E402
from .arena_stash import make_arena_stash  # noqa: E402
from .in_memory_stash import make_in_memory_stash  # noqa: E402
from .per_file_stash import make_per_file_stash  # noqa: E402

# What a user calls (docs/python_api.md counts them; tests/python/test_package.py holds the count).
__all__ = [
    "ATTENTION_OPS",
    "ArenaExhaustedError",
    "AutomaticArena",
    "Error",
    "InsufficientSpaceError",
    "InvalidArgumentError",
    "SpillArena",
    "SpillArenaWarning",
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
    "errors",
    "fields",
    "make_arena_stash",
    "make_in_memory_stash",
    "make_per_file_stash",
    "malloc",
    "memory_limits",
    "offload",
    "selective_checkpoint_contexts",
]
