"""What both forms of spillarena.checkpoint share: one checkpointed call, its layer input in the
stash, and the runs of the layer around it. The forms differ only in how autograd reaches it
(reentrant.py: one autograd Function; non_reentrant.py: torch's own non-reentrant checkpoint).

    job = Job(func, leaves, spec, preserve_rng_state)  # the call, flattened (or spec None)
    job.spill_index, job.stash = 0, stash
    outputs = job.first_run(tensors, lambda: ...)      # stores the input, runs the layer once
    x = job.restore()                                   # in backward: the input, its region freed
    outputs = job.rerun(job.with_input(tensors, x))     # the recomputation
"""

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from . import forward_state as _forward_state
from . import layout as _layout
from . import malloc as _malloc
from .errors import CheckpointError

# What a restore says when the input is gone at a second backward: the words of the C++ front
# end's spill::detail::kSecondBackwardMessage (src/torch_layer/forward_state.h), so that both
# front ends say the same after their own name.
SECOND_BACKWARD_MESSAGE = (
    "backward ran twice through the same checkpointed layer; its stashed input was consumed and "
    "freed by the first backward. Run forward again for a new graph (retain_graph is not "
    "supported with spilled inputs)"
)


class Job:
    """One checkpointed call: how to rebuild the call from its tensors, the stored layer input,
    and what forward saw. Holds no tensor of the call itself (the input is in the stash, the
    others where autograd keeps them)."""

    def __init__(self, func, leaves, spec, preserve_rng_state):
        """``leaves`` and ``spec``: the call's arguments, flattened (tree_flatten); or the
        positional tensors of a call ``func(*tensors)`` and None, the common call, which then
        runs without tree_unflatten (2 us, twice per layer)."""
        self.func, self.spec = func, spec
        self.positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        self.template = [None if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
        self.stash = None
        self.spill_index = None  # among the tensors: Note [Which argument spills] (checkpoint.py)
        self.preserve_rng_state = preserve_rng_state
        self.stashed = None
        self.layout = None  # how the stored view becomes the input again (layout.py)
        self.requires_grad = False  # the input's, for the restored one
        self.state = None  # forward_state.ForwardState: RNG and autocast of forward

    @staticmethod
    def tensors_in(structure):
        return [leaf for leaf in tree_flatten(structure)[0] if isinstance(leaf, torch.Tensor)]

    def run(self, tensors):
        """The call, with ``tensors`` where its tensors were."""
        if self.spec is None:
            return self.func(*tensors)
        leaves = list(self.template)
        for position, tensor in zip(self.positions, tensors):
            leaves[position] = tensor
        prefix, args, kwargs = tree_unflatten(leaves, self.spec)
        return self.func(*prefix, *args, **kwargs)

    def first_run(self, tensors, run):
        """The forward: stores the layer input, then ``run()`` runs the layer as the form does;
        a run that raises frees the stored input. The forward's working set is given back after
        (Note [Returning freed memory from Python] in malloc.py)."""
        x = tensors[self.spill_index]
        self.requires_grad = x.requires_grad
        self.store(x)
        try:
            outputs = run()
        except BaseException:
            self.free()
            raise
        _malloc.layer_done(x.device.type)
        return outputs

    def rerun(self, tensors):
        """The recomputation on ``tensors`` (with_input's); its working set is given back after."""
        try:
            return self.run(tensors)
        finally:
            _malloc.layer_done(tensors[self.spill_index].device.type)

    def with_input(self, tensors, restored):
        """``tensors`` with the restored input in the layer input's place, as a new leaf that
        requires grad as the input did."""
        tensors = list(tensors)
        # Note [The spill's own operations are not the layer's] (layout.py)
        with _layout.outside_dispatch_modes():
            tensors[self.spill_index] = restored.detach().requires_grad_(self.requires_grad)
        return tensors

    def store(self, tensor):
        """Stores the layer input: its smallest view that holds every value (Note [A restored
        input keeps its layout] in layout.py)."""
        # Note [The spill's own operations are not the layer's] (layout.py)
        with _layout.outside_dispatch_modes():
            stored, self.layout = _layout.compact(tensor)
            self.stashed = self.stash.store(stored)

    def free(self):
        """Frees the stored input without restoring it (a forward that raised)."""
        stashed, self.stashed = self.stashed, None
        if stashed is not None:
            stashed.free()

    def restore(self):
        """The layer input, with the forward's shape and strides; the stash's copy is freed. The
        stash queues its read, then those of the layers before it, then waits for its own (Note
        [Overlapped spilling] in src/core/stash/chain.cc)."""
        if self.stashed is None:
            raise CheckpointError("spillarena.checkpoint: " + SECOND_BACKWARD_MESSAGE)
        # Note [The spill's own operations are not the layer's] (layout.py)
        with _layout.outside_dispatch_modes():
            restored = self.stashed.restore()
            stashed, self.stashed = self.stashed, None  # kept until here: a failed restore says why
            stashed.free()
            return _layout.restore(restored, self.layout)

    def capture_state(self, tensors):
        # CPU and device generators, autocast: what the C++ front end captures too
        # (Note [The forward's state, replayed in Python] in forward_state.py).
        self.state = _forward_state.capture(tensors, self.preserve_rng_state)

    def replay(self):
        """The RNG and autocast state of forward, for the recomputation; the RNG states found
        are put back afterwards, so the rest of backward draws what it would have drawn."""
        return _forward_state.replay(self.state)
