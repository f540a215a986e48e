"""One table of checkpoint cases, run against both Python forms over the same stash.

"python" is spillarena.checkpoint (transformers' calling convention) in its default,
non-reentrant form; "python-reentrant" the same with use_reentrant=True. Both replay the
forward's RNG and autocast state (the default form with torch's code, the reentrant one with
python/spillarena/forward_state.py: Note [The forward's state, replayed in Python]), so every
case expects the same of both, a second backward included (Note [A second backward through the
reentrant form] in python/spillarena/reentrant.py). The C++ front end, spill::checkpoint, runs
the same cases in tests/checkpoint_test.cc: the extension links no torch, so it cannot run a C++
autograd node on a Python layer (Note [One wheel for every torch] in python/CMakeLists.txt). What
only the Python front end has (tensors inside a functools.partial or in kwargs, pytrees of
outputs, preserve_rng_state=False, torch's own keyword arguments) is in test_checkpoint.py.
"""

import time

import pytest
import torch

import spillarena
from conftest import assert_drained


def python_front_end(stash, layer, *tensors):
    return spillarena.checkpoint(layer, *tensors, arena=stash)


def python_reentrant_front_end(stash, layer, *tensors):
    return spillarena.checkpoint(layer, *tensors, arena=stash, use_reentrant=True)


class Form:
    def __init__(self, front_end, stash, reentrant):
        self.front_end, self.stash, self.reentrant = front_end, stash, reentrant

    def __call__(self, layer, *tensors):
        return self.front_end(self.stash, layer, *tensors)


@pytest.fixture(params=[(python_front_end, False), (python_reentrant_front_end, True)],
                ids=["python", "python-reentrant"])
def checkpoint(request, arena):
    """checkpoint(layer, *tensors) through one form and the arena's shared stash."""
    front_end, reentrant = request.param
    return Form(front_end, spillarena.stash.shared_arena_stash(arena), reentrant)


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


def assert_bitwise(got, expected):
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


def test_dropout_layers_give_the_gradients_of_no_checkpointing(checkpoint, arena):
    stack = encoder_stack()
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(1))

    def run(checkpointed):
        stack.zero_grad(set_to_none=True)
        torch.manual_seed(2)
        h = x.clone().requires_grad_(True)
        out = h
        for layer in stack:
            out = checkpoint(layer, out) if checkpointed else layer(out)
        out.pow(2).mean().backward()
        return grads_of(stack, h)

    assert_bitwise(run(True), run(False))
    assert_drained(arena)


def test_extra_tensors_and_several_outputs_get_their_gradients(checkpoint, arena):
    torch.manual_seed(0)
    linear = torch.nn.Linear(16, 16)

    def layer(h, mask):
        y = torch.nn.functional.dropout(linear(h), 0.3, training=True) * mask
        return y, y.sum(-1)

    def run(checkpointed):
        linear.zero_grad(set_to_none=True)
        torch.manual_seed(5)
        h = torch.randn(4, 16, requires_grad=True)
        mask = torch.rand(4, 16, requires_grad=True)
        y, s = checkpoint(layer, h, mask) if checkpointed else layer(h, mask)
        (y.pow(2).sum() + s.sum()).backward()
        return grads_of(linear, h, mask)

    assert_bitwise(run(True), run(False))
    assert_drained(arena)


def test_the_autocast_state_is_replayed_in_the_recomputation(checkpoint, arena):
    stack = encoder_stack(layers=2)
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(3))

    def run(checkpointed):
        stack.zero_grad(set_to_none=True)
        torch.manual_seed(4)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = x
            for layer in stack:
                h = checkpoint(layer, h) if checkpointed else layer(h)
            loss = h.float().pow(2).mean()
        loss.backward()  # outside autocast, as training loops do
        return [loss.detach()] + grads_of(stack)

    assert_bitwise(run(True), run(False))
    assert_drained(arena)


def test_the_rng_stream_after_backward_is_the_one_without_checkpointing(checkpoint, arena):
    layer = torch.nn.Dropout(0.5)

    def run(checkpointed):
        torch.manual_seed(11)
        x = torch.randn(64, requires_grad=True)
        y = checkpoint(layer, x) if checkpointed else layer(x)
        y.sum().backward()
        return torch.rand(4)

    assert torch.equal(run(True), run(False))


def test_a_frozen_input_still_trains_the_layer(checkpoint, arena):
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 8)
    x = torch.randn(2, 8)  # requires no grad: the anchor keeps the node in the graph
    checkpoint(linear, x).sum().backward()
    got = linear.weight.grad.clone()
    linear.zero_grad(set_to_none=True)
    linear(x).sum().backward()
    assert torch.equal(got, linear.weight.grad)
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
    y = torch.tanh(checkpoint(linear, x)).sum()
    y.backward(retain_graph=True)
    y.backward()  # from the input the frame kept: the gradients of no checkpointing, twice
    got = (x.grad.clone(), linear.weight.grad.clone())
    x.grad, linear.weight.grad, linear.bias.grad = None, None, None
    plain = torch.tanh(linear(x)).sum()
    plain.backward(retain_graph=True)
    plain.backward()
    assert torch.equal(got[0], x.grad) and torch.equal(got[1], linear.weight.grad)
    del y
    assert_drained(arena)
