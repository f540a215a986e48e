"""The per-file stash: one torch.save file per tensor, the baseline spillarena replaces. The
files are C++ (src/core/stash/per_file.h), removed when restored or dropped::

    stash = spillarena.make_per_file_stash("/mnt/nvme")
    held = stash.store(x)                             # x.cpu() saved to a file of its own
    y = held.restore()                                # loaded, moved back to x's device; once
"""

import io

import torch

from . import _C
from .errors import CheckpointError
from .stash import ALREADY_RESTORED, StashedTensor, TensorStash
from .storable import check_storable


def make_per_file_stash(directory) -> TensorStash:
    """One torch.save file per tensor (str, bytes or os.PathLike directory): the baseline
    spillarena replaces."""
    return _PerFileStash(directory)


class _PerFileStash(TensorStash):
    name = "per_file"
    spills = True

    def __init__(self, directory):
        self._files = _C._per_file_files(directory)

    def store(self, tensor, *, what="layer input"):
        check_storable(tensor, self.name)
        buffer = io.BytesIO()
        torch.save(tensor.detach().cpu(), buffer)
        file = _C._per_file_store(self._files, buffer.getvalue())
        return _PerFileStashed(file, tensor.device)


class _PerFileStashed(StashedTensor):
    def __init__(self, file, device):
        self._file, self._device = file, device

    def restore(self):
        if self.restored or self._file is None:
            raise CheckpointError(ALREADY_RESTORED)
        self.restored = True
        data = _C._per_file_restore(self._file)
        t = torch.load(io.BytesIO(data), weights_only=True)
        return t if self._device.type == "cpu" else t.to(self._device)

    def free(self):
        self._file = None  # the C++ file removes itself unrestored
