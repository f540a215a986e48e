"""spillarena.checkpoint_sequential: torch.utils.checkpoint.checkpoint_sequential whose segment
inputs are spilled.

    out = spillarena.checkpoint_sequential(model, 4, x)   # model: nn.Sequential or a list
    out.sum().backward()

The functions are cut into ``segments`` runs of equal length (the last takes the remainder, as
torch's does); every segment but the last goes through spillarena.checkpoint, so its input is
spilled, and the last runs plainly, its activations kept for backward.
"""

import torch

from .checkpoint import checkpoint
from .errors import InvalidArgumentError


def _run(functions, start, end):
    def forward(x):
        for function in functions[start:end]:
            x = function(x)
        return x
    return forward


def checkpoint_sequential(functions, segments, input, use_reentrant=None, *, arena=None,
                          **kwargs):
    """torch.utils.checkpoint.checkpoint_sequential, each checkpointed segment's input spilled to
    ``arena`` (as spillarena.checkpoint takes it). ``kwargs`` go to spillarena.checkpoint
    (preserve_rng_state, early_stop, ...). Raises InvalidArgumentError for a ``segments`` that is
    not an integer from 1 to the number of functions."""
    if isinstance(functions, torch.nn.Sequential):
        functions = list(functions.children())
    functions = list(functions)
    if (isinstance(segments, bool) or not isinstance(segments, int)
            or not 1 <= segments <= max(1, len(functions))):
        raise InvalidArgumentError(
            f"spillarena.checkpoint_sequential: segments must be an integer from 1 to the "
            f"{len(functions)} functions given, got {segments!r}")
    size = len(functions) // segments
    start = 0
    for _ in range(segments - 1):
        input = checkpoint(_run(functions, start, start + size), input, arena=arena,
                           use_reentrant=use_reentrant, **kwargs)
        start += size
    return _run(functions, start, len(functions))(input)


__all__ = ["checkpoint_sequential"]
