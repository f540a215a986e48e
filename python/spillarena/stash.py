"""Where spillarena.checkpoint keeps a layer input between forward and backward: the tensor side
of the stash. The bytes go to the C++ chain as DLPack capsules (Note [The stash moves bytes] in
src/core/stash/buffer.cc); what only a tensor has — shape, dtype, strides, its version — stays
here::

    stash = spillarena.make_arena_stash(arena)       # or shared_arena_stash(arena)
    held = stash.store(x)                             # spilled once keep_last newer ones exist
    y = held.restore()                                # same values, shape, dtype, device; once
"""

from __future__ import annotations

import io
import weakref

import torch
from torch.utils import dlpack as _dlpack

from . import _C
from . import device_copies as _device_copies
from .errors import CheckpointError, InvalidArgumentError


class StashedTensor:
    """A tensor held by a stash; restore() gives it back once."""

    def restore(self) -> torch.Tensor:
        raise NotImplementedError

    def prefetch(self) -> None:
        """Starts bringing the tensor back without waiting; restore() then finds it ready."""

    def free(self) -> None:
        """Free the stored bytes now."""

    restored = False


# Note [An arena is shared by copies, never pickled]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# An arena (and a stash over one) is a resource of this process, like an open file: its spill
# file has no name to reopen and its regions belong to this process's graphs. copy.copy and
# copy.deepcopy return the object itself, so copy.deepcopy(model) after spillarena.enable (EMA
# copies, trainers that copy models) gives a model whose checkpoint function spills to the same
# arena (issue 19). Pickling raises InvalidArgumentError saying what to do instead.
class SharedOnCopy:
    """A resource of this process, like an open file: copy.copy and copy.deepcopy give back the
    object itself (a deep-copied model spills to the same arena); pickling raises
    InvalidArgumentError with ``_pickle_refusal``."""

    _pickle_refusal = "spillarena: this object cannot be pickled"

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce_ex__(self, protocol):
        raise InvalidArgumentError(self._pickle_refusal)


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


def storable_kind(tensor: torch.Tensor):
    """None when a stash can hold ``tensor``'s bytes (a dense tensor with data of its own);
    else what it is, for messages: "sparse_coo", "nested", "meta", "quantized",
    "MyWrapper subclass"."""
    if tensor.is_nested:
        return "nested"
    if tensor.layout != torch.strided:
        return str(tensor.layout).replace("torch.", "")
    if tensor.is_meta:
        return "meta"
    if tensor.is_quantized:  # its scale and zero point are no bytes of its storage
        return "quantized"
    # A subclass with a __torch_dispatch__ of its own (DTensor, a functional or wrapper tensor)
    # may have no storage behind it: what its data_ptr() shows is not its values.
    if type(tensor).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__:
        return f"{type(tensor).__name__} subclass"
    return None


def _check_storable(tensor: torch.Tensor, name: str) -> None:
    kind = storable_kind(tensor)
    if kind is None:
        return
    raise InvalidArgumentError(
        f"spill: the {name} stash stores dense tensors with data; got a {kind} tensor on "
        f"{tensor.device}. Make it dense (to_dense()) and give it data, or keep it with "
        "make_in_memory_stash()"
    )


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


# Note [A version kept without the bytes]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Autograd refuses a saved tensor changed in place after it was saved; the stash must too, or it
# gives back changed bytes: it holds the live input until the input is written (keep_last, a
# write in flight), and a write that starts after the change writes the change. The check needs
# the tensor's version counter, which Python reads only through a tensor sharing it. A weak
# reference to the input missed every change made before its last Python reference died (h =
# x * 2; s = h.sin(); h.mul_(3); return s: a silent wrong gradient under offload and offload
# policies, found by a red-team run). A strong one would keep the bytes the stash exists to let
# go. So the stash keeps a watch: a detached alias of the input (which shares its version
# counter) whose storage is then swapped for an empty one below autograd's in-place tracking
# (set_() under _AutoDispatchBelowADInplaceOrView: no version bump, no bytes held). It reads the
# input's version for as long as the stashed tensor lives. A torch without the guard gets the
# weak reference's check instead.
def version_watch(tensor: torch.Tensor):
    """An object whose ``_version`` is ``tensor``'s, now and after ``tensor`` is gone, holding
    none of its bytes (Note [A version kept without the bytes])."""
    below = getattr(torch._C, "_AutoDispatchBelowADInplaceOrView", None)
    if below is None or not hasattr(torch._C, "_SetExcludeDispatchKeyGuard"):
        return _WeakVersion(tensor)
    alias = detached(tensor)
    with below():
        alias.set_()
    return alias


