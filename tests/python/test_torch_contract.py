"""spillarena.checkpoint against torch.utils.checkpoint.checkpoint, case by case: each case runs
with spillarena's checkpoint in both forms and, in the same test, with torch's own of the same
form (which must run, or the case is wrong). Gradients are compared with torch.equal: equal to
torch's own always, to no checkpointing's where torch's own are (conftest.assert_as_torch); the
spill directory is empty afterwards."""

import pytest
import torch
import torch.utils.checkpoint as torch_checkpoint

import spillarena
from conftest import assert_as_torch, assert_drained

FORMS = {
    "torch": lambda f, *a, **k: torch_checkpoint.checkpoint(f, *a, use_reentrant=False, **k),
    "torch-reentrant": lambda f, *a, **k: torch_checkpoint.checkpoint(f, *a, use_reentrant=True,
                                                                      **k),
}


class Form:
    """spillarena.checkpoint in one form on the test's arena; ``torchs``: torch's own, that form."""

    def __init__(self, arena, reentrant):
        self.arena, self.reentrant = arena, reentrant
        self.torchs = FORMS["torch-reentrant" if reentrant else "torch"]

    def __call__(self, f, *a, **k):
        return spillarena.checkpoint(f, *a, arena=self.arena, use_reentrant=self.reentrant, **k)


@pytest.fixture(params=[False, True], ids=["spillarena", "spillarena-reentrant"])
def checkpoint(request, arena):
    """spillarena's checkpoint in the form under test, spilling to ``arena``."""
    return Form(arena, request.param)


@pytest.fixture
def spill(arena):
    """spillarena's default form, spilling to ``arena``."""
    return Form(arena, reentrant=False)


def grads(tensors):
    return [t.grad.clone() if t.grad is not None else None for t in tensors]


def assert_as_torchs_form(step, checkpoint):
    """``step(checkpoint_or_None)``: ours, torch's own of the same form, no checkpointing."""
    assert_as_torch(step(checkpoint), step(checkpoint.torchs), step(None))


# ---------------------------------------------------------------------------------------------
# Layouts: a restored input is the forward's, strides included (Note [A restored input keeps
# its layout] in python/spillarena/layout.py)
# ---------------------------------------------------------------------------------------------

class StrideRecorder(torch.nn.Module):
    """A layer that records the strides its input had each time it ran."""

    def __init__(self, width):
        super().__init__()
        self.linear = torch.nn.Linear(width, width)
        self.strides = []

    def forward(self, x):
        self.strides.append(x.stride())
        return torch.nn.functional.gelu(self.linear(x) @ x.transpose(-1, -2))


def make_input(kind, source):
    if kind == "expanded":  # learned query tokens, as Q-Former-style models feed them
        return (source * 2).expand(3, -1, -1)
    if kind == "transposed":
        return (source * 2).t()
    return (source * 2).unsqueeze(0).expand(2, -1, -1).contiguous()


@pytest.mark.parametrize("kind", ["expanded", "transposed", "contiguous"])
def test_a_restored_input_has_the_forwards_shape_and_strides(checkpoint, kind, arena):
    torch.manual_seed(0)
    source = torch.nn.Parameter(torch.randn(8, 8))
    layer = StrideRecorder(8)

    def step(ck):
        layer.zero_grad()
        source.grad = None
        layer.strides.clear()
        x = make_input(kind, source)
        h = ck(layer, x) if ck else layer(x)
        h.pow(2).sum().backward()
        return grads([source, *layer.parameters()]), list(layer.strides), x.stride()

    ours, strides, forward_stride = step(checkpoint)
    assert strides == [forward_stride, forward_stride]  # forward, then the recomputation
    assert_as_torch(ours, step(checkpoint.torchs)[0], step(None)[0])
    assert_drained(arena)


