"""spillarena.offload: every tensor autograd saves, at least ``min_bytes`` of it, goes to a
SpillArena while the context is active, and comes back in backward. No checkpoint, no recompute:
torch's ``save_on_cpu`` with the disk in place of host RAM.

    with spillarena.offload(arena, min_bytes=1 << 20) as spilled:  # arena=None: default_arena()
        loss = model(**batch).loss
    loss.backward()                  # each saved tensor read back, prefetched in backward order
    spilled.stats()                  # {"tensors_stored": ..., "bytes_stored": ..., ...}

See Note [Saved tensors to the arena].
"""

import threading
import weakref

import torch

from . import arena as _arena
from . import arguments as _arguments
from . import automatic as _automatic
from . import layout as _layout
from . import malloc as _malloc
from .arena_stash import make_arena_stash
from .checkpoint import arena_holds, check_arena, is_weight
from .errors import CheckpointError, InvalidArgumentError

# Note [Saved tensors to the arena]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A checkpoint keeps one tensor per layer (its input) and recomputes the rest; offload keeps
# nothing and recomputes nothing: under torch.autograd.graph.saved_tensors_hooks each tensor
# autograd saves goes to the arena in the forward and is read back when backward unpacks it —
# the tensors of no-checkpointing, the memory of neither. What stays as torch keeps it: tensors
# under min_bytes (their I/O would cost more than their memory), parameters and views of them
# (they stay in memory anyway; spilling a weight writes it at every use), and tensors the arena
# cannot hold (sparse, nested, meta, a dispatch subclass: one SpillArenaWarning per kind).
# Several saved views of one tensor (x and x.t() in a linear layer) are written once: the first
# save stores the base they share, every later one of the same base and version reuses it, and
# backward restores it once and rebuilds each view with its own sizes, strides and offset — where
# as_strided can: a contiguous base of the view's dtype, the view neither conjugated nor negated
# and covering at least half of it. Any other view (view_as_complex, conj(), a small slice of a
# large tensor, a view of a strided base) is stored alone with its layout (layout.compact and
# restore, as layer inputs are), so nothing is rebuilt from bytes of another type or layout. The
# stash is the arena's (the same regions, integrity check, overflow rule, growth and stats as
# layer inputs), a chain of its own per context, so prefetching follows the saved tensors'
# order, which backward reverses. Torch does not check a saved tensor's version once hooks
# repack it; so a restore checks it (the stash's own check, torch's words), and a tensor kept in
# memory is checked the same way at unpack: a tensor changed in place after it was saved raises,
# as without offload. A restored tensor is kept by its handle for further unpacks
# (retain_graph=True) and goes with it when the engine frees the node's saved tensors. LibTorch
# has no saved-tensor hooks without Python (they are Python objects), so this is Python's alone;
# the bytes still move in the C++ core, through the stash's chain.

_OFFLOAD_ACTIVE = threading.local()  # .context: the offload entered on this thread, if any


class _Kept:
    """A saved tensor kept in memory, with the version it was saved at."""

    __slots__ = ("tensor", "version")

    def __init__(self, tensor):
        self.tensor, self.version = tensor, tensor._version

    def unpack(self):
        if self.tensor._version != self.version:
            raise CheckpointError(
                "spillarena.offload: one of the variables needed for gradient computation has "
                "been modified by an inplace operation: a saved tensor of shape "
                f"{list(self.tensor.shape)} is at version {self.tensor._version}; expected "
                f"version {self.version} instead")
        return self.tensor


class _StoredBase:
    """A tensor's bytes in the stash (its smallest dense view: layout.compact), restored once
    for every saved tensor rebuilt from it (the region goes back when the last of their handles
    dies unrestored: the stash's own entry frees it)."""

    def __init__(self, stashed, layout):
        self.stashed, self.layout = stashed, layout
        self.restored = None

    def get(self):
        if self.restored is None:
            # Note [The spill's own operations are not the layer's] in layout.py
            with _layout.outside_dispatch_modes():
                restored = self.stashed.restore()
                self.stashed.free()
                self.restored = _layout.restore(restored, self.layout)
        return self.restored


class _SavedWhole:
    """A saved tensor that is itself what was stored."""

    __slots__ = ("base",)

    def __init__(self, base):
        self.base = base

    def unpack(self):
        return self.base.get()


class _SavedView:
    """A saved view of a stored contiguous base of its dtype, rebuilt with its sizes, strides and
    offset."""

    __slots__ = ("base", "offset", "size", "stride")

    def __init__(self, base, tensor, base_tensor):
        self.base = base
        self.size, self.stride = tensor.shape, tensor.stride()
        self.offset = tensor.storage_offset() - base_tensor.storage_offset()

    def unpack(self):
        base = self.base.get()  # the arenas give it back at offset 0; a stand-in may not
        return base.as_strided(self.size, self.stride, base.storage_offset() + self.offset)


def _shareable_base(view):
    """The base ``view`` can be rebuilt from with as_strided, or None: a contiguous base of the
    view's dtype, neither of them conjugated or negated, the view covering at least half of it (a
    small slice of a large tensor is stored alone, not its whole base)."""
    base = view._base
    if (base is None or view.is_conj() or view.is_neg() or base.is_conj() or base.is_neg()
            or base.dtype != view.dtype or not base.is_contiguous()
            or 2 * view.numel() < base.numel()):
        return None
    return base


