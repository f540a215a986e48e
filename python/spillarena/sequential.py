"""spillarena.checkpoint_sequential: torch.utils.checkpoint.checkpoint_sequential whose segment
inputs are spilled.

    out = spillarena.checkpoint_sequential(model, 4, x)   # model: nn.Sequential or a list
    out.sum().backward()

The functions are cut into ``segments`` runs of equal length (the last takes the remainder, as
torch's does); every segment but the last goes through spillarena.checkpoint, so its input is
spilled, and the last runs plainly, its activations kept for backward.
"""

import torch

from . import arguments as _arguments
from .checkpoint import TORCH_ARGUMENTS, check_arena, checkpoint
from .errors import InvalidArgumentError


def _run(functions, start, end):
    def forward(x):
        for function in functions[start:end]:
            x = function(x)
        return x
    return forward


def _segment_count(segments, functions):
    count = _arguments.integer(segments)
    if count is None or not 1 <= count <= functions:
        raise InvalidArgumentError(
            f"spillarena.checkpoint_sequential: segments must be an integer from 1 to the "
            f"{functions} functions given (at least one), got {segments!r}")
    return count


def checkpoint_sequential(functions, segments, input, use_reentrant=None, *, arena=None,
                          **kwargs):
    """torch.utils.checkpoint.checkpoint_sequential, each checkpointed segment's input spilled to
    ``arena`` (as spillarena.checkpoint takes it). ``kwargs`` are torch's checkpoint options
    (preserve_rng_state, early_stop, ...). Raises InvalidArgumentError for a ``segments`` that is
    not an integer from 1 to the number of functions (at least one), another keyword, or an
    arena spillarena.checkpoint would refuse."""
    if isinstance(functions, torch.nn.Sequential):
        functions = list(functions.children())
    functions = list(functions)
    check_arena(arena)
    unknown = sorted(set(kwargs) - set(TORCH_ARGUMENTS))
    if unknown:
        raise InvalidArgumentError(
            f"spillarena.checkpoint_sequential: unexpected keyword argument(s) "
            f"{', '.join(unknown)}; it takes torch's checkpoint options "
            f"({', '.join(TORCH_ARGUMENTS)}) and arena=")
    segments = _segment_count(segments, len(functions))
    size = len(functions) // segments
    start = 0
    for _ in range(segments - 1):
        input = checkpoint(_run(functions, start, start + size), input, arena=arena,
                           use_reentrant=use_reentrant, **kwargs)
        start += size
    return _run(functions, start, len(functions))(input)


__all__ = ["checkpoint_sequential"]