def test_an_expanded_input_spills_only_the_values_it_holds(arena):
    source = torch.nn.Parameter(torch.randn(64, 64))
    x = (source * 2).expand(16, -1, -1)  # 16 x 16 KiB to look at, 16 KiB of values
    spillarena.checkpoint(lambda t: t.sin(), x, arena=arena).sum().backward()
    assert arena.stash_stats()["inputs_spilled"] == 1
    assert arena.stats()["peak_bytes_in_use"] == 64 * 64 * 4
    assert_drained(arena)


# ---------------------------------------------------------------------------------------------
# Arguments as torch takes them (Note [Which argument spills] in checkpoint.py)
# ---------------------------------------------------------------------------------------------

CALLS = {
    "scalar_first": (lambda s, x: (x * s).sin(), lambda x, y: (2.0, x)),
    "in_a_dict": (lambda d: d["x"].sin() * d["y"], lambda x, y: ({"x": x, "y": y},)),
    "in_a_list": (lambda xs: xs[0].sin() @ xs[1], lambda x, y: ([x, y],)),
    "nested": (lambda t: t[0].sin() + t[1]["y"], lambda x, y: ((x, {"y": y}),)),
    "keyword": (lambda x, *, y: x.sin() * y, None),
}


@pytest.mark.parametrize("call", list(CALLS))
def test_any_arguments_with_tensors_anywhere(checkpoint, call, arena):
    function, arguments = CALLS[call]
    x0 = torch.randn(6, 6, generator=torch.Generator().manual_seed(1))
    y0 = torch.randn(6, 6, generator=torch.Generator().manual_seed(2))

    def step(ck):
        x, y = x0.clone().requires_grad_(), y0.clone().requires_grad_()
        if arguments is None:  # a keyword tensor
            out = ck(function, x * 1, y=y * 1) if ck else function(x * 1, y=y * 1)
        else:
            out = ck(function, *arguments(x * 1, y * 1)) if ck else function(*arguments(x * 1,
                                                                                     y * 1))
        out.pow(2).sum().backward()
        return [x.grad, y.grad]

    # torch's reentrant form sees only top-level positional tensors: it refuses keyword
    # arguments, and tensors inside containers get no gradient; ours takes them as the
    # non-reentrant form does.
    same_form = not checkpoint.reentrant or call == "scalar_first"
    assert_as_torch(step(checkpoint), step(checkpoint.torchs if same_form else FORMS["torch"]),
                    step(None), same_form=same_form)
    assert_drained(arena)


def test_a_call_without_a_tensor_runs_like_torchs(arena):
    calls = []

    def function(n):
        calls.append(n)
        return n * 2

    assert torch_checkpoint.checkpoint(function, 3, use_reentrant=False) == 6
    assert spillarena.checkpoint(function, 3, arena=arena) == 6
    assert calls == [3, 3]
    assert arena.stash_stats()["inputs_stored"] == 0  # nothing to spill


def test_the_layer_input_spills_and_the_other_tensors_are_held(arena):
    x = torch.randn(64, 64, requires_grad=True)
    mask = torch.ones(64, 64)
    out = spillarena.checkpoint(lambda m, h: (h * 1).sin() * m, mask, x * 1, arena=arena)
    out.sum().backward()
    # the first floating-point positional tensor: the mask
    assert arena.stats()["peak_bytes_in_use"] == mask.numel() * 4
    weight = torch.nn.Parameter(torch.randn(64, 64))
    spillarena.checkpoint(lambda w, h: h @ w, weight, x * 1, arena=arena).sum().backward()
    assert arena.stash_stats()["inputs_spilled"] == 2  # the activation, never the weight
    assert_drained(arena)


# ---------------------------------------------------------------------------------------------
# The default form is torch's non-reentrant checkpoint (Note [A non-reentrant checkpoint that
# spills]): autograd inside the layer, nesting, early stop, retain_graph, context_fn
# ---------------------------------------------------------------------------------------------

@pytest.fixture(params=["torch", "spillarena"])
def default_form(request, arena):
    if request.param == "torch":
        return FORMS["torch"]
    return lambda f, *a, **k: spillarena.checkpoint(f, *a, arena=arena, **k)


