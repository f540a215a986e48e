"""The arena stash's chain of stored inputs, C++ spill::detail::Chain (src/core/stash/chain.h),
held by its handle (Note [C++ objects Python holds]). The bytes go in and come back as DLPack
capsules (Note [The stash moves bytes] in src/core/stash/buffer.cc)::

    chain = Chain(_C._shared_chain(arena_handle))
    stored = chain.store(capsule, accelerator, "layer input of shape ...", True, watch, version)
    capsule = stored.restore()                        # 1-D uint8, once
"""

from . import _C
from .shared_on_copy import SharedOnCopy
from .stash import TensorStash


class Stored:
    """A layer input's bytes in the chain (the C++ handle of Note [C++ objects Python holds]);
    restore() once."""

    __slots__ = ("_handle",)

    def __init__(self, handle):
        self._handle = handle

    def restore(self):
        """The stored bytes as a DLPack capsule (1-D uint8); CheckpointError after restore() or
        free(), or for an input changed in place since store()."""
        return _C._stored_restore(self._handle)

    def prefetch(self) -> None:
        _C._stored_prefetch(self._handle)

    def free(self) -> None:
        _C._stored_free(self._handle)

    @property
    def restored(self) -> bool:
        return _C._stored_restored(self._handle)


class Chain(SharedOnCopy):
    """The arena stash's chain of stored inputs (C++ spill::detail::Chain)."""

    _pickle_refusal = TensorStash._pickle_refusal

    def __init__(self, handle):
        self._handle = handle

    @property
    def name(self) -> str:
        return _C._chain_name(self._handle)

    def stats(self) -> dict:
        return _C._chain_stats(self._handle)

    def store(self, capsule, accelerator: bool, describe: str, layer_input: bool, watch,
              version: int) -> Stored:
        """The bytes of ``capsule`` stored; refused at restore (or spill) once ``watch._version``
        moved past ``version`` (an input changed in place)."""
        return Stored(_C._chain_store(self._handle, capsule, accelerator, describe, layer_input,
                                      watch, version))
