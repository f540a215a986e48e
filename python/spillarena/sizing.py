"""Sizing an arena to a model: bytes of the spilled layer inputs of one step, rounding included.

    capacity = spillarena.bytes_for_layer_inputs(32, (1, 8192, 4096), torch.bfloat16)
    arena = spillarena.SpillArena(capacity)    # exactly 32 inputs of [1, 8192, 4096] bf16 fit
"""

import torch

from . import _C


def _element_size(dtype) -> int:
    if isinstance(dtype, torch.dtype):
        return torch.empty((), dtype=dtype).element_size()
    return dtype  # an element size in bytes; _C checks it


def bytes_for_layer_inputs(layers, shape, dtype) -> int:
    """``layers`` x one ``(batch, seq, hidden)`` input of ``dtype`` (a torch.dtype or a size in
    bytes), as the arena reserves them. Raises InvalidArgumentError for a 0 or on overflow."""
    return _C._bytes_for_layer_inputs(layers, shape, _element_size(dtype))


def bytes_for_layer_input(shape, dtype) -> int:
    """One ``(batch, seq, hidden)`` input of ``dtype``, as the arena reserves it."""
    return _C._bytes_for_layer_inputs(1, shape, _element_size(dtype))
