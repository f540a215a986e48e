"""spillarena.checkpoint in plain PyTorch: the contract of torch.utils.checkpoint.checkpoint.

The cases both front ends share (dropout, autocast, the RNG stream, frozen inputs, no grad, a
second backward) are in test_conformance.py; here is what only the Python front end has. Gradients
are compared with torch's own checkpoint of the same form, and with no checkpointing where torch's
own equals it (conftest.assert_as_torch)."""

import functools

import pytest
import torch

import spillarena
from conftest import assert_as_torch, assert_drained

TORCHS = functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)


def encoder_stack(layers=3, width=32):
    torch.manual_seed(0)
    return torch.nn.ModuleList(
        torch.nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=64, dropout=0.2,
                                         batch_first=True) for _ in range(layers)).train()


def grads_of(module):
    return [p.grad.clone() for p in module.parameters()]


def test_transformer_encoder_stack_in_a_plain_loop_is_bit_identical(arena):
    stack = encoder_stack()
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(1))

    def run(checkpoint):
        stack.zero_grad(set_to_none=True)
        h = x.clone().requires_grad_(True)
        start = h
        torch.manual_seed(5)
        for layer in stack:
            h = checkpoint(layer, h) if checkpoint else layer(h)
        loss = h.pow(2).mean()
        loss.backward()
        return loss.detach(), grads_of(stack), start.grad

    ours = functools.partial(spillarena.checkpoint, arena=arena, use_reentrant=False)
    assert_as_torch(run(ours), run(TORCHS), run(None))
    assert arena.stats()["allocations"] == len(stack)
    assert_drained(arena)


def test_tensors_inside_a_partial_and_in_kwargs_get_their_gradients(arena):
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 8)

    def layer(h, scale, *, bias, mask=None, tag="x"):
        assert tag == "kept"
        y = torch.nn.functional.dropout(linear(h) * scale + bias, 0.3) * mask
        return y, None, {"aux": h.sum()}

    def make_inputs():
        g = torch.Generator().manual_seed(2)
        return (torch.randn(4, 8, generator=g, requires_grad=True),
                torch.randn(8, generator=g, requires_grad=True),
                torch.randn(8, generator=g, requires_grad=True),
                (torch.rand(4, 8, generator=g) > 0.2).float())

    def run(checkpoint):
        linear.zero_grad(set_to_none=True)
        h, scale, bias, mask = make_inputs()
        fn = functools.partial(layer, bias=bias, tag="kept")
        torch.manual_seed(9)
        if checkpoint:
            out, nothing, extra = checkpoint(fn, h, scale, mask=mask)
        else:
            out, nothing, extra = fn(h, scale, mask=mask)
        assert nothing is None
        (out.sum() + extra["aux"]).backward()
        return [h.grad, scale.grad, bias.grad, linear.weight.grad, linear.bias.grad]

    got = run(functools.partial(spillarena.checkpoint, arena=arena))
    assert all(g is not None for g in got)
    assert_as_torch(got, run(TORCHS), run(None))
    assert_drained(arena)


def test_a_layer_input_passed_only_inside_the_partial_is_spilled(arena):
    linear = torch.nn.Linear(8, 8)
    h = torch.randn(4, 8, requires_grad=True)
    out = spillarena.checkpoint(functools.partial(linear.forward, input=h), arena=arena)
    assert arena.stats()["live_regions"] == 1
    out.sum().backward()
    assert h.grad is not None and linear.weight.grad is not None
    assert_drained(arena)


def test_in_memory_stash_is_plain_checkpointing():
    linear = torch.nn.Linear(8, 8)
    x = torch.randn(2, 8, requires_grad=True)
    spillarena.checkpoint(linear, x, arena=spillarena.make_in_memory_stash()).sum().backward()
    assert x.grad is not None


