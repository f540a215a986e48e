"""The non-reentrant spilling checkpoint, spillarena.checkpoint's default.

    outputs = run(job, tensors)   # the layer runs with grad: the real graph, nothing saved in it
    loss.backward()               # first unpack: input restored, layer recomputed, tensors served

See Note [A non-reentrant checkpoint that spills].
"""

import torch
from torch.autograd.graph import saved_tensors_hooks

from . import malloc as _malloc
from .errors import CheckpointError

# Note [A non-reentrant checkpoint that spills]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The reentrant form (an autograd.Function per layer, recomputing and backpropagating inside its
# own backward) sums the gradient of a tensor that several layers take (an encoder's output in
# every cross-attention, T5's shared position bias, a module shared by layers) in another order
# than no checkpointing: rounding-level differences, and torch.autograd.grad cannot see through
# it. This form keeps the layer's own graph, as torch.utils.checkpoint(use_reentrant=False)
# does: the layer runs with grad under saved-tensor hooks whose pack keeps only an index (and the
# shape and dtype), so the graph holds none of the layer's activations; the layer input's bytes
# go to the arena's stash. The first unpack in backward restores the input (queueing its
# predecessors' reads, as the reentrant form does), replays the forward's RNG and autocast,
# recomputes the layer under hooks that collect what it saves, and hands each saved tensor out
# once. Gradients then flow through the original graph, in its order: bit-identical to no
# checkpointing wherever torch's own non-reentrant checkpoint is.
#
# The frame lives as long as a saved tensor of the layer does: with retain_graph=False the engine
# releases each node's saved tensors after running it, so the restored input and the recomputed
# tensors go with the layer's last node; with retain_graph=True they stay, and a second backward
# (or a torch.autograd.grad that left some unused) recomputes from the input kept in the frame.
# It uses public torch API only: torch.autograd.graph.saved_tensors_hooks (stable since 1.10),
# never torch.utils.checkpoint's internals. LibTorch offers no equivalent without Python: its
# default saved-tensor hooks are Python objects (at::SavedTensorDefaultHooks holds
# c10::SafePyObject, and the C++ engine's get_default_saved_variable_hooks returns none), so
# spill::checkpoint in C++ stays reentrant.


class _Frame:
    """One checkpointed call between forward and backward: what forward saved (as indices), the
    tensors to rebuild the call, and the recomputation's saved tensors once made."""

    def __init__(self, job, tensors):
        self.job = job
        self.others = [None if i == job.spill_index else t for i, t in enumerate(tensors)]
        self.needs_grad = [t.requires_grad for t in tensors]
        self.device_type = tensors[job.spill_index].device.type
        self.saved_meta = []  # (shape, dtype) of each tensor forward saved, in order
        self.input = None  # the layer input, restored at the first unpack
        self.saved = None  # the recomputation's saved tensors; None once handed out

    def pack(self, tensor):
        self.saved_meta.append((tensor.shape, tensor.dtype))
        return len(self.saved_meta) - 1

    def unpack(self, index):
        if self.saved is None or self.saved[index] is None:
            self._recompute()
        tensor, self.saved[index] = self.saved[index], None
        return tensor

    def _restored_input(self):
        if self.input is None:
            stashed, self.job.stashed = self.job.stashed, None
            self.input = stashed.restore()  # queues the reads of the layers before it
            stashed.free()
        return self.input

    def _recompute(self):
        restored = self._restored_input()
        inputs = [
            (restored if t is None else t).detach().requires_grad_(need)
            for t, need in zip(self.others, self.needs_grad)
        ]
        saved = []

        def collect(tensor):
            saved.append(tensor.detach())
            return len(saved) - 1

        with self.job.replay(), torch.enable_grad(), saved_tensors_hooks(collect, _forbidden):
            self.job.run(inputs)
        del inputs
        self._check(saved)
        self.saved = saved
        _malloc.layer_done(self.device_type)

    def _check(self, saved):
        found = [(t.shape, t.dtype) for t in saved]
        if found == self.saved_meta:
            return
        first = next((i for i, (a, b) in enumerate(zip(found, self.saved_meta)) if a != b), None)
        where = (f"; the first that differs is #{first}: {found[first]} against "
                 f"{self.saved_meta[first]}" if first is not None else "")
        raise CheckpointError(
            f"spillarena.checkpoint: the recomputed layer saved {len(found)} tensors for "
            f"backward, its forward {len(self.saved_meta)}{where}. A checkpointed layer must do "
            "the same work when it runs again (no branches on global state or on values that "
            "change between forward and backward)"
        )


def _forbidden(index):
    raise CheckpointError(
        "spillarena.checkpoint: a tensor saved during the recomputation was unpacked; backward "
        "through a recomputed layer (create_graph=True) is not supported"
    )


def run(job, tensors):
    """Runs the layer with grad under the frame's hooks; its input goes to the stash."""
    frame = _Frame(job, tensors)
    job.capture_state(tensors)
    job.stashed = job.stash.store(tensors[job.spill_index])
    with saved_tensors_hooks(frame.pack, frame.unpack):
        outputs = job.run(tensors)
    # The forward's working set is free: give it back (Note [Returning freed memory from
    # Python] in malloc.py).
    _malloc.layer_done(frame.device_type)
    return outputs
