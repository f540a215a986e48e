"""spillarena.offload: every saved tensor of at least min_bytes to the arena, no recompute (Note
[Saved tensors to the arena] in python/spillarena/offload.py): torch's gradients, parameters and
small tensors kept, a view pair written once, an in-place change refused, a full disk and an
exception leaving nothing behind, and what it refuses."""

import contextlib
import gc
import importlib
import math
import threading
import warnings

import pytest
import torch

import spillarena
from conftest import assert_as_torch, assert_drained

offload_module = importlib.import_module("spillarena.offload")
checkpoint_module = importlib.import_module("spillarena.checkpoint")

WIDTH = 256  # a [8, 256] float activation: 8 KiB


def mlp(layers=4):
    torch.manual_seed(0)
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU(), torch.nn.Dropout(0.1)]
    return torch.nn.Sequential(*blocks)


def gradients(model, context=None):
    """Two steps' gradients (dropout on, a seed per step), ``context()`` around each forward."""
    steps = []
    for step in range(2):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(10 + step)
        x = torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(step))
        if context is None:
            loss = model(x).pow(2).mean()
        else:
            with context():
                loss = model(x).pow(2).mean()
        loss.backward()
        steps.append({n: p.grad.clone() for n, p in model.named_parameters()})
    return steps


def test_gradients_are_torchs_save_on_cpu_and_nothing_stays_in_the_arena(arena):
    model = mlp()
    contexts = []

    def ours():
        contexts.append(spillarena.offload(arena, min_bytes=4096))
        return contexts[-1]

    assert_as_torch(gradients(model, ours), gradients(model, torch.autograd.graph.save_on_cpu),
                    gradients(model), case="mlp")
    stats = contexts[-1].stats()
    assert stats["tensors_stored"] >= 4  # each Linear's input at least
    assert stats["kept_weights"] > 0     # ... never a weight (weight.t() is saved as it is)
    assert arena.stats()["allocations"] > 0
    stash = arena.stash_stats()  # no layer input: offload() stores saved tensors, counted apart
    stored = sum(context.stats()["tensors_stored"] for context in contexts)  # two steps
    assert stash["inputs_stored"] == 0 and stash["saved_tensors_stored"] == stored
    assert_drained(arena)


def test_a_transformers_model_trains_as_without_offload(arena):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, attention_dropout=0.1)

    def steps(context):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(cfg)
        model.config._attn_implementation = "eager"
        out = []
        for step in range(2):
            model.zero_grad(set_to_none=True)
            torch.manual_seed(10 + step)
            ids = torch.randint(4, 256, (2, 16), generator=torch.Generator().manual_seed(step))
            with context():
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            out.append({n: p.grad.clone() for n, p in model.named_parameters()
                        if p.grad is not None})
        return out

    ours = steps(lambda: spillarena.offload(arena, min_bytes=1024))
    assert_as_torch(ours, steps(torch.autograd.graph.save_on_cpu), steps(contextlib.nullcontext),
                    case="llama")
    assert_drained(arena)


def test_parameters_and_small_tensors_stay_as_torch_keeps_them(arena):
    def step(context):
        weight = torch.nn.Parameter(torch.ones(WIDTH, WIDTH))
        x = torch.linspace(-1, 1, 64 * WIDTH).reshape(64, WIDTH).requires_grad_(True)
        small = torch.linspace(0, 1, 4).requires_grad_(True)
        with context:
            y = (x @ weight.t()).sum() + (small * 3).sin().sum()
        y.backward()
        return [weight.grad, x.grad, small.grad]

    spilled = spillarena.offload(arena, min_bytes=4096)
    ours = step(spilled)
    assert_as_torch(ours, step(torch.autograd.graph.save_on_cpu()), step(contextlib.nullcontext()))
    stats = spilled.stats()
    assert stats["kept_weights"] == 1    # weight.t(): a view of a parameter
    assert stats["kept_small"] >= 1      # small * 3
    assert stats["tensors_stored"] == 1  # x alone
    assert_drained(arena)


def test_views_of_one_tensor_are_written_once_and_come_back_as_views(arena):
    a = torch.randn(128, 128, requires_grad=True)
    with spillarena.offload(arena, min_bytes=1024) as spilled:
        h = a * 2
        out = (h @ h.t()).sum()  # mm saves h and h.t(): one base
    out.backward()
    grad = a.grad.clone()
    a.grad = None
    ((a * 2) @ (a * 2).t()).sum().backward()
    assert torch.equal(grad, a.grad)
    stats = spilled.stats()
    assert stats["tensors_stored"] == 1
    assert stats["views_shared"] == 1
    assert stats["bytes_stored"] == 128 * 128 * 4
    assert_drained(arena)