def test_autograd_grad_works_and_the_reentrant_form_refuses_it_clearly(arena):
    linear = torch.nn.Linear(8, 8)
    x = torch.randn(2, 8, requires_grad=True)
    y = spillarena.checkpoint(linear, x, arena=arena).sum()
    assert_as_torch(torch.autograd.grad(y, x), torch.autograd.grad(TORCHS(linear, x).sum(), x),
                    torch.autograd.grad(linear(x).sum(), x))
    y = spillarena.checkpoint(linear, x, arena=arena, use_reentrant=True).sum()
    with pytest.raises(spillarena.errors.CheckpointError, match=r"torch\.autograd\.grad"):
        torch.autograd.grad(y, x)
    del y
    assert_drained(arena)


def test_stash_round_trip_through_the_arena(arena):
    stash = spillarena.make_arena_stash(arena)
    assert stash.name == "disk"
    t = torch.randn(3, 5, 7)
    stashed = stash.store(t)
    assert arena.stats()["live_regions"] == 1
    stashed.prefetch()
    back = stashed.restore()
    assert torch.equal(back, t) and back.dtype == t.dtype and back.shape == t.shape
    with pytest.raises(spillarena.errors.CheckpointError):
        stashed.restore()
    del back, stashed
    assert_drained(arena)


@pytest.mark.parametrize("options", [
    {"io": "buffered"}, {"io": "direct", "staging_bytes": 1 << 20}, {"asynchronous": False},
    {"io_backend": "thread_pool", "prefetch_depth": 0}, {"keep_last": 2}, {"backing": "ram"},
], ids=["buffered", "direct", "synchronous", "thread_pool", "keep_last_2", "ram"])
def test_every_arena_configuration_gives_the_same_gradients(options, spill_dir):
    arena = spillarena.SpillArena(16 << 20, None if options.get("backing") == "ram" else spill_dir,
                                  **options)
    stack = encoder_stack()
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(1))

    def run(checkpoint):
        stack.zero_grad(set_to_none=True)
        torch.manual_seed(5)
        h = x
        for layer in stack:
            h = checkpoint(layer, h) if checkpoint else layer(h)
        h.pow(2).mean().backward()
        return grads_of(stack)

    assert_as_torch(run(functools.partial(spillarena.checkpoint, arena=arena)), run(TORCHS),
                    run(None))
    resolved = arena.options()
    for key, value in options.items():
        if key != "io":  # automatic/buffered/direct: resolved, may say why in io_note
            assert resolved[key] == value, key
    stats = arena.stats()
    if "io" in options and options.get("backing") != "ram":
        assert stats["io_mode"] == options["io"], stats["io_note"]
    # The last keep_last inputs (default 1) stay where they are; every layer is restored.
    assert stats["allocations"] == len(stack) - options.get("keep_last", 1)
    assert arena.stash_stats()["restores"] == len(stack)
    assert_drained(arena)


def test_preserve_rng_state_false_recomputes_with_fresh_randomness_as_torch_does(arena):
    layer = torch.nn.Dropout(0.5)

    def run(checkpoint_fn):
        torch.manual_seed(11)
        x = torch.randn(256, requires_grad=True)
        checkpoint_fn(x).sum().backward()
        return x.grad, torch.rand(4)

    ours = run(lambda x: spillarena.checkpoint(layer, x, arena=arena, preserve_rng_state=False))
    torchs = run(lambda x: torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False,
                                                             preserve_rng_state=False))
    replayed = run(lambda x: spillarena.checkpoint(layer, x, arena=arena))
    assert torch.equal(ours[0], torchs[0]) and torch.equal(ours[1], torchs[1])
    assert not torch.equal(ours[0], replayed[0])  # the recomputation drew other masks
    assert_drained(arena)


def test_a_refused_restore_is_refused_again_in_its_own_words(arena):
    # the stash protocol (src/core/stash/stored_bytes.cc) checks the version once, in the core;
    # a second call quotes the first failure instead of "already restored"
    stash = spillarena.make_arena_stash(arena)
    x = torch.randn(64)
    held = stash.store(x)
    x.add_(1)
    for _ in range(2):
        with pytest.raises(spillarena.errors.CheckpointError,
                           match="modified by an inplace operation"):
            held.restore()
    held.free()
    assert_drained(arena)
