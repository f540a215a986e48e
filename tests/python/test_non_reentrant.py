"""The non-reentrant spilling checkpoint (the default): bitwise against torch's own non-reentrant
checkpointing on every architecture, and against no checkpointing wherever torch's own equals it
in the same run (conftest.assert_as_torch, whose rule is tested here too); torch.autograd.grad,
backward(inputs=...), retain_graph, and what it refuses. Note [A non-reentrant checkpoint that
spills] in python/spillarena/non_reentrant.py."""

import functools
import weakref

import pytest
import torch

import spillarena
from conftest import assert_as_torch, assert_drained

transformers = pytest.importorskip("transformers")

SEQ, TARGET = 16, 10


def _vocab_ids(shape, seed):
    return torch.randint(4, 256, shape, generator=torch.Generator().manual_seed(seed))


def llama():
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, attention_dropout=0.1)
    return transformers.LlamaForCausalLM(cfg), _causal_batch


def gpt2():
    cfg = transformers.GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=64)
    return transformers.GPT2LMHeadModel(cfg), _causal_batch


def bert():
    cfg = transformers.BertConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=128,
                                  max_position_embeddings=64)
    return transformers.BertForMaskedLM(cfg), _causal_batch


def bart():
    cfg = transformers.BartConfig(vocab_size=256, d_model=64, encoder_layers=2, decoder_layers=2,
                                  encoder_attention_heads=4, decoder_attention_heads=4,
                                  encoder_ffn_dim=128, decoder_ffn_dim=128,
                                  max_position_embeddings=64)
    return transformers.BartForConditionalGeneration(cfg), _seq2seq_batch(TARGET)


def t5(target):
    def make():
        cfg = transformers.T5Config(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                    num_heads=4, decoder_start_token_id=0)
        return transformers.T5ForConditionalGeneration(cfg), _seq2seq_batch(target)
    return make


def vit():
    cfg = transformers.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=128, image_size=32, patch_size=8, num_labels=10,
                                 hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)

    def batch(step):
        g = torch.Generator().manual_seed(step)
        return {"pixel_values": torch.randn(2, 3, 32, 32, generator=g),
                "labels": torch.randint(0, 10, (2,), generator=g)}
    return transformers.ViTForImageClassification(cfg), batch


def _causal_batch(step):
    ids = _vocab_ids((2, SEQ), step)
    return {"input_ids": ids, "labels": ids}


def _seq2seq_batch(target):
    def batch(step):
        return {"input_ids": _vocab_ids((2, SEQ), step),
                "labels": _vocab_ids((2, target), 100 + step)}
    return batch


MODELS = {"llama": llama, "gpt2": gpt2, "bert": bert, "bart": bart, "t5-equal": t5(SEQ),
          "t5-unequal": t5(TARGET), "vit": vit}


def two_steps(make, checkpointing, spill_dir=None):
    """Gradients of two steps (dropout on, a fresh seed each), the model built from one seed."""
    torch.manual_seed(0)
    model, batch = make()
    model.config._attn_implementation = "eager"
    # transformers turns the cache off under any checkpointing; off here too, the reference
    # without checkpointing does the same work (T5 with labels shorter than its inputs otherwise
    # takes another path, whose floats may differ).
    model.config.use_cache = False
    model.train()
    arena = None
    if checkpointing in ("transformers", "transformers-reentrant"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={
            "use_reentrant": checkpointing == "transformers-reentrant"})
    elif checkpointing in ("spillarena", "spillarena-reentrant"):
        arena = spillarena.SpillArena(16 << 20, spill_dir, keep_last=0)
        extra = {"use_reentrant": True} if checkpointing == "spillarena-reentrant" else {}
        spillarena.enable(model, arena, **extra)
    steps = []
    for step in range(2):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(10 + step)
        model(**batch(step)).loss.backward()
        steps.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    if arena is not None:
        assert arena.stats()["allocations"] > 0  # every layer input went through the arena
        assert_drained(arena)
    return steps


