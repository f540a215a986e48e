"""The non-reentrant spilling checkpoint (the default): bitwise against torch's own non-reentrant
checkpointing and against no checkpointing on every architecture, torch.autograd.grad,
backward(inputs=...), retain_graph, and what it refuses. Note [A non-reentrant checkpoint that
spills] in python/spillarena/non_reentrant.py."""

import functools
import weakref

import pytest
import torch

import spillarena
from conftest import assert_drained

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
    if checkpointing == "transformers":
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False})
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


def differing(a_steps, b_steps):
    return [f"step {i}: {n}" for i, (a, b) in enumerate(zip(a_steps, b_steps))
            for n in a if not torch.equal(a[n], b[n])]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_bitwise_as_torchs_non_reentrant_checkpointing_and_no_checkpointing(name, spill_dir):
    make = MODELS[name]
    reference = two_steps(make, None)
    ours = two_steps(make, "spillarena", spill_dir)
    assert differing(ours, two_steps(make, "transformers")) == []  # the floats of torch's own
    assert differing(ours, reference) == []


def test_the_reentrant_form_is_still_there_and_within_rounding_on_bart(spill_dir):
    # Why the default changed: an encoder output that every decoder layer takes gets its gradient
    # summed in another order by one autograd Function per layer, so bitwise equality is not
    # promised there (whether the last bits differ depends on the machine); the gradients are
    # those of no checkpointing up to that rounding.
    reference = two_steps(bart, None)
    ours = two_steps(bart, "spillarena-reentrant", spill_dir)
    for step, expected in zip(ours, reference):
        assert step.keys() == expected.keys()
        for name in expected:
            torch.testing.assert_close(step[name], expected[name], rtol=1e-5, atol=1e-6,
                                       msg=name)


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


def test_a_module_shared_by_every_layer_and_a_shared_input_are_bitwise(spill):
    blocks = stack()
    x, context = inputs()
    reference = torch.autograd.grad(forward(blocks, x, context), [x, context, *blocks.parameters()])
    x, context = inputs()
    ours = torch.autograd.grad(forward(blocks, x, context, spill),
                               [x, context, *blocks.parameters()])
    assert len(ours) == len(reference)
    assert all(torch.equal(a, b) for a, b in zip(ours, reference))


def test_backward_with_inputs_fills_only_those(spill):
    blocks = stack()
    x, context = inputs()
    forward(blocks, x, context).backward(inputs=[context])
    reference = context.grad.clone()
    x2, context2 = inputs()
    forward(blocks, x2, context2, spill).backward(inputs=[context2])
    assert torch.equal(context2.grad, reference)
    assert x2.grad is None and all(p.grad is None for p in blocks.parameters())


def test_a_second_backward_with_retain_graph_recomputes_from_the_kept_input(spill, arena):
    blocks = stack()
    x, context = inputs()
    loss = forward(blocks, x, context)
    loss.backward(retain_graph=True)
    loss.backward()
    reference = x.grad.clone()
    x2, context2 = inputs()
    loss2 = forward(blocks, x2, context2, spill)
    loss2.backward(retain_graph=True)
    loss2.backward()
    assert torch.equal(x2.grad, reference)
    del loss2
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

    for a, b in zip(run(spill), run(None)):
        assert (a is None and b is None) or torch.equal(a, b)


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
    with pytest.raises(spillarena.CheckpointError, match=r"torch\.autograd\.grad"):
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
    with pytest.raises(spillarena.IoError):
        out.sum().backward()
    assert layer.weight.grad is None and x.grad is None