def detached(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` detached, sharing its version counter also when called below autograd (inside
    a dispatch mode, an offload policy's, a plain detach() would not): the view tracking is
    switched back on for it, as torch's own selective checkpoint does. Plain detach() where this
    torch lacks the guard."""
    exclude = getattr(torch._C, "_SetExcludeDispatchKeyGuard", None)
    if exclude is None:
        return tensor.detach()
    with exclude(torch._C.DispatchKey.ADInplaceOrView, False):
        return tensor.detach()


class _WeakVersion:
    """The version of a tensor while it lives; the last one seen after (the weak check)."""

    def __init__(self, tensor):
        base = tensor._base if tensor._base is not None else tensor
        self._ref, self._seen = weakref.ref(base), tensor._version

    @property
    def _version(self):
        base = self._ref()
        if base is not None:
            self._seen = base._version
        return self._seen


class _ArenaStashed(StashedTensor):
    def __init__(self, stored, tensor: torch.Tensor, description: str):
        self._stored = stored
        self._shape, self._dtype = tensor.shape, tensor.dtype
        dense = not tensor.is_contiguous() and _non_overlapping_and_dense(tensor)
        self._strides = tensor.stride() if dense else None
        # Autograd's rule for saved tensors: an in-place change after store() is refused (Note
        # [A version kept without the bytes]).
        self._watch, self._version = version_watch(tensor), tensor._version
        self._describe = description

    @property
    def restored(self) -> bool:
        return self._stored.restored

    def prefetch(self) -> None:
        self._stored.prefetch()

    def free(self) -> None:
        self._stored.free()

    def restore(self) -> torch.Tensor:
        if self._watch._version != self._version:
            raise CheckpointError(
                "spill::checkpoint: one of the variables needed for gradient computation has "
                f"been modified by an inplace operation: the stashed {self._describe} was "
                "changed between forward and backward; clone it before changing it, or do not "
                "modify it in place"
            )
        capsule = self._stored.restore()
        restored = _dlpack.from_dlpack(capsule).view(self._dtype).view(self._shape)
        if self._strides is None:
            return restored
        return torch.empty_strided(self._shape, self._strides, dtype=self._dtype,
                                   device=restored.device).copy_(restored)


def _non_overlapping_and_dense(t: torch.Tensor) -> bool:
    """A permutation of a contiguous layout (a transpose): what restore() gives back as it was."""
    dims = sorted((s, n) for s, n in zip(t.stride(), t.shape) if n != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


class _Stored:
    """A layer input's bytes in the chain (the C++ handle of Note [C++ objects Python holds]);
    restore() once."""

    __slots__ = ("_handle",)

    def __init__(self, handle):
        self._handle = handle

    def restore(self):
        """The stored bytes as a DLPack capsule (1-D uint8); CheckpointError after restore() or
        free()."""
        return _C._stored_restore(self._handle)

    def prefetch(self) -> None:
        _C._stored_prefetch(self._handle)

    def free(self) -> None:
        _C._stored_free(self._handle)

    @property
    def restored(self) -> bool:
        return _C._stored_restored(self._handle)


class _Chain(SharedOnCopy):
    """The arena stash's chain of stored inputs (C++ spill::detail::Chain)."""

    _pickle_refusal = TensorStash._pickle_refusal

    def __init__(self, handle):
        self._handle = handle

    @property
    def name(self) -> str:
        return _C._chain_name(self._handle)

    def stats(self) -> dict:
        return _C._chain_stats(self._handle)

    def store(self, capsule, accelerator: bool, describe: str, layer_input: bool) -> _Stored:
        return _Stored(_C._chain_store(self._handle, capsule, accelerator, describe, layer_input))


class _ArenaStash(TensorStash):
    """The arena stash: the bytes in regions of a SpillArena, overlapped with compute."""

    def __init__(self, chain):
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
        _check_storable(tensor, self.name)
        accelerator = tensor.device.type != "cpu"
        if accelerator and tensor.device.type not in _device_copies.DEVICE_TYPES:
            raise InvalidArgumentError(
                f"spill: the {self.name} stash spills inputs on the CPU, CUDA, ROCm or XPU; got "
                f"one on {tensor.device}. Keep it with make_in_memory_stash(), or move it"
            )
        capsule = _dlpack.to_dlpack(_bytes_of(tensor))
        description = _describe(tensor, what)
        stored = self._chain.store(capsule, accelerator, description, what == "layer input")
        return _ArenaStashed(stored, tensor, description)


_ALREADY_RESTORED = (
    "spillarena: this stashed tensor was already restored (or freed); its region was consumed. "
    "Run forward again for a new graph (retain_graph is not supported with spilled inputs)"
)


class _InMemoryStashed(StashedTensor):
    def __init__(self, tensor):
        self._tensor = tensor

    def restore(self):
        if self.restored or self._tensor is None:
            raise CheckpointError(_ALREADY_RESTORED)
        tensor, self._tensor, self.restored = self._tensor, None, True
        return tensor

    def free(self):
        self._tensor = None


class _InMemoryStash(TensorStash):
    name = "recompute"

    def store(self, tensor, *, what="layer input"):
        return _InMemoryStashed(tensor.detach())


class _PerFileStashed(StashedTensor):
    def __init__(self, file, device):
        self._file, self._device = file, device

    def restore(self):
        if self.restored or self._file is None:
            raise CheckpointError(_ALREADY_RESTORED)
        self.restored = True
        data = _C._per_file_restore(self._file)
        t = torch.load(io.BytesIO(data), weights_only=True)
        return t if self._device.type == "cpu" else t.to(self._device)

    def free(self):
        self._file = None  # the C++ file removes itself unrestored


class _PerFileStash(TensorStash):
    name = "per_file"
    spills = True

    def __init__(self, directory):
        self._files = _C._per_file_files(directory)

    def store(self, tensor, *, what="layer input"):
        _check_storable(tensor, self.name)
        buffer = io.BytesIO()
        torch.save(tensor.detach().cpu(), buffer)
        file = _C._per_file_store(self._files, buffer.getvalue())
        return _PerFileStashed(file, tensor.device)


def make_arena_stash(arena, **options) -> TensorStash:
    """A stash of its own in the regions of `arena` (it keeps the arena alive). Keywords as in
    spill::StashOptions (asynchronous, prefetch_depth, keep_last, gds_buffer_bytes); by default
    the arena's."""
    from .arena import handle_of  # arena.py imports this module

    return _ArenaStash(_Chain(_C._make_chain(handle_of(arena, "make_arena_stash"), options)))


def shared_arena_stash(arena) -> TensorStash:
    """The arena's shared stash, as spill::checkpoint uses it: consecutive layers form one chain
    for prefetching and keep_last."""
    from .arena import handle_of  # arena.py imports this module

    return _ArenaStash(_Chain(_C._shared_chain(handle_of(arena, "shared_arena_stash"))))


def make_in_memory_stash() -> TensorStash:
    """Keeps a reference to the input: classic gradient checkpointing, nothing spilled."""
    return _InMemoryStash()


def make_per_file_stash(directory) -> TensorStash:
    """One torch.save file per tensor (str, bytes or os.PathLike directory): the baseline
    spillarena replaces."""
    return _PerFileStash(directory)
