"""The non-reentrant spilling checkpoint, spillarena.checkpoint's default: torch's own
non-reentrant checkpoint, with the layer input in the stash instead of in torch's frame.

    outputs = run(job, tensors, options)   # torch.utils.checkpoint.checkpoint(use_reentrant=False)
    loss.backward()                        # torch recomputes; the input comes back from the stash

See Note [A non-reentrant checkpoint that spills].
"""

import torch.utils.checkpoint as _torch_checkpoint

# Note [A non-reentrant checkpoint that spills]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The reentrant form (an autograd.Function per layer, recomputing and backpropagating inside its
# own backward) sums the gradient of a tensor that several layers take (an encoder's output in
# every cross-attention, T5's shared position bias) in another order than no checkpointing, and
# torch.autograd.grad cannot see through it. This form is torch.utils.checkpoint.checkpoint with
# use_reentrant=False itself — its public function, called with the caller's early_stop,
# context_fn, determinism_check and debug — so everything its contract promises holds by
# construction: the layer's own graph and gradient order, torch.autograd.grad and backward
# inside the layer and around it, nested checkpoints, early stop (set_checkpoint_early_stop
# honoured), retain_graph, the RNG and autocast replay, its errors. spillarena changes one thing:
# what torch's frame keeps of the layer input. Torch is handed a _SpilledInput in its place (and
# an empty tensor of the input's device and dtype, so its RNG replay finds the device); the
# input's bytes go to the stash before the call. In the forward the layer gets the live input,
# so the graph's edges reach it; the handle then lets it go, and the stash holds the only copy.
# In a recomputation the layer gets the stash's copy, restored at the first one, as a new leaf
# that requires grad as the input did (torch hands the recomputation the input itself; the
# gradients are the same, as the recomputation's graph only rebuilds the saved tensors).
#
# The restored input is kept by the handle for further recomputations (retain_graph=True, a
# torch.autograd.grad that left some saved tensors unused): the stash frees its region at the
# first restore. The handle lives as long as torch's frame, which lives as long as a saved tensor
# of the layer does: with retain_graph=False the engine releases each node's saved tensors after
# running it, so the input goes with the layer's last node. LibTorch offers no equivalent
# without Python (its saved-tensor hooks are Python objects), so spill::checkpoint in C++ stays
# reentrant.


class _SpilledInput:
    """Torch's stand-in for the layer input: the live input during the forward, the stash's
    copy in recomputations."""

    def __init__(self, job, live):
        self.job = job
        self.live = live
        self.restored = None

    def restored_input(self):
        if self.restored is None:
            self.restored = self.job.restore()
        return self.restored


def _call(job, spilled, *tensors):
    if spilled.live is not None:  # the forward
        tensors = list(tensors)
        tensors[job.spill_index] = spilled.live
        return job.run(tensors)
    return job.rerun(job.with_input(tensors, spilled.restored_input()))


def run(job, tensors, options):
    """Runs the layer through torch's non-reentrant checkpoint with ``options`` (its keyword
    arguments); its input goes to the stash."""
    x = tensors[job.spill_index]
    spilled = _SpilledInput(job, x)
    stand_ins = list(tensors)
    stand_ins[job.spill_index] = x.new_empty(0)  # the device and dtype, no bytes

    def through_torch():
        try:
            return _torch_checkpoint.checkpoint(
                _call, job, spilled, *stand_ins, use_reentrant=False,
                preserve_rng_state=job.preserve_rng_state, **options)
        finally:
            spilled.live = None

    return job.first_run(tensors, through_torch)
