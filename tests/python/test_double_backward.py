"""Double backward (create_graph=True) through a checkpointed layer: the default form computes the
gradients of gradients of torch's own non-reentrant checkpoint (and of no checkpointing where
torch's own does: conftest.assert_as_torch), with dropout on and the input spilled; the reentrant
form refuses with a typed error, not a wrong number."""

import functools

import pytest
import torch

import spillarena
from conftest import assert_as_torch


def _layer():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Dropout(0.2),
                               torch.nn.Linear(32, 16))


def _grad_of_grad(layer, checkpoint):
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
    torch.manual_seed(2)  # the dropout mask: replayed by the checkpoint
    h = checkpoint(layer, x) if checkpoint else layer(x)
    (g,) = torch.autograd.grad(h.pow(2).sum(), x, create_graph=True)
    g.pow(2).sum().backward()
    return g.detach(), x.grad, [p.grad.clone() for p in layer.parameters()]


def test_the_default_form_computes_double_backward_as_torchs_checkpoint(spill_dir):
    arena = spillarena.SpillArena(1 << 20, spill_dir, keep_last=0)
    ours = _grad_of_grad(_layer(), lambda f, x: spillarena.checkpoint(f, x, arena=arena))
    torchs = _grad_of_grad(_layer(), functools.partial(torch.utils.checkpoint.checkpoint,
                                                       use_reentrant=False))
    assert_as_torch(ours, torchs, _grad_of_grad(_layer(), None))
    assert arena.stash_stats()["inputs_spilled"] == 1  # the input did go to the file


def test_the_reentrant_form_refuses_double_backward(spill_dir):
    arena = spillarena.SpillArena(1 << 20, spill_dir)
    with pytest.raises(spillarena.errors.CheckpointError):
        _grad_of_grad(_layer(), lambda f, x: spillarena.checkpoint(f, x, arena=arena,
                                                                   use_reentrant=True))
