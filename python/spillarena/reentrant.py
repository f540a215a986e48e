"""The reentrant spilling checkpoint, spillarena.checkpoint(use_reentrant=True): one autograd
Function per layer that runs the layer without grad in forward and recomputes and
backpropagates it inside its own backward, as torch's reentrant checkpoint does.

    outputs = run(job, tensors)   # job: a job.Job with its stash and spilled input chosen
    loss.backward()               # the input comes back from the stash, the layer is rerun

``loss.backward()`` only: torch.autograd.grad cannot see through the Function (Note [A
non-reentrant checkpoint that spills] in non_reentrant.py).
"""

import weakref

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from .errors import CheckpointError

# Stands for a tensor in the output template (a layer may return None itself).
_TENSOR = object()


def run(job, tensors):
    """Runs the layer through _SpillCheckpoint; returns its outputs as the layer built them."""
    # `anchor` is an empty tensor that requires grad, so the node joins the graph even when no
    # tensor argument does (frozen embeddings under PEFT/LoRA): the layer's parameters still
    # need their gradients. The C++ spill::checkpoint does the same.
    anchor = torch.empty(0, requires_grad=True)
    outputs = _Outputs()
    out_tensors = iter(_SpillCheckpoint.apply(job, outputs, anchor, *tensors))
    leaves = [next(out_tensors) if leaf is _TENSOR else leaf for leaf in outputs.template]
    return tree_unflatten(leaves, outputs.spec)


class _Outputs:
    """How forward's outputs nest (what the Function returns flat)."""

    spec = None
    template = None


# Note [A second backward through the reentrant form]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Torch's reentrant checkpoint runs a second backward (retain_graph=True) by recomputing from
# the inputs it saved. Here the stash frees the input's region at the first restore, so the
# restored input must outlive the first backward exactly when the graph is retained, and a
# Function's backward is not told whether it is. The engine says it another way: without
# retain_graph it releases a node's saved tensors once the node ran. So forward saves, beside
# the others, a sentinel tensor nothing else refers to, and the first backward keeps the
# restored input until the sentinel dies (weakref.finalize): at once after this backward in
# the common case, with the graph under retain_graph. Where saved-tensor hooks repack the
# sentinel (an outer non-reentrant checkpoint, save_on_cpu), it may die early; a second
# backward then raises CheckpointError, as it did before.
class _KeptInput:
    """The layer input of a backward: restored at the first one, kept while a sentinel lives."""

    def __init__(self, job):
        self.job = job
        self.tensor = None

    def get(self, sentinel):
        if self.tensor is None:
            self.tensor = self.job.restore()  # a second backward after release: CheckpointError
            weakref.finalize(sentinel, self.forget)
        return self.tensor

    def forget(self):
        self.tensor = None


class _SpillCheckpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, job, outputs, anchor, *tensors):
        job.capture_state(tensors)
        ctx.job, ctx.kept = job, _KeptInput(job)
        ctx.needs_grad = [t.requires_grad for t in tensors]
        # autograd.Function.forward runs without grad
        leaves, outputs.spec = tree_flatten(job.first_run(tensors, lambda: job.run(tensors)))
        outputs.template = [_TENSOR if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
        out_tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        if not out_tensors:
            # torch's reentrant checkpoint returns what such a layer returned (None, a count):
            # no gradient can flow back through it, so nothing is kept for a backward
            job.free()
            return ()
        # The last saved tensor is a sentinel nothing else refers to:
        # Note [A second backward through the reentrant form]
        ctx.save_for_backward(*[None if i == job.spill_index else t for i, t in enumerate(tensors)],
                              anchor.new_empty(0))
        return tuple(out_tensors)

    @staticmethod
    def backward(ctx, *grads):
        job = ctx.job
        if not torch.autograd._is_checkpoint_valid():
            raise CheckpointError(
                "spillarena.checkpoint is not compatible with torch.autograd.grad() or with "
                "backward(inputs=...): use loss.backward()"
            )
        *saved, sentinel = ctx.saved_tensors
        inputs = job.with_input(saved, ctx.kept.get(sentinel))
        del sentinel, saved
        inputs = [t.detach().requires_grad_(need) for t, need in zip(inputs, ctx.needs_grad)]
        with job.replay(), torch.enable_grad():
            outputs = job.rerun(inputs)
        out_tensors = [leaf for leaf in tree_flatten(outputs)[0] if isinstance(leaf, torch.Tensor)]
        del outputs
        pairs = _with_grads(out_tensors, grads, any(ctx.needs_grad))
        del out_tensors
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        del pairs
        input_grads = tuple(t.grad if need else None for t, need in zip(inputs, ctx.needs_grad))
        return (None, None, None) + input_grads


def _with_grads(out_tensors, grads, any_input_needs_grad):
    """The recomputed outputs paired with their incoming gradients, those that carry one."""
    if len(out_tensors) != len(grads):
        raise CheckpointError(
            f"spillarena.checkpoint: the recomputed layer returned {len(out_tensors)} tensors, "
            f"forward returned {len(grads)}; a checkpointed layer must be deterministic in "
            "what it returns"
        )
    if not any(o.requires_grad for o in out_tensors) and any_input_needs_grad:
        # torch's reentrant form's words (its node exists only when an input needs grad): the
        # anchor must not hide what a user would see
        raise CheckpointError("none of output has requires_grad=True, this checkpoint() is not "
                              "necessary")
    return [(o, g) for o, g in zip(out_tensors, grads) if o.requires_grad and g is not None]
