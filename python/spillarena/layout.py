"""A layer input's layout, kept across the spill: what restore() gives back has the strides the
forward saw.

    stored, layout = compact(x)         # x.expand(...), x.t(), x[:, :-1], ...: a view of x
    stashed = stash.store(stored)       # fewer bytes when x was expanded
    x_again = restore(stashed.restore(), layout)   # x's shape and strides, x's values

See Note [A restored input keeps its layout].
"""

import contextlib

import torch

# Note [A restored input keeps its layout]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The stash stores a tensor's values and gives back a contiguous tensor. Autograd sees more than
# values: an expanded input (stride 0, as learned query tokens q.expand(batch, -1, -1) in
# Q-Former-style models) makes matmul fold the batch into one GEMM and save a [8, 8] tensor,
# where a dense input made it save [24, 8]; a slice with gaps (h[:, :-1]) sends linear down
# another path than a dense one. The recomputation then saved other tensors than the forward and
# the default form failed, where torch's checkpoint, which keeps the input itself, passes. So
# what goes to the stash is the smallest view that holds every value — each expanded dimension
# narrowed to one element (fewer bytes spilled, too) — and restore() rebuilds the layout around
# the stash's dense copy: with a permutation when the view is dense in some order (a transposed
# or channels-last input: no copy on either side), else into a tensor of the view's own strides
# (torch.empty_strided, then one copy; a slice with gaps), then the expansion. A view whose
# elements overlap other than through stride 0 cannot be rebuilt from its values alone; it comes
# back dense, as before. The storage offset is never kept: no saved tensor's shape depends on it.



class Layout:
    """How to turn the stored (contiguous) tensor back into the input's shape and strides."""

    __slots__ = ("expanded_to", "inverse", "size", "stride")

    def __init__(self, inverse=None, size=None, stride=None, expanded_to=None):
        self.inverse = inverse  # a permutation, or None
        self.size, self.stride = size, stride  # a strided rebuild, or None
        self.expanded_to = expanded_to  # the input's size when a dimension was expanded, or None


def _narrow_expanded(tensor):
    expanded = [d for d in range(tensor.dim()) if tensor.stride(d) == 0 and tensor.size(d) > 1]
    for d in expanded:
        tensor = tensor.narrow(d, 0, 1)
    return tensor, bool(expanded)


def _memory_order(tensor):
    """The permutation that makes ``tensor`` contiguous without a copy, or None."""
    order = sorted(range(tensor.dim()), key=lambda d: (-tensor.stride(d), d))
    return order if tensor.permute(order).is_contiguous() else None


def _overlaps(tensor):
    """Whether two indices of ``tensor`` reach one element (stride 0 excluded beforehand)."""
    extent = 1  # elements spanned by the dimensions of smaller stride
    for d in sorted(range(tensor.dim()), key=tensor.stride):
        if tensor.size(d) == 1:
            continue
        if tensor.stride(d) < extent:
            return True
        extent = tensor.stride(d) * (tensor.size(d) - 1) + extent
    return False


def _inverse(order):
    inverse = [0] * len(order)
    for position, d in enumerate(order):
        inverse[d] = position
    return inverse


def compact(tensor):
    """The view of ``tensor`` to store, and the Layout that restore() needs."""
    base, expanded = _narrow_expanded(tensor)
    layout = Layout(expanded_to=tensor.shape if expanded else None)
    if base.is_contiguous():
        return base, layout
    order = _memory_order(base)
    if order is not None:
        layout.inverse = _inverse(order)
        return base.permute(order), layout
    if not _overlaps(base):
        layout.size, layout.stride = base.shape, base.stride()
    return base, layout


# Note [The spill's own operations are not the layer's]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A restore runs inside torch's recomputation, under whatever Python dispatch mode the caller's
# context_fn installed: a selective-checkpoint policy counts the layer's operations in the
# forward and looks each up again in the recomputation, and the restore's own allocation (an
# aten::empty the forward never ran), or the permute and expand that rebuild the layout, made it
# fail ("encountered during backward but not found in storage"). Storing, restoring and
# rebuilding are the spill's bookkeeping, not the layer's work: Job.store and Job.restore
# (job.py) run them with the modes set aside, as torch itself does for its own
# bookkeeping, so no mode sees them, in forward or in recomputation. In Python, not in the C++
# binding: one place for the stash's calls and the views around them, and no dispatch-key API of
# torch's C++ ABI.
#
# Most calls find no mode to set aside, and torch's context costs 4-5 us (imports, lists, a
# generator) three times per layer; so when torch's counters of pushed modes read zero the
# context is a shared no-op. A torch without the counters takes the full context every time.
def outside_dispatch_modes():
    """A context in which no Python dispatch mode sees the operations run (torch's own
    _disable_current_modes; a no-op where none is active or a torch lacks it)."""
    if _no_dispatch_modes():
        return _NOTHING_TO_SET_ASIDE
    try:
        from torch.utils._python_dispatch import _disable_current_modes
    except ImportError:
        return _NOTHING_TO_SET_ASIDE
    return _disable_current_modes()


_NOTHING_TO_SET_ASIDE = contextlib.nullcontext()


def _no_dispatch_modes():
    """Whether no dispatch mode is pushed, Python-key or pre-dispatch (False when unknown)."""
    try:
        return (torch._C._len_torch_dispatch_stack() == 0
                and torch._ops._len_torch_dispatch_stack_pre_dispatch() == 0)
    except AttributeError:
        return False


def restore(restored, layout):
    """The stash's contiguous ``restored`` tensor with the layout compact() recorded."""
    if layout.inverse is not None:
        restored = restored.permute(layout.inverse)
    elif layout.size is not None:
        strided = torch.empty_strided(layout.size, layout.stride, dtype=restored.dtype,
                                      device=restored.device)
        restored = strided.copy_(restored)
    if layout.expanded_to is not None:
        restored = restored.expand(layout.expanded_to)
    return restored


__all__ = ["Layout", "compact", "outside_dispatch_modes", "restore"]