def gradient_penalty_layer(weight):
    def layer(x):
        y = torch.tanh(x @ weight)
        (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
        return y + g.pow(2)
    return layer


def test_autograd_grad_inside_the_layer(spill, arena):
    torch.manual_seed(3)
    weight = torch.nn.Parameter(torch.randn(8, 8))
    x0 = torch.randn(4, 8)

    def step(ck):
        weight.grad = None
        x = x0.clone().requires_grad_()
        layer = gradient_penalty_layer(weight)
        out = ck(layer, x * 1) if ck else layer(x * 1)
        out.sum().backward()
        return [x.grad, weight.grad.clone()]

    assert_as_torchs_form(step, spill)
    assert_drained(arena)


@pytest.mark.parametrize("early_stop", [True, False])
def test_nested_checkpoints(spill, early_stop, arena):
    torch.manual_seed(4)
    inner = torch.nn.Linear(8, 8)
    outer = torch.nn.Linear(8, 8)
    x0 = torch.randn(4, 8)

    def step(ck):
        inner.zero_grad()
        outer.zero_grad()
        x = x0.clone().requires_grad_()
        if ck:
            with torch_checkpoint.set_checkpoint_early_stop(early_stop):
                out = ck(lambda h: outer(ck(lambda g: inner(g).tanh(), h)).sin(), x * 1)
                out.sum().backward()
        else:
            outer(inner(x * 1).tanh()).sin().sum().backward()
        return [x.grad, *[p.grad.clone() for p in (*inner.parameters(), *outer.parameters())]]

    assert_as_torchs_form(step, spill)
    assert_drained(arena)


@pytest.mark.parametrize("how", ["set_checkpoint_early_stop", "argument"])
def test_early_stop_skips_what_backward_does_not_need(default_form, how, arena):
    ran = []

    def layer(x):
        ran.append("head")
        y = x.sin()  # saves x
        ran.append("tail")
        return y, (y * 0).detach()  # the tail saves nothing backward needs

    def recomputed_tail(early_stop):
        ran.clear()
        x = torch.randn(4, 4, requires_grad=True)
        if how == "argument":
            out, _ = default_form(layer, x * 1, early_stop=early_stop)
        else:
            with torch_checkpoint.set_checkpoint_early_stop(early_stop):
                out, _ = default_form(layer, x * 1)
        out.sum().backward()
        return ran[2:]  # what the recomputation ran

    assert recomputed_tail(True) == ["head"]
    assert recomputed_tail(False) == ["head", "tail"]
    assert_drained(arena)


def test_retain_graph_and_a_second_backward(spill, arena):
    torch.manual_seed(6)
    layer = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    x0 = torch.randn(4, 8)

    def step(ck):
        layer.zero_grad()
        x = x0.clone().requires_grad_()
        out = ck(layer, x * 1) if ck else layer(x * 1)
        out.sum().backward(retain_graph=True)
        out.pow(2).sum().backward()
        return [x.grad, *[p.grad.clone() for p in layer.parameters()]]

    assert_as_torchs_form(step, spill)
    assert_drained(arena)


def test_a_selective_checkpoint_policy(spill, arena):
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    def policy(ctx, op, *args, **kwargs):
        return (CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.mm.default
                else CheckpointPolicy.PREFER_RECOMPUTE)

    torch.manual_seed(7)
    weight = torch.nn.Parameter(torch.randn(8, 8))
    x0 = torch.randn(4, 8)

    def step(ck):
        weight.grad = None
        x = x0.clone().requires_grad_()
        layer = lambda h: (h @ weight).sin() @ weight  # noqa: E731
        if ck:
            out = ck(layer, x * 1,
                     context_fn=lambda: create_selective_checkpoint_contexts(policy))
        else:
            out = layer(x * 1)
        out.sum().backward()
        return [x.grad, weight.grad.clone()]

    assert_as_torchs_form(step, spill)
    assert_drained(arena)


def test_a_second_read_of_saved_tensors_raises_torchs_error(default_form, arena):
    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            ctx.saved_tensors  # noqa: B018
            ctx.saved_tensors  # noqa: B018  (the second read)
            return g * 2

    x = torch.randn(4, requires_grad=True)
    out = default_form(lambda h: Twice.apply(h.sin()), x * 1)
    with pytest.raises(torch_checkpoint.CheckpointError, match="already unpacked once"):
        out.sum().backward()
    del out
    assert_drained(arena)


def test_context_fn_and_debug_are_refused_by_the_reentrant_form_as_by_torchs(arena):
    with pytest.raises(ValueError, match="context_fn"):
        torch_checkpoint.checkpoint(torch.sin, torch.ones(2), use_reentrant=True, debug=True)
    with pytest.raises(spillarena.InvalidArgumentError, match="context_fn and debug"):
        spillarena.checkpoint(torch.sin, torch.ones(2), arena=arena, use_reentrant=True,
                              debug=True)


# ---------------------------------------------------------------------------------------------
# checkpoint_sequential, as torch's
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("segments", [1, 2, 3, 5])
@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_sequential_as_torchs(segments, use_reentrant, arena):
    torch.manual_seed(8)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(),
                                                      torch.nn.Dropout(0.1)) for _ in range(5)])
    x0 = torch.randn(4, 16)

    def step(run):
        model.zero_grad()
        x = x0.clone().requires_grad_()
        torch.manual_seed(9)
        run(x * 1).pow(2).sum().backward()
        return [x.grad, *[p.grad.clone() for p in model.parameters()]]

    torchs = step(lambda x: torch_checkpoint.checkpoint_sequential(
        model, segments, x, use_reentrant=use_reentrant))
    stored = arena.stash_stats()["inputs_stored"]
    ours = step(lambda x: spillarena.checkpoint_sequential(model, segments, x,
                                                           use_reentrant=use_reentrant,
                                                           arena=arena))
    assert_as_torch(ours, torchs, step(model))
    assert arena.stash_stats()["inputs_stored"] - stored == segments - 1
    assert_drained(arena)