class offload:  # lower case, as torch's save_on_cpu: used as a context manager
    """Every tensor autograd saves while active, of at least ``min_bytes``, goes to ``arena``
    (a SpillArena, an AutomaticArena, or None: the process's default_arena()) and comes back in
    backward; parameters, smaller tensors and tensors the arena cannot hold stay as torch keeps
    them (Note [Saved tensors to the arena]). Enter it once, on one thread, not inside another
    offload; InvalidArgumentError otherwise, with nothing changed."""

    def __init__(self, arena=None, *, min_bytes=1 << 20):
        check_arena(arena, "spillarena.offload", stash_too=False)
        self.min_bytes = _arguments.min_bytes(min_bytes, "spillarena.offload")
        self._arena = arena
        self._stash = None  # a chain of its own in _stash_arena, made at the first spill
        self._stash_arena = None
        self._hooks = None
        self._thread = None
        # id(base tensor) -> (weakref to it, its version, weakref to its _StoredBase): both weak,
        # so a base's region goes when the last view saved of it dies (tensors compare by value,
        # so they cannot be a WeakKeyDictionary's keys)
        self._bases = {}
        self._counts = dict.fromkeys(
            ("tensors_stored", "bytes_stored", "views_shared", "kept_small", "kept_weights",
             "kept_unstorable"), 0)

    def stats(self) -> dict:
        """What this context did: tensors and bytes stored in the arena's stash (spilled once
        keep_last newer ones were stored; the arena's stash_stats() count what reached the disk),
        views that shared a stored base, tensors kept in memory (small, weights, unstorable)."""
        return dict(self._counts)

    def __enter__(self):
        if self._hooks is not None:
            raise InvalidArgumentError(
                "spillarena.offload: this context is entered already; make one per `with`")
        if getattr(_OFFLOAD_ACTIVE, "context", None) is not None:
            raise InvalidArgumentError(
                "spillarena.offload: another spillarena.offload is active on this thread; "
                "offload contexts do not nest (the inner one would see the outer's handles)")
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        hooks.__enter__()
        self._hooks, self._thread = hooks, threading.get_ident()
        _OFFLOAD_ACTIVE.context = self
        return self

    def __exit__(self, *exc):
        if self._hooks is None:
            raise InvalidArgumentError("spillarena.offload: exited without being entered")
        if threading.get_ident() != self._thread:
            raise InvalidArgumentError(
                "spillarena.offload: exited on another thread than it was entered on; torch's "
                "saved-tensor hooks belong to the thread that set them: exit it there")
        if not self._on_top():
            raise InvalidArgumentError(
                "spillarena.offload: exited while saved-tensor hooks entered after it are still "
                "active (save_on_cpu, another saved_tensors_hooks); exit those first: torch's "
                "hooks are a stack, and this exit would remove theirs, not its own")
        hooks, self._hooks = self._hooks, None
        _OFFLOAD_ACTIVE.context = None
        hooks.__exit__(*exc)
        return False

    def _on_top(self):
        """Whether this context's hooks are the innermost (True where torch cannot say)."""
        top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
        if top is None:
            return True
        hooks = top(False)
        return hooks is not None and hooks[0] == self._pack

    # -- packing and unpacking ------------------------------------------------------------------

    def _pack(self, tensor):
        if is_weight(tensor):
            self._counts["kept_weights"] += 1
            return _Kept(tensor)
        if tensor.numel() * tensor.element_size() < self.min_bytes:
            self._counts["kept_small"] += 1
            return _Kept(tensor)
        if not arena_holds(tensor, "spillarena.offload", "saved tensor"):
            self._counts["kept_unstorable"] += 1
            return _Kept(tensor)
        if tensor._base is None:
            return _SavedWhole(self._stored(tensor))
        base = _shareable_base(tensor)
        if base is not None:
            return _SavedView(self._stored(base), tensor, base)
        return _SavedWhole(self._store(tensor))  # its own bytes, its own layout

    def _stored(self, root):
        """``root`` (a tensor that is no view) in the stash: stored at its first save, shared by
        the later ones of the same version."""
        key = id(root)
        known = self._bases.get(key)
        if known is not None and known[0]() is root and known[1] == root._version:
            stored = known[2]()
            if stored is not None:
                self._counts["views_shared"] += 1
                return stored
        stored = self._store(root)
        bases = self._bases
        self._bases[key] = (weakref.ref(root, lambda _: bases.pop(key, None)), root._version,
                            weakref.ref(stored))
        return stored

    def _store(self, tensor):
        # Note [The spill's own operations are not the layer's] in layout.py; the live tensor,
        # not a detached copy: the stash checks its version at restore
        with _layout.outside_dispatch_modes():
            compact, layout = _layout.compact(tensor)
            stored = _StoredBase(self._stash_for(tensor).store(compact, what="saved tensor"),
                                 layout)
        self._counts["tensors_stored"] += 1
        self._counts["bytes_stored"] += compact.numel() * compact.element_size()
        return stored

    def _stash_for(self, tensor):
        """The stash for ``tensor``: a chain of this context's own in the arena; an
        AutomaticArena without an arena yet keeps it in memory (Note [No room for the first
        arena] in automatic.py)."""
        arena = _automatic.resolve(self._arena, tensor)
        if not isinstance(arena, _arena.SpillArena):
            return arena
        if self._stash is None or self._stash_arena is not arena:
            self._stash, self._stash_arena = make_arena_stash(arena), arena
            _malloc.use_for_spilling(self._stash)  # freed memory goes back, as under checkpoint
        return self._stash

    @staticmethod
    def _unpack(packed):
        return packed.unpack()


__all__ = ["offload"]
