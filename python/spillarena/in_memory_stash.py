"""The in-memory stash: a reference to the input, classic gradient checkpointing, nothing
spilled::

    stash = spillarena.make_in_memory_stash()
    held = stash.store(x)                             # x.detach(), kept as it is
    y = held.restore()                                # that tensor; once
"""

from .errors import CheckpointError
from .stash import ALREADY_RESTORED, StashedTensor, TensorStash


def make_in_memory_stash() -> TensorStash:
    """Keeps a reference to the input: classic gradient checkpointing, nothing spilled."""
    return _InMemoryStash()


class _InMemoryStash(TensorStash):
    name = "recompute"

    def store(self, tensor, *, what="layer input"):
        return _InMemoryStashed(tensor.detach())


class _InMemoryStashed(StashedTensor):
    def __init__(self, tensor):
        self._tensor = tensor

    def restore(self):
        if self.restored or self._tensor is None:
            raise CheckpointError(ALREADY_RESTORED)
        tensor, self._tensor, self.restored = self._tensor, None, True
        return tensor

    def free(self):
        self._tensor = None