@pytest.mark.parametrize("segments", [0, -1, 6, 2.5, True, "2"])
def test_checkpoint_sequential_refuses_a_bad_segment_count(segments, arena):
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(5)])
    with pytest.raises(spillarena.InvalidArgumentError, match=r"segments must be an integer"):
        spillarena.checkpoint_sequential(model, segments, torch.ones(2, 4), arena=arena)


def test_checkpoint_sequential_refuses_what_torchs_refuses_and_a_bad_arena(arena):
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(5)])
    x = torch.ones(2, 4)
    with pytest.raises(spillarena.InvalidArgumentError, match=r"at least one"):
        spillarena.checkpoint_sequential(torch.nn.Sequential(), 1, x, arena=arena)
    with pytest.raises(spillarena.InvalidArgumentError, match=r"unexpected keyword.*foo"):
        spillarena.checkpoint_sequential(model, 2, x, arena=arena, foo=1)
    with pytest.raises(spillarena.InvalidArgumentError, match=r"arena= must be"):
        spillarena.checkpoint_sequential(model, 1, x, arena="/tmp")
    numpy = pytest.importorskip("numpy")
    assert spillarena.checkpoint_sequential(model, numpy.int64(2), x, arena=arena).shape == (2, 4)


# ---------------------------------------------------------------------------------------------
# Found in review: slices with gaps, policies that save views, frozen layers, weight views
# ---------------------------------------------------------------------------------------------

def test_a_slice_with_gaps_of_a_frozen_lora_layer(checkpoint, arena):
    torch.manual_seed(12)
    base = torch.nn.Linear(16, 16).requires_grad_(False)
    lora = torch.nn.Linear(16, 16, bias=False)
    h0 = torch.randn(2, 5, 16)

    def step(ck):
        lora.zero_grad()
        h = h0.clone().requires_grad_()
        layer = lambda t: base(t) + lora(t)  # noqa: E731
        out = ck(layer, h[:, :-1]) if ck else layer(h[:, :-1])
        out.pow(2).sum().backward()
        return [h.grad, lora.weight.grad.clone()]

    assert_as_torchs_form(step, checkpoint)
    assert_drained(arena)


