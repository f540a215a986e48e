"""Inputs the arena cannot hold, and layers that return no tensor, train as torch's checkpoint
trains them, in both forms: a sparse, nested or storage-less subclass argument stays in memory
as torch keeps it (one SpillArenaWarning per kind), and a reentrant layer that returns None
returns it (Note [Which argument spills] in python/spillarena/checkpoint.py)."""

import importlib
import warnings

import pytest
import torch
import torch.utils.checkpoint as torch_checkpoint

import spillarena
from conftest import assert_drained

# the module, not the function the package exports under its name
checkpoint_module = importlib.import_module("spillarena.checkpoint")

FORMS = {"non-reentrant": False, "reentrant": True}


@pytest.fixture
def notices(monkeypatch):
    """The SpillArenaWarnings given during the test, each kind noticed afresh."""
    monkeypatch.setattr(checkpoint_module, "_KEPT_IN_MEMORY_NOTICED", set(), raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def _ours(arena, use_reentrant):
    return lambda f, *a: spillarena.checkpoint(f, *a, arena=arena, use_reentrant=use_reentrant)


def _torchs(use_reentrant):
    return lambda f, *a: torch_checkpoint.checkpoint(f, *a, use_reentrant=use_reentrant)


def _sparse_steps(checkpoint, with_dense_input):
    """Gradients of two steps of a layer on a sparse input (and a dense one, when asked)."""
    torch.manual_seed(0)
    w = torch.randn(6, 5, requires_grad=True)
    grads = []
    for step in range(2):
        g = torch.Generator().manual_seed(step)
        x = (torch.randn(4, 6, generator=g) * (torch.rand(4, 6, generator=g) > 0.5)).to_sparse()
        x.requires_grad_(True)
        h = torch.randn(4, 5, generator=g, requires_grad=True)
        if with_dense_input:
            out = checkpoint(lambda x, h: torch.sparse.mm(x, w).tanh() + h, x, h)
        else:
            out = checkpoint(lambda x: torch.sparse.mm(x, w).tanh(), x)
        out.pow(2).sum().backward()
        grads.append([w.grad.clone(), x.grad.to_dense(), h.grad if with_dense_input else None])
        w.grad = None
    return grads


def _same(ours, torchs):
    return all((a is None and b is None) or torch.equal(a, b)
               for step_a, step_b in zip(ours, torchs) for a, b in zip(step_a, step_b))


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("with_dense_input", [False, True], ids=["sparse-only", "beside-dense"])
def test_a_sparse_input_trains_as_torchs_checkpoint_trains_it(form, with_dense_input, arena,
                                                              notices):
    use_reentrant = FORMS[form]
    ours = _sparse_steps(_ours(arena, use_reentrant), with_dense_input)
    assert _same(ours, _sparse_steps(_torchs(use_reentrant), with_dense_input))
    kept = [w for w in notices if issubclass(w.category, spillarena.SpillArenaWarning)]
    assert len(kept) == 1, [str(w.message) for w in kept]  # one notice for two steps
    assert "a sparse_coo tensor argument stays in memory" in str(kept[0].message)
    # beside a dense input, that one spills: the arena still does its work
    assert (arena.stats()["allocations"] > 0) == with_dense_input
    assert_drained(arena)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_nested_input_trains_as_torchs_checkpoint_trains_it(form, arena, notices):
    use_reentrant = FORMS[form]

    def step(checkpoint):
        torch.manual_seed(0)
        parts = [torch.randn(2, 4), torch.randn(3, 4)]
        # torch's checkpoint trains the jagged layout (the strided one fails in torch itself)
        x = torch.nested.nested_tensor(parts, layout=torch.jagged, requires_grad=True)
        out = checkpoint(lambda x: (x * 2).sin(), x)
        sum(t.pow(2).sum() for t in out.unbind()).backward()
        return torch.cat([g.reshape(-1) for g in x.grad.unbind()])

    assert torch.equal(step(_ours(arena, use_reentrant)), step(_torchs(use_reentrant)))
    assert [str(w.message) for w in notices if "nested" in str(w.message)]
    assert_drained(arena)


def test_a_subclass_without_storage_stays_in_memory(arena, notices):
    two_tensor = pytest.importorskip("torch.testing._internal.two_tensor")

    def step(checkpoint):
        torch.manual_seed(0)
        w = torch.randn(4, 4, requires_grad=True)
        x = two_tensor.TwoTensor(torch.randn(3, 4), torch.randn(3, 4)).requires_grad_(True)
        out = checkpoint(lambda x: (x @ w).tanh(), x)
        out.sum().backward()
        return w.grad

    expected = step(_torchs(False))
    assert torch.equal(step(_ours(arena, False)), expected)
    assert any("TwoTensor subclass" in str(w.message) for w in notices)
    assert arena.stats()["allocations"] == 0
    assert_drained(arena)


def test_the_stash_still_refuses_what_it_cannot_hold(arena):
    # the stash's own API is explicit: it raises where checkpoint keeps the input in memory
    stash = spillarena.make_arena_stash(arena)
    with pytest.raises(spillarena.InvalidArgumentError, match="sparse_coo tensor"):
        stash.store(torch.eye(3).to_sparse())


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("returned", [None, (3, None), {"n": "text"}], ids=repr)
def test_a_layer_that_returns_no_tensor_returns_what_torchs_returns(form, returned, arena):
    use_reentrant = FORMS[form]
    x = torch.randn(4, 4, requires_grad=True)
    layer = lambda x: returned  # noqa: E731
    expected = torch_checkpoint.checkpoint(layer, x, use_reentrant=use_reentrant)
    assert spillarena.checkpoint(layer, x, arena=arena, use_reentrant=use_reentrant) == expected
    assert arena.stats()["bytes_in_use"] == 0  # no backward will come: nothing kept for one
    assert_drained(arena)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_quantized_input_trains_as_torchs_checkpoint_trains_it(form, arena, notices):
    use_reentrant = FORMS[form]

    def step(checkpoint):
        torch.manual_seed(0)
        w = torch.randn(4, 4, requires_grad=True)
        q = torch.quantize_per_tensor(torch.randn(4, 4), 0.1, 0, torch.qint8)
        checkpoint(lambda q, w: (q.dequantize() @ w).tanh(), q, w).sum().backward()
        return w.grad

    assert torch.equal(step(_ours(arena, use_reentrant)), step(_torchs(use_reentrant)))
    assert any("a quantized tensor argument stays in memory" in str(w.message) for w in notices)
    assert_drained(arena)