@pytest.mark.parametrize("min_bytes", [0, 1 << 30], ids=["spilled", "kept"])
def test_a_saved_tensor_changed_in_place_raises_as_without_offload(arena, min_bytes):
    a = torch.randn(64, 64, requires_grad=True)
    h = a * 2
    y = h.sin().sum()
    h.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()  # torch's own error, without offload
    with spillarena.offload(arena, min_bytes=min_bytes):
        h = a * 2
        y = h.sin().sum()
    h.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
    del y, h
    gc.collect()
    assert_drained(arena)


def test_retain_graph_unpacks_the_restored_tensor_again(arena):
    a = torch.randn(64, 64, requires_grad=True)
    with spillarena.offload(arena, min_bytes=0):
        y = (a * 2).sin().sum()
    y.backward(retain_graph=True)
    first = a.grad.clone()
    y.backward()
    assert torch.equal(a.grad, 2 * first)
    del y
    assert_drained(arena)


def test_a_sparse_saved_tensor_stays_in_memory_with_one_notice(arena, monkeypatch):
    monkeypatch.setattr(checkpoint_module, "_KEPT_IN_MEMORY_NOTICED", set())
    w = torch.randn(32, 32, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with spillarena.offload(arena, min_bytes=0) as spilled:
            for _ in range(2):
                x = torch.randn(16, 32).relu().to_sparse().requires_grad_(True)
                torch.sparse.mm(x, w).sum().backward()
    assert spilled.stats()["kept_unstorable"] >= 2
    notices = [str(w.message) for w in caught if issubclass(w.category,
                                                           spillarena.SpillArenaWarning)]
    assert notices == ["spillarena.offload: a sparse_coo saved tensor stays in memory, as torch "
                       "keeps it: the arena holds dense tensors with data of their own. Pass its "
                       "to_dense() to spill it (said once per kind of tensor)"]
    assert_drained(arena)


def test_a_full_disk_mid_step_keeps_the_tensors_in_memory_and_the_step_trains(small_disk):
    # A 16 MiB file system and an arena of 2 MiB that may grow: a step stores some 64 MiB, so the
    # arena fills, its grows find the disk full, and what found no room stays in memory.
    arena = spillarena.SpillArena(2 << 20, small_disk, keep_last=0)
    model = mlp(layers=8)
    x = torch.randn(1024, WIDTH, generator=torch.Generator().manual_seed(3))

    def step(context):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(5)
        with context:
            loss = model(x).pow(2).mean()
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = step(spillarena.offload(arena, min_bytes=0))
    assert any(issubclass(w.category, spillarena.SpillArenaWarning) for w in caught)
    assert arena.stats()["allocations"] > 0         # the arena took what it had room for
    assert arena.stash_stats()["saved_tensors_stored"] > 0
    assert_as_torch(ours, step(torch.autograd.graph.save_on_cpu()), step(contextlib.nullcontext()))
    assert_drained(arena)


def test_an_exception_in_the_forward_leaves_the_arena_drained(arena):
    model = mlp()
    with pytest.raises(ValueError, match="the layer failed"):
        with spillarena.offload(arena, min_bytes=0):
            h = model[:3](torch.randn(8, WIDTH))
            raise ValueError("the layer failed")
    del h
    gc.collect()
    assert_drained(arena)
    with spillarena.offload(arena, min_bytes=0):  # usable at once
        model(torch.randn(8, WIDTH)).sum().backward()
    assert_drained(arena)


@pytest.mark.parametrize("bad", [-1, math.nan, 1 << 70, True, 1.5, "1"])
def test_min_bytes_out_of_range_is_refused(arena, bad):
    with pytest.raises(spillarena.InvalidArgumentError, match="min_bytes must be an integer"):
        spillarena.offload(arena, min_bytes=bad)


def test_a_stash_is_no_arena_for_it():
    with pytest.raises(spillarena.InvalidArgumentError, match="an AutomaticArena or None"):
        spillarena.offload(spillarena.make_in_memory_stash())


def test_entered_twice_nested_or_exited_elsewhere_is_refused_and_changes_nothing(arena):
    context = spillarena.offload(arena)
    with context:
        with pytest.raises(spillarena.InvalidArgumentError, match="entered already"):
            context.__enter__()
        with pytest.raises(spillarena.InvalidArgumentError, match="do not nest"):
            spillarena.offload(arena).__enter__()
        errors = []
        thread = threading.Thread(target=lambda: _exit_into(context, errors))
        thread.start()
        thread.join()
        assert len(errors) == 1 and "another thread" in str(errors[0])
        a = torch.randn(1024, 256, requires_grad=True)
        (a * 2).sin().sum().backward()  # the context still works
    assert context.stats()["tensors_stored"] >= 1
    with pytest.raises(spillarena.InvalidArgumentError, match="without being entered"):
        context.__exit__(None, None, None)
    assert_drained(arena)


def _exit_into(context, errors):
    try:
        context.__exit__(None, None, None)
    except spillarena.InvalidArgumentError as e:
        errors.append(e)


def _views_case(make):
    """Gradients of a layer that saves the views ``make(h)`` builds, with and without offload."""
    def step(context):
        torch.manual_seed(0)
        a = torch.randn(4, 8, 16, 16, requires_grad=True)
        w = torch.randn(16, 16, requires_grad=True)
        with context:
            out = make(a * 2, w)
        (out.real.sum() if out.is_complex() else out.sum()).backward()
        return [a.grad, w.grad]
    return step


VIEW_CASES = {
    # Meta's RoPE: a float view as complex, multiplied (saves the complex view)
    "view_as_complex": lambda h, w: (lambda c: c * c)(
        torch.view_as_complex(h.reshape(4, 8, 16, 8, 2))),
    # a conjugated view (the conj bit, not the values), saved by the product beside its base
    "conj": lambda h, w: (lambda c: c.conj() * c)(
        torch.view_as_complex(h.reshape(4, 8, 16, 8, 2))),
    # a slice with gaps of a channels_last tensor (a view of a strided base), saved by sin
    "strided_slice": lambda h, w: h.contiguous(memory_format=torch.channels_last)[..., ::2].sin(),
    # x and x.t() through one mm
    "transpose": lambda h, w: (lambda m: m @ m.t())(h.reshape(-1, 16)),
}


@pytest.mark.parametrize("case", sorted(VIEW_CASES))
def test_views_come_back_with_their_dtype_bits_and_layout(arena, case):
    step = _views_case(VIEW_CASES[case])
    ours = step(spillarena.offload(arena, min_bytes=0))
    assert_as_torch(ours, step(torch.autograd.graph.save_on_cpu()),
                    step(contextlib.nullcontext()), case=case)
    gc.collect()
    assert_drained(arena)


def test_a_small_slice_of_a_large_tensor_stores_the_slice_not_the_tensor(arena):
    big = torch.randn(1024, 1024, requires_grad=True)
    with spillarena.offload(arena, min_bytes=0) as spilled:
        h = big * 2
        y = h[:2].sin().sum()  # saves a 2-row slice of a 4 MiB tensor
    y.backward()
    assert spilled.stats()["bytes_stored"] < 64 << 10
    assert_drained(arena)


@pytest.mark.parametrize("bit", ["conj", "neg"])
def test_a_view_that_clears_its_bases_bit_is_not_rebuilt_from_the_base(arena, bit):
    # the base's bytes are not the view's values when the base carries the conj or neg bit
    def step(context):
        torch.manual_seed(0)
        x = torch.randn(64, 32, dtype=torch.complex64)
        base = (x.conj() if bit == "conj" else torch._neg_view(x)).detach().requires_grad_()
        with context:
            view = base.conj() if bit == "conj" else torch._neg_view(base)
            out = (view * view).real.sum()
        out.backward()
        return base.grad

    ours = step(spillarena.offload(arena, min_bytes=0))
    assert_as_torch(ours, step(torch.autograd.graph.save_on_cpu()),
                    step(contextlib.nullcontext()), case=bit)
    assert_drained(arena)


def test_a_tensor_changed_in_place_after_its_last_reference_is_gone_still_raises(arena):
    # h dies before backward; the stash still knew its version (Note [A version kept without the
    # bytes] in python/spillarena/version_watch.py): no silent wrong gradient
    def layer(x):
        h = x * 2
        s = h.sin()
        h.mul_(3)
        return s

    for keep_last in (0, 1, 4):
        local = spillarena.SpillArena(1 << 22, arena.directory, keep_last=keep_last)
        x = torch.randn(256, 256, requires_grad=True)
        with spillarena.offload(local, min_bytes=0):
            y = layer(x)
        with pytest.raises(RuntimeError, match="inplace operation: the stashed saved tensor of"):
            y.sum().backward()
        del y
        gc.collect()
        assert_drained(local)


def test_exiting_before_hooks_entered_after_it_is_refused_and_changes_nothing(arena):
    context = spillarena.offload(arena, min_bytes=0)
    context.__enter__()
    inner = torch.autograd.graph.save_on_cpu()
    inner.__enter__()
    with pytest.raises(spillarena.InvalidArgumentError, match="exit those first"):
        context.__exit__(None, None, None)
    inner.__exit__(None, None, None)
    context.__exit__(None, None, None)  # now in order
    a = torch.randn(64, 64, requires_grad=True)
    (a * 2).sin().sum().backward()  # no hooks left: nothing goes to the arena
    assert context.stats()["tensors_stored"] == 0
    assert_drained(arena)