@pytest.mark.parametrize("kind", ["expanded", "transposed"])
def test_a_policy_that_saves_every_op_with_a_strided_input(default_form, kind, arena):
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    source = torch.nn.Parameter(torch.randn(8, 8))
    layer = StrideRecorder(8)
    x = make_input(kind, source)
    out = default_form(layer, x, context_fn=lambda: create_selective_checkpoint_contexts(
        lambda *a, **k: CheckpointPolicy.MUST_SAVE))
    out.sum().backward()
    assert source.grad is not None
    del out
    assert_drained(arena)


def test_a_frozen_layer_with_an_input_without_grad_passes_as_torchs(checkpoint, arena):
    frozen = torch.nn.Linear(4, 4).requires_grad_(False)
    head = torch.nn.Linear(4, 1)
    for ck in (checkpoint.torchs, checkpoint):  # torch's own first: the case is one it passes
        head.zero_grad(set_to_none=True)
        h = ck(frozen, torch.randn(2, 4))
        head(h).sum().backward()
        assert head.weight.grad is not None
    assert_drained(arena)


def test_a_view_of_a_weight_is_never_the_spilled_argument(arena):
    weight = torch.nn.Parameter(torch.randn(64, 64))
    x = torch.randn(4, 64, requires_grad=True)
    spillarena.checkpoint(lambda w, h: h @ w, weight.t(), x * 1, arena=arena).sum().backward()
    assert arena.stats()["peak_bytes_in_use"] == 4096  # x's 1 KiB in one page, not W's 16 KiB
    assert arena.stash_stats()["inputs_stored"] == 1
    assert_drained(arena)


def test_outputs_that_need_no_grad_need_none_or_raise_as_torchs(checkpoint, arena):
    # The non-reentrant forms return an output that needs no grad; the reentrant forms one that
    # does, whose backward raises.
    x = torch.randn(4, 4, requires_grad=True)
    for ck in (checkpoint.torchs, checkpoint):
        out = ck(lambda h: h.detach().sin(), x * 1)
        assert out.requires_grad == checkpoint.reentrant
        if out.requires_grad:
            with pytest.raises(RuntimeError, match="none of output has requires_grad=True"):
                out.sum().backward()
        del out
    assert_drained(arena)


# ---------------------------------------------------------------------------------------------
# RNG, autocast, autograd.grad around the call, inputs without grad, non-determinism detection
# ---------------------------------------------------------------------------------------------

def test_dropout_masks_are_replayed(checkpoint, arena):
    layer = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Dropout(0.5), torch.nn.GELU())
    x0 = torch.randn(8, 16)

    def step(ck):
        layer.zero_grad()
        x = x0.clone().requires_grad_()
        torch.manual_seed(11)
        out = ck(layer, x * 1) if ck else layer(x * 1)
        out.pow(2).sum().backward()
        return [x.grad, *[p.grad.clone() for p in layer.parameters()], torch.rand(1)]

    assert_as_torchs_form(step, checkpoint)  # the RNG stream after backward included
    assert_drained(arena)


def test_autocast_state_is_replayed(checkpoint, arena):
    layer = torch.nn.Linear(16, 16)
    x0 = torch.randn(8, 16)

    def step(ck):
        layer.zero_grad()
        x = x0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = ck(layer, x * 1) if ck else layer(x * 1)
        out.float().pow(2).sum().backward()
        return [x.grad, *[p.grad.clone() for p in layer.parameters()]]

    assert_as_torchs_form(step, checkpoint)
    assert_drained(arena)


def test_autograd_grad_around_the_call(spill, arena):
    layer = torch.nn.Linear(8, 8)
    x0 = torch.randn(4, 8)

    def step(ck):
        x = x0.clone().requires_grad_()
        out = ck(layer, x * 1) if ck else layer(x * 1)
        return list(torch.autograd.grad(out.tanh().sum(), [x, layer.weight]))

    assert_as_torchs_form(step, spill)
    assert_drained(arena)