@pytest.mark.parametrize("name", sorted(MODELS))
def test_bitwise_as_torchs_own_non_reentrant_checkpointing(name, spill_dir):
    make = MODELS[name]
    assert_as_torch(two_steps(make, "spillarena", spill_dir), two_steps(make, "transformers"),
                    two_steps(make, None), case=name)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_reentrant_form_is_bitwise_as_torchs_reentrant_checkpointing(name, spill_dir):
    # Why the default changed: in the reentrant form an input that several layers take (BART's
    # encoder output, T5's position bias) gets its gradient summed in another order, by one
    # autograd Function per layer, than without checkpointing; torch's reentrant form does the
    # same, so whether the last bits differ from no checkpointing is torch's, on each CPU.
    make = MODELS[name]
    assert_as_torch(two_steps(make, "spillarena-reentrant", spill_dir),
                    two_steps(make, "transformers-reentrant"), two_steps(make, None), case=name)


# ---------------------------------------------------------------------------------------------
# The rule itself, on results made up to look like those of another CPU
# ---------------------------------------------------------------------------------------------

def _gradients(a_bit_off=False):
    """Two steps' gradients; ``a_bit_off`` moves one bias element by one unit in the last place,
    as a sum taken in another order does."""
    bias = torch.tensor([0.5, -1.25, 3.0])
    if a_bit_off:
        bias[1] = torch.nextafter(bias[1], torch.tensor(float("inf")))
    return [{"weight": torch.full((2, 3), 0.25), "bias": bias},
            {"weight": torch.ones(2, 3), "bias": bias * 2}]


@pytest.fixture
def outcomes(monkeypatch):
    """The made-up comparisons kept out of the run's summary of real ones."""
    import conftest

    kept = []
    monkeypatch.setattr(conftest, "AS_TORCH_OUTCOMES", kept)
    return kept


def test_ours_as_torchs_passes_where_torchs_own_differs_from_no_checkpointing(outcomes):
    plain, torchs = _gradients(), _gradients(a_bit_off=True)
    assert assert_as_torch(_gradients(a_bit_off=True), torchs, plain, case="t5") is False
    assert assert_as_torch(_gradients(), _gradients(), plain, case="llama") is True
    assert assert_as_torch(_gradients(), _gradients()) is None  # nothing said of no checkpointing
    assert [(case, paths) for _, case, paths in outcomes] == [
        ("t5", ["result[0]['bias']", "result[1]['bias']"]), ("llama", [])]


def _unlike_torchs(kind, torchs_equals_plain):
    if kind == "the other bits":  # where torch's own is a bit off, this is no checkpointing's
        return _gradients(a_bit_off=torchs_equals_plain)
    result = _gradients(a_bit_off=not torchs_equals_plain)
    if kind == "a gradient missing":
        del result[1]["weight"]
    elif kind == "a gradient none":
        result[0]["bias"] = None
    else:
        result[1]["weight"] = result[1]["weight"].double()
    return result


@pytest.mark.parametrize("kind", ["the other bits", "a gradient missing", "a gradient none",
                                  "another dtype"])
@pytest.mark.parametrize("torchs_equals_plain", [True, False],
                         ids=["torchs-as-plain", "torchs-off-plain"])
def test_ours_unlike_torchs_fails_whether_or_not_torchs_equals_no_checkpointing(
        kind, torchs_equals_plain, outcomes):
    torchs = _gradients(a_bit_off=not torchs_equals_plain)
    with pytest.raises(AssertionError, match="ours differs from torch's own checkpoint"):
        assert_as_torch(_unlike_torchs(kind, torchs_equals_plain), torchs, _gradients())


def test_another_forms_result_asks_for_the_same_gradients_and_no_checkpointings_where_it_is(
        outcomes):
    # torch's reentrant form gives a frozen-input layer no gradient: its other form stands in.
    plain, other = _gradients(), _gradients(a_bit_off=True)
    assert assert_as_torch(_gradients(), other, plain, same_form=False) is False
    assert assert_as_torch(_gradients(), _gradients(), plain, same_form=False) is True
    with pytest.raises(AssertionError, match="differs from no checkpointing at result\\[0\\]"):
        assert_as_torch(_gradients(a_bit_off=True), _gradients(), plain, same_form=False)
    missing = _gradients()
    missing[0]["weight"] = None  # no gradient where torch's other form gives one
    with pytest.raises(AssertionError, match="other form"):
        assert_as_torch(missing, other, plain, same_form=False)


# ---------------------------------------------------------------------------------------------
# A plain stack: a module shared by several layers, autograd.grad, inputs=, retain_graph
# ---------------------------------------------------------------------------------------------

