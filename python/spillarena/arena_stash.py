"""The arena stash: a layer input's bytes in regions of a SpillArena, written and read back by
the C++ chain (chain.py), overlapped with compute. What only a tensor has — shape, dtype,
strides, its version — stays here::

    stash = spillarena.make_arena_stash(arena)       # a chain of its own; or, as checkpoint does:
    stash = shared_arena_stash(arena)                 # the arena's one chain
    held = stash.store(x)                             # spilled once keep_last newer ones exist
    y = held.restore()                                # same values, shape, dtype, device; once
"""

from __future__ import annotations

import torch
from torch.utils import dlpack as _dlpack

from . import _C
from . import device_copies as _device_copies
from .arena import handle_of
from .chain import Chain, Stored
from .errors import InvalidArgumentError
from .stash import StashedTensor, TensorStash
from .storable import check_storable
from .version_watch import version_watch


def make_arena_stash(arena, **options) -> TensorStash:
    """A stash of its own in the regions of `arena` (it keeps the arena alive). Keywords as in
    spill::StashOptions (asynchronous, prefetch_depth, keep_last, gds_buffer_bytes); by default
    the arena's."""
    return _ArenaStash(Chain(_C._make_chain(handle_of(arena, "make_arena_stash"), options)))


def shared_arena_stash(arena) -> TensorStash:
    """The arena's shared stash, as spill::checkpoint uses it: consecutive layers form one chain
    for prefetching and keep_last."""
    return _ArenaStash(Chain(_C._shared_chain(handle_of(arena, "shared_arena_stash"))))


class _ArenaStash(TensorStash):
    """The arena stash: the bytes in regions of a SpillArena, overlapped with compute."""

    def __init__(self, chain: Chain):
        self._chain = chain

    @property
    def name(self) -> str:
        return self._chain.name

    @property
    def spills(self) -> bool:
        return self._chain.name == "disk"  # the arena's backing; "ram" keeps them in the process

    def stats(self) -> dict:
        return self._chain.stats()

    def store(self, tensor: torch.Tensor, *, what: str = "layer input") -> StashedTensor:
        """Keeps the tensor in the stash (spilled to the arena once keep_last newer ones were
        stored). An input that finds no room stays in memory (when_full='keep_in_memory', with one
        SpillArenaWarning per arena) or raises ArenaExhaustedError (when_full='error')."""
        check_storable(tensor, self.name)
        accelerator = tensor.device.type != "cpu"
        if accelerator and tensor.device.type not in _device_copies.DEVICE_TYPES:
            raise InvalidArgumentError(
                f"spill: the {self.name} stash spills inputs on the CPU, CUDA, ROCm or XPU; got "
                f"one on {tensor.device}. Keep it with make_in_memory_stash(), or move it"
            )
        capsule = _dlpack.to_dlpack(_bytes_of(tensor))
        # Autograd's rule for saved tensors: an in-place change after store() is refused, by the
        # stash protocol through the watch (Note [A version kept without the bytes]).
        stored = self._chain.store(capsule, accelerator, _describe(tensor, what),
                                   what == "layer input", version_watch(tensor), tensor._version)
        return _ArenaStashed(stored, tensor)


class _ArenaStashed(StashedTensor):
    """What only a tensor has (shape, dtype, the strides a restore rebuilds) beside its bytes in
    the chain (Note [One stash protocol, two front ends] in src/core/stash/stored_bytes.cc)."""

    def __init__(self, stored: Stored, tensor: torch.Tensor):
        self._stored = stored
        self._shape, self._dtype = tensor.shape, tensor.dtype
        self._strides = _C._strides_to_keep(tensor.shape, tensor.stride())

    @property
    def restored(self) -> bool:
        return self._stored.restored

    def prefetch(self) -> None:
        self._stored.prefetch()

    def free(self) -> None:
        self._stored.free()

    def restore(self) -> torch.Tensor:
        capsule = self._stored.restore()
        restored = _dlpack.from_dlpack(capsule).view(self._dtype).view(self._shape)
        if self._strides is None:
            return restored
        return torch.empty_strided(self._shape, self._strides, dtype=self._dtype,
                                   device=restored.device).copy_(restored)


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's contiguous bytes as a 1-D uint8 tensor (the layout the chain takes); a lazily
    conjugated or negated view is materialized first, so the bytes are its values."""
    flat = tensor.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat


def _describe(tensor: torch.Tensor, what: str = "layer input") -> str:
    dtype = str(tensor.dtype).replace("torch.", "")
    shape = "[" + ", ".join(str(s) for s in tensor.shape) + "]"
    nbytes = tensor.numel() * tensor.element_size()
    return f"{what} of shape {shape}, dtype {dtype}, {nbytes} bytes"

