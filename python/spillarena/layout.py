"""A layer input's layout, kept across the spill: what restore() gives back has the strides the
forward saw.

    stored, layout = compact(x)         # x.expand(...), x.t(), channels_last, ...: a view of x
    stashed = stash.store(stored)       # fewer bytes when x was expanded
    x_again = restore(stashed.restore(), layout)   # x's shape and strides, x's values

See Note [A restored input keeps its layout].
"""

# Note [A restored input keeps its layout]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The stash stores a tensor's values and gives back a contiguous tensor. Autograd sees more than
# values: an expanded input (stride 0, as learned query tokens q.expand(batch, -1, -1) in
# Q-Former-style models) makes matmul fold the batch into one GEMM and save a [8, 8] tensor,
# where the dense restored input made it save [24, 8]; the non-reentrant form then found the
# recomputation saving other tensors than the forward and raised. Torch's checkpoint keeps the
# input itself, so it never meets this. So what goes to the stash is the smallest view that
# holds every value: each expanded dimension narrowed to one element (fewer bytes spilled, too),
# then the dimensions permuted into memory order when that makes it contiguous (a transposed or
# channels-last input: no copy). Restoring undoes both — the inverse permutation, then the
# expansion — so the layer sees the forward's shape and strides. A view with gaps or overlaps
# other than stride 0 (x[:, ::2]) is stored as the stash always did, dense; only its strides
# differ on the way back. The storage offset is never kept: no saved tensor's shape depends on it.


class Layout:
    """How to turn the stored (contiguous) tensor back into the input's shape and strides."""

    __slots__ = ("expanded_to", "inverse")

    def __init__(self, inverse, expanded_to):
        self.inverse = inverse  # a permutation, or None
        self.expanded_to = expanded_to  # the input's size when a dimension was expanded, or None


def _narrow_expanded(tensor):
    expanded = [d for d in range(tensor.dim()) if tensor.stride(d) == 0 and tensor.size(d) > 1]
    for d in expanded:
        tensor = tensor.narrow(d, 0, 1)
    return tensor, bool(expanded)


def _memory_order(tensor):
    """The permutation that makes ``tensor`` contiguous without a copy, or None."""
    if tensor.is_contiguous():
        return None
    order = sorted(range(tensor.dim()), key=lambda d: (-tensor.stride(d), d))
    return order if tensor.permute(order).is_contiguous() else None


def compact(tensor):
    """The view of ``tensor`` to store, and the Layout that restore() needs."""
    base, expanded = _narrow_expanded(tensor)
    order = _memory_order(base)
    stored = base.permute(order) if order is not None else base
    inverse = None
    if order is not None:
        inverse = [0] * len(order)
        for position, d in enumerate(order):
            inverse[d] = position
    return stored, Layout(inverse, tensor.shape if expanded else None)


def restore(restored, layout):
    """The stash's contiguous ``restored`` tensor with the layout compact() recorded."""
    if layout.inverse is not None:
        restored = restored.permute(layout.inverse)
    if layout.expanded_to is not None:
        restored = restored.expand(layout.expanded_to)
    return restored


__all__ = ["Layout", "compact", "restore"]