class Block(torch.nn.Module):
    def __init__(self, shared, width=32):
        super().__init__()
        self.own, self.shared = torch.nn.Linear(width, width), shared
        self.drop = torch.nn.Dropout(0.2)

    def forward(self, h, context):
        return h + self.drop(torch.tanh(self.own(h) + self.shared(context)))


def stack(layers=4, width=32):
    torch.manual_seed(1)
    shared = torch.nn.Linear(width, width)
    return torch.nn.ModuleList(Block(shared, width) for _ in range(layers))


def forward(blocks, x, context, checkpoint=None):
    torch.manual_seed(7)
    h = x
    for block in blocks:
        h = checkpoint(block, h, context) if checkpoint else block(h, context)
    return h.pow(2).mean()


def inputs(width=32):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, width, generator=g).requires_grad_(True)
    context = torch.randn(8, width, generator=g).requires_grad_(True)
    return x, context


@pytest.fixture
def spill(arena):
    return functools.partial(spillarena.checkpoint, arena=arena)


# torch's own non-reentrant checkpoint: the floats ours must have (conftest.assert_as_torch).
TORCHS = functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)


def test_a_module_shared_by_every_layer_and_a_shared_input_are_bitwise(spill):
    def gradients(checkpoint):
        blocks = stack()
        x, context = inputs()
        return torch.autograd.grad(forward(blocks, x, context, checkpoint),
                                   [x, context, *blocks.parameters()])

    assert_as_torch(gradients(spill), gradients(TORCHS), gradients(None))


def test_backward_with_inputs_fills_only_those(spill):
    def gradients(checkpoint):
        blocks = stack()
        x, context = inputs()
        forward(blocks, x, context, checkpoint).backward(inputs=[context])
        return context.grad, x.grad, [p.grad for p in blocks.parameters()]

    ours = gradients(spill)
    assert_as_torch(ours, gradients(TORCHS), gradients(None))
    assert ours[1] is None and all(g is None for g in ours[2])


def test_a_second_backward_with_retain_graph_recomputes_from_the_kept_input(spill, arena):
    def gradient(checkpoint):
        blocks = stack()
        x, context = inputs()
        loss = forward(blocks, x, context, checkpoint)
        loss.backward(retain_graph=True)
        loss.backward()
        return x.grad

    assert_as_torch(gradient(spill), gradient(TORCHS), gradient(None))
    assert_drained(arena)


def test_a_layer_whose_outputs_are_not_all_used(spill):
    class TwoOutputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

        def forward(self, h):
            return torch.relu(self.a(h)), torch.sigmoid(self.b(h))  # the second is dropped

    torch.manual_seed(2)
    layers = [TwoOutputs() for _ in range(3)]
    x0 = torch.randn(4, 16)

    def run(checkpoint):
        h = x0.clone().requires_grad_(True)
        for layer in layers:
            h = (checkpoint(layer, h) if checkpoint else layer(h))[0]
        return torch.autograd.grad(h.sum(), [*(p for layer in layers for p in layer.parameters())],
                                   allow_unused=True)

    assert_as_torch(run(spill), run(TORCHS), run(None))


def test_forward_keeps_no_reference_to_the_layer_input(spill_dir):
    arena = spillarena.SpillArena(4 << 20, spill_dir, keep_last=0, asynchronous=False)
    blocks = stack(2)
    x, context = inputs()
    h = blocks[0](x, context)  # not checkpointed: h is an intermediate, like a layer input
    alive = weakref.ref(h)
    out = spillarena.checkpoint(blocks[1], h, context, arena=arena)
    del h
    assert alive() is None  # the graph holds none of it; the arena has its bytes
    assert arena.stash_stats()["inputs_spilled"] == 1
    out.sum().backward()
    assert x.grad is not None
    assert_drained(arena)


def test_a_layer_that_saves_other_tensors_when_it_runs_again_is_refused(spill):
    calls = []

    def layer(h):
        calls.append(1)
        return h.exp() if len(calls) == 1 else h * 2  # forward and recomputation differ

    x = torch.randn(4, 4, requires_grad=True)
    out = spill(layer, x * 1)
    # torch's own check and error: the default form is torch's non-reentrant checkpoint
    with pytest.raises(torch.utils.checkpoint.CheckpointError,
                       match=r"different number of tensors was saved"):
        out.sum().backward()


