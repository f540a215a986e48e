"""One table of checkpoint cases, run against both Python forms over the same stash.

"python" is spillarena.checkpoint (transformers' calling convention) in its default,
non-reentrant form; "python-reentrant" the same with use_reentrant=True. Both replay the
forward's RNG and autocast state (the default form with torch's code, the reentrant one with
python/spillarena/forward_state.py: Note [The forward's state, replayed in Python]), so every
case expects the same of both, a second backward included (Note [A second backward through the
reentrant form] in python/spillarena/reentrant.py): the floats of torch's own checkpoint of the
same form, and of no checkpointing where torch's own has them in the same run
(conftest.assert_as_torch). The C++ front end, spill::checkpoint, runs
the same cases in tests/checkpoint_test.cc: the extension links no torch, so it cannot run a C++
autograd node on a Python layer (Note [One wheel for every torch] in python/CMakeLists.txt). What
only the Python front end has (tensors inside a functools.partial or in kwargs, pytrees of
outputs, preserve_rng_state=False, torch's own keyword arguments) is in test_checkpoint.py.
"""

import functools
import time

import pytest
import torch

import spillarena
from conftest import assert_as_torch, assert_drained


def python_front_end(stash, layer, *tensors):
    return spillarena.checkpoint(layer, *tensors, arena=stash)


def python_reentrant_front_end(stash, layer, *tensors):
    return spillarena.checkpoint(layer, *tensors, arena=stash, use_reentrant=True)


class Form:
    """One of ours; ``torchs`` is torch's own checkpoint of the same form, the floats to match."""

    def __init__(self, front_end, stash, reentrant):
        self.front_end, self.stash, self.reentrant = front_end, stash, reentrant
        self.torchs = functools.partial(torch.utils.checkpoint.checkpoint,
                                        use_reentrant=reentrant)

    def __call__(self, layer, *tensors):
        return self.front_end(self.stash, layer, *tensors)


@pytest.fixture(params=[(python_front_end, False), (python_reentrant_front_end, True)],
                ids=["python", "python-reentrant"])
def checkpoint(request, arena):
    """checkpoint(layer, *tensors) through one form and the arena's shared stash."""
    front_end, reentrant = request.param
    return Form(front_end, spillarena.arena_stash.shared_arena_stash(arena), reentrant)


def encoder_stack(layers=3, width=32):
    torch.manual_seed(0)
    return torch.nn.ModuleList(
        torch.nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=64, dropout=0.2,
                                         batch_first=True)
        for _ in range(layers)
    ).train()


def grads_of(*modules_or_tensors):
    grads = []
    for m in modules_or_tensors:
        params = m.parameters() if isinstance(m, torch.nn.Module) else [m]
        grads += [p.grad.clone() for p in params]
    return grads


def assert_as_torchs_form(run, checkpoint, an_input_needs_grad=True):
    """``run(checkpoint_or_None)``: ours, torch's own of the same form, no checkpointing. Where no
    layer input needs grad, torch's reentrant form gives the layers no gradient (it warns) and
    its non-reentrant form stands in: ours must train them as that one does."""
    same_form = an_input_needs_grad or not checkpoint.reentrant
    torchs = checkpoint.torchs if same_form else functools.partial(
        torch.utils.checkpoint.checkpoint, use_reentrant=False)
    assert_as_torch(run(checkpoint), run(torchs), run(None), same_form=same_form)


def test_dropout_layers_give_the_gradients_of_torchs_checkpoint(checkpoint, arena):
    stack = encoder_stack()
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(1))

    def run(ck):
        stack.zero_grad(set_to_none=True)
        torch.manual_seed(2)
        h = x.clone().requires_grad_(True)
        out = h
        for layer in stack:
            out = ck(layer, out) if ck else layer(out)
        out.pow(2).mean().backward()
        return grads_of(stack, h)

    assert_as_torchs_form(run, checkpoint)
    assert_drained(arena)


def test_extra_tensors_and_several_outputs_get_their_gradients(checkpoint, arena):
    torch.manual_seed(0)
    linear = torch.nn.Linear(16, 16)

    def layer(h, mask):
        y = torch.nn.functional.dropout(linear(h), 0.3, training=True) * mask
        return y, y.sum(-1)

    def run(ck):
        linear.zero_grad(set_to_none=True)
        torch.manual_seed(5)
        h = torch.randn(4, 16, requires_grad=True)
        mask = torch.rand(4, 16, requires_grad=True)
        y, s = ck(layer, h, mask) if ck else layer(h, mask)
        (y.pow(2).sum() + s.sum()).backward()
        return grads_of(linear, h, mask)

    assert_as_torchs_form(run, checkpoint)
    assert_drained(arena)


def test_the_autocast_state_is_replayed_in_the_recomputation(checkpoint, arena):
    stack = encoder_stack(layers=2)
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(3))

    def run(ck):
        stack.zero_grad(set_to_none=True)
        torch.manual_seed(4)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = x
            for layer in stack:
                h = ck(layer, h) if ck else layer(h)
            loss = h.float().pow(2).mean()
        loss.backward()  # outside autocast, as training loops do
        return [loss.detach()] + grads_of(stack)

    assert_as_torchs_form(run, checkpoint, an_input_needs_grad=False)  # x needs none
    assert_drained(arena)


def test_the_rng_stream_after_backward_is_torchs_checkpoints(checkpoint, arena):
    layer = torch.nn.Dropout(0.5)

    def run(ck):
        torch.manual_seed(11)
        x = torch.randn(64, requires_grad=True)
        y = ck(layer, x) if ck else layer(x)
        y.sum().backward()
        return torch.rand(4)

    assert_as_torchs_form(run, checkpoint)


def test_a_frozen_input_still_trains_the_layer(checkpoint, arena):
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 8)
    x = torch.randn(2, 8)  # requires no grad: the anchor keeps the node in the graph

    def run(ck):
        linear.zero_grad(set_to_none=True)
        (ck(linear, x) if ck else linear(x)).sum().backward()
        return linear.weight.grad, linear.bias.grad

    assert_as_torchs_form(run, checkpoint, an_input_needs_grad=False)
    assert_drained(arena)


def test_without_grad_nothing_is_stored(checkpoint, arena):
    linear = torch.nn.Linear(8, 8)
    with torch.no_grad():
        y = checkpoint(linear, torch.randn(2, 8))
    assert not y.requires_grad
    assert arena.stats()["allocations"] == 0


def test_a_forward_without_backward_frees_its_region(checkpoint, arena):
    linear = torch.nn.Linear(8, 8)
    y = checkpoint(linear, torch.randn(2, 8, requires_grad=True))
    assert arena.stats()["live_regions"] == 1
    del y  # the graph dies without backward
    # An input whose write is still in flight is freed when the write completes, on the stash's
    # progress thread: wait for it, a bounded while.
    deadline = time.monotonic() + 10
    while arena.stats()["live_regions"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert_drained(arena)


def test_a_second_backward_recomputes(checkpoint, arena):
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 8)
    x = torch.randn(2, 8, requires_grad=True)

    def run(ck):
        x.grad, linear.weight.grad, linear.bias.grad = None, None, None
        y = torch.tanh(ck(linear, x) if ck else linear(x)).sum()
        y.backward(retain_graph=True)
        y.backward()  # from the input the frame kept: the first backward's gradients, twice
        return x.grad, linear.weight.grad, linear.bias.grad

    assert_as_torchs_form(run, checkpoint)
    assert_drained(arena)
