"""Double backward (create_graph=True) through a checkpointed layer: the default form computes the
same gradients of gradients as no checkpointing, with dropout on and the input spilled; the
reentrant form refuses with a typed error, not a wrong number."""

import pytest
import torch

import spillarena


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


def test_the_default_form_computes_double_backward_as_no_checkpointing(spill_dir):
    arena = spillarena.SpillArena(1 << 20, spill_dir, keep_last=0)
    reference = _grad_of_grad(_layer(), None)
    ours = _grad_of_grad(_layer(), lambda f, x: spillarena.checkpoint(f, x, arena=arena))
    assert torch.equal(ours[0], reference[0])
    assert torch.equal(ours[1], reference[1])
    assert all(torch.equal(a, b) for a, b in zip(ours[2], reference[2]))
    assert arena.stash_stats()["inputs_spilled"] == 1  # the input did go to the file


def test_the_reentrant_form_refuses_double_backward(spill_dir):
    arena = spillarena.SpillArena(1 << 20, spill_dir)
    with pytest.raises(spillarena.CheckpointError):
        _grad_of_grad(_layer(), lambda f, x: spillarena.checkpoint(f, x, arena=arena,
                                                                   use_reentrant=True))
