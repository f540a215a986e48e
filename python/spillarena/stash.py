"""Where spillarena.checkpoint keeps a layer input between forward and backward: the types every
stash has. The kinds are one module each (arena_stash.py, in_memory_stash.py,
per_file_stash.py)::

    stash = spillarena.make_arena_stash(arena)       # or make_in_memory_stash(), ...
    held = stash.store(x)                             # spilled once keep_last newer ones exist
    y = held.restore()                                # same values, shape, dtype, device; once
"""

from __future__ import annotations

import torch

from . import _C
from .shared_on_copy import SharedOnCopy

__all__ = ["StashedTensor", "TensorStash"]


class StashedTensor:
    """A tensor held by a stash; restore() gives it back once."""

    def restore(self) -> torch.Tensor:
        raise NotImplementedError

    def prefetch(self) -> None:
        """Starts bringing the tensor back without waiting; restore() then finds it ready."""

    def free(self) -> None:
        """Free the stored bytes now."""

    restored = False


class TensorStash(SharedOnCopy):
    """Where spillarena.checkpoint keeps layer inputs between forward and backward. Copies share
    it; it cannot be pickled."""

    _pickle_refusal = (
        "spillarena: a TensorStash cannot be pickled: it is an open spill file of this process. "
        "Save the model's state_dict(), or call spillarena.disable(model) before pickling it "
        "(copy.deepcopy works: the copy shares the arena)"
    )

    name = "?"
    spills = False  # whether it keeps layer inputs outside the process (malloc.py asks)

    def store(self, tensor: torch.Tensor, *, what: str = "layer input") -> StashedTensor:
        """Keeps ``tensor``; ``what`` names it in messages ("saved tensor", "op output"). A
        stash that counts counts a "layer input" (the default) in its stats' inputs_* and
        anything else apart, in saved_tensors_*."""
        raise NotImplementedError

    def stats(self) -> dict:
        """A dict keyed by spill::StashStats field names (zeros for stashes without an arena)."""
        return dict.fromkeys(_C.STASH_STATS, 0)


# What restore() raises (CheckpointError) the second time, or after free(): the stash
# protocol's one wording (spill::detail::kAlreadyRestored, src/core/stash/stored_bytes.h).
ALREADY_RESTORED = _C._ALREADY_RESTORED