def test_an_input_without_grad_still_gives_the_layer_its_gradients(checkpoint, arena):
    layer = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)  # frozen embeddings, as under PEFT

    def step(ck):
        layer.zero_grad(set_to_none=True)
        out = ck(layer, x) if ck else layer(x)
        out.sum().backward()
        return [p.grad for p in layer.parameters()]

    # torch's reentrant form gives no parameter gradients here (it warns); ours does, as torch's
    # non-reentrant form.
    assert_as_torch(step(checkpoint), step(FORMS["torch"]), step(None),
                    same_form=not checkpoint.reentrant)
    assert_drained(arena)


@pytest.mark.parametrize("determinism_check", ["default", "none"])
def test_a_recomputation_that_differs_is_detected_as_torch_detects_it(default_form,
                                                                      determinism_check, arena):
    calls = []

    def layer(h):
        calls.append(1)
        return (h if len(calls) == 1 else h[:2]).sin()  # the recomputation saves another shape

    x = torch.randn(4, 4, requires_grad=True)
    out = default_form(layer, x * 1, determinism_check=determinism_check)
    if determinism_check == "default":
        with pytest.raises(torch_checkpoint.CheckpointError, match="Recomputed values"):
            out.sum().backward()
    else:  # unchecked, as asked: the mismatched tensor reaches autograd, which fails on it
        with pytest.raises(RuntimeError) as failure:
            out.sum().backward()
        assert not isinstance(failure.value, torch_checkpoint.CheckpointError)
    del out
    assert_drained(arena)


# ---------------------------------------------------------------------------------------------
# A second backward through the reentrant form (Note [A second backward through the reentrant
# form] in python/spillarena/reentrant.py)
# ---------------------------------------------------------------------------------------------

def _spill_node(output):
    """The reentrant form's autograd node behind ``output`` (its ctx)."""
    pending = [output.grad_fn]
    while pending:
        node = pending.pop()
        if node is None:
            continue
        if type(node).__name__.startswith("_SpillCheckpoint"):
            return node
        pending += [n for n, _ in node.next_functions]
    raise AssertionError("no _SpillCheckpoint node in the graph")


def test_retain_graph_and_a_second_backward_in_both_reentrant_forms(checkpoint, arena):
    torch.manual_seed(13)
    layer = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    x0 = torch.randn(4, 8)

    def step(ck):
        layer.zero_grad()
        x = x0.clone().requires_grad_()
        out = (ck(layer, x * 1) if ck else layer(x * 1)).pow(2).sum()
        out.backward(retain_graph=True)
        out.backward()
        return [x.grad, *[p.grad.clone() for p in layer.parameters()]]

    assert_as_torchs_form(step, checkpoint)
    assert_drained(arena)


def test_the_reentrant_form_keeps_the_restored_input_only_for_a_retained_graph(arena):
    layer = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    out = spillarena.checkpoint(layer, x * 1, arena=arena, use_reentrant=True).sum()
    node = _spill_node(out)
    out.backward(retain_graph=True)
    assert node.kept.tensor is not None  # a second backward may come
    out.backward()
    out = spillarena.checkpoint(layer, x * 1, arena=arena, use_reentrant=True).sum()
    node = _spill_node(out)
    out.backward()
    assert node.kept.tensor is None  # released with the node's saved tensors
    assert_drained(arena)


def test_a_forward_that_raises_frees_the_stored_input_in_both_forms(arena):
    def failing(x):
        raise ValueError("the layer failed")

    for reentrant in (False, True):
        x = torch.randn(4, 8, requires_grad=True)
        with pytest.raises(ValueError, match="the layer failed") as raised:
            spillarena.checkpoint(failing, x * 1, arena=arena, use_reentrant=reentrant)
        # freed at once, not when the traceback (which holds the call's frames) goes
        assert_drained(arena, wait_s=10)
        del raised