def test_use_reentrant_true_keeps_the_old_form_and_its_refusals(arena):
    blocks = stack(2)
    x, context = inputs()
    loss = forward(blocks, x, context,
                   functools.partial(spillarena.checkpoint, arena=arena, use_reentrant=True))
    with pytest.raises(spillarena.errors.CheckpointError, match=r"torch\.autograd\.grad"):
        torch.autograd.grad(loss, [x])
    with pytest.raises(spillarena.InvalidArgumentError, match="use_reentrant"):
        spillarena.checkpoint(blocks[0], x, context, arena=arena, use_reentrant="yes")


@pytest.mark.parametrize("options", [{}, {"io": "direct", "staging_bytes": 1 << 20},
                                     {"keep_last": 2}, {"prefetch_depth": 0}, {"backing": "ram"}],
                         ids=["buffered", "direct", "keep_last_2", "no_prefetch", "ram"])
def test_both_forms_spill_restore_and_prefetch_the_same(spill_dir, options):
    counts = {}
    for reentrant in (False, True):
        directory = None if options.get("backing") == "ram" else spill_dir
        arena = spillarena.SpillArena(16 << 20, directory, **options)
        blocks = stack(6)
        x, context = inputs()
        spill = functools.partial(spillarena.checkpoint, arena=arena, use_reentrant=reentrant)
        forward(blocks, x, context, spill).backward()
        stats, stash = arena.stats(), arena.stash_stats()
        counts[reentrant] = {k: stash[k] for k in ("inputs_stored", "inputs_spilled", "restores",
                                                   "prefetches")}
        counts[reentrant]["allocations"] = stats["allocations"]
        assert_drained(arena)
    assert counts[False] == counts[True]
    assert counts[False]["inputs_stored"] == 6


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_an_input_changed_in_place_after_forward_is_refused_not_trained_on(spill_dir, reentrant):
    arena = spillarena.SpillArena(4 << 20, spill_dir, keep_last=0)
    layer = torch.nn.Linear(16, 16)
    x = torch.randn(4, 16, requires_grad=True)
    h = x * 2  # the layer input, a non-leaf the caller can still change
    out = spillarena.checkpoint(layer, h, arena=arena, use_reentrant=reentrant)
    with torch.no_grad():
        h.add_(1)  # while its bytes are in the arena (or its write in flight)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()
    assert layer.weight.grad is None and x.grad is None
    del out
    assert_drained(arena, wait_s=10)


@pytest.mark.parametrize("layout", ["transposed", "expanded", "a dropped view"])
@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_a_view_input_changed_in_place_through_its_base_is_refused(spill_dir, reentrant, layout):
    # The stash keeps a compact view of such inputs; the check must follow the base's version
    # counter, which every view shares, not the view's Python object (review of issue 38).
    arena = spillarena.SpillArena(4 << 20, spill_dir, keep_last=0)
    layer = torch.nn.Linear(16, 16)
    x = torch.randn(16, 4, requires_grad=True)
    base = x * 2  # a non-leaf the caller can still change
    if layout == "transposed":
        h = base.t()
    elif layout == "expanded":
        base = (x * 2)[:1, :]
        h = base.t().expand(4, 16)
    else:
        h = base.t()[1:]
    out = spillarena.checkpoint(layer, h, arena=arena, use_reentrant=reentrant)
    del h  # only the base is left to the caller
    with torch.no_grad():
        base.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()
    del out
    assert_drained(arena, wait_s=10)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_a_spill_file_cut_before_backward_is_an_io_error_and_no_gradient(spill_dir, reentrant):
    import os

    from test_arena import _reopen_spill_file

    arena = spillarena.SpillArena(4 << 20, spill_dir, keep_last=0, asynchronous=False)
    layer = torch.nn.Linear(256, 256)
    x = torch.randn(64, 256, requires_grad=True)
    out = spillarena.checkpoint(layer, x * 1, arena=arena, use_reentrant=reentrant)
    fd = _reopen_spill_file(spill_dir)
    try:
        os.ftruncate(fd, 0)  # the disk lost the file's bytes between forward and backward
    finally:
        os.close(fd)
    with pytest.raises(spillarena.errors.IoError):
        out.sum().backward()
    assert layer.weight.grad is None and x.grad is None
