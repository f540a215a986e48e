"""The one check of an integer argument on the Python side (the extension's own options go
through python/src/binding.h, Note [One numeric conversion for every option])::

    count = integer(layers)          # 4 for 4, np.int64(4), torch.tensor(4); None for 4.0, True
    if count is None or count < 1:
        raise InvalidArgumentError(f"... must be an integer >= 1, got {layers!r}")
"""

import operator

from .errors import InvalidArgumentError

_MAX_MIN_BYTES = 1 << 62


def integer(value):
    """``value`` as an int where operator.index takes it (an int, a numpy integer, an integer
    0-dim tensor), never a bool (numpy's and torch's neither); None for anything else. Only
    TypeError, ValueError and OverflowError mean "not an integer": a KeyboardInterrupt or
    MemoryError raised by its __index__ propagates as itself (Note [Only a bad argument becomes
    another error] in python/src/py.h)."""
    try:
        if isinstance(value, bool) or _no_integer_scalar(value):
            return None
        return operator.index(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _no_integer_scalar(value):
    """numpy's and torch's booleans (0 and 1 to operator.index too) and arrays of one element
    (torch.tensor([[3]])): none is an integer here, as none is in the extension's options."""
    if getattr(value, "ndim", 0) != 0:
        return True
    return str(getattr(value, "dtype", "")) in ("bool", "torch.bool")


def min_bytes(value, who):
    """``value`` as a byte threshold, 0 to 2**62; InvalidArgumentError naming ``who`` else."""
    count = integer(value)
    if count is None or not 0 <= count <= _MAX_MIN_BYTES:
        raise InvalidArgumentError(
            f"{who}: min_bytes must be an integer from 0 to 2**62, got {value!r}; tensors "
            "smaller than it stay in memory")
    return count
