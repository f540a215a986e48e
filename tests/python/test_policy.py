"""Selective checkpointing whose third choice is the disk (Note [Operation outputs to the arena]
in python/spillarena/policy.py): gradients bitwise those of torch's own selective checkpoint with
the offloaded ops saved instead, the offloaded op run once per step, a full disk and a failing
layer leaving nothing behind, and what it refuses."""

import functools
import gc
import importlib
import math
import warnings

import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

import spillarena
from conftest import assert_as_torch, assert_drained

transformers = pytest.importorskip("transformers")
checkpoint_module = importlib.import_module("spillarena.checkpoint")

OFFLOAD_TO_SAVE = {CheckpointPolicy.MUST_CPU_OFFLOAD: CheckpointPolicy.MUST_SAVE,
                   CheckpointPolicy.PREFER_CPU_OFFLOAD: CheckpointPolicy.PREFER_SAVE}


def attention_policy(ctx, op, *args, **kwargs):
    """Attention's output to the disk, the matmuls kept, the rest recomputed."""
    if op in spillarena.ATTENTION_OPS:
        return CheckpointPolicy.MUST_CPU_OFFLOAD
    if op is torch.ops.aten.mm.default:
        return CheckpointPolicy.PREFER_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def torchs(policy_fn):
    """torch's own selective checkpoint of ``policy_fn`` with *_CPU_OFFLOAD read as *_SAVE."""
    def saving(ctx, op, *args, **kwargs):
        policy = policy_fn(ctx, op, *args, **kwargs)
        return OFFLOAD_TO_SAVE.get(policy, policy)
    return functools.partial(create_selective_checkpoint_contexts, saving)


def llama():
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, attention_dropout=0.1)
    return transformers.LlamaForCausalLM(cfg)


def t5():
    cfg = transformers.T5Config(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                num_heads=4, decoder_start_token_id=0, dropout_rate=0.1)
    return transformers.T5ForConditionalGeneration(cfg)


MODELS = {"llama": llama, "t5": t5}


def two_steps(make, checkpointing, attention="sdpa", dtype=None):
    """Two steps' gradients (dropout on, a seed per step); ``checkpointing``: None, or a
    (how, context_fn) pair: "spillarena" through enable(), "transformers" through its own, or a
    ("policy", policy, arena) triple: enable(model, arena, policy=policy)."""
    torch.manual_seed(0)
    model = make()
    model.config._attn_implementation = attention
    model.config.use_cache = False
    model.train()
    if checkpointing is not None:
        how, context_fn, *arena = checkpointing
        if how == "spillarena":
            spillarena.enable(model, *arena, context_fn=context_fn)
        elif how == "policy":
            spillarena.enable(model, *arena, policy=context_fn)
        else:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={
                "use_reentrant": False, "context_fn": context_fn})
    steps = []
    for step in range(2):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(10 + step)
        ids = torch.randint(4, 256, (2, 16), generator=torch.Generator().manual_seed(step))
        batch = {"input_ids": ids, "labels": ids}
        if make is t5:
            batch["labels"] = torch.randint(4, 256, (2, 10),
                                            generator=torch.Generator().manual_seed(100 + step))
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            loss = model(**batch).loss
        loss.backward()
        steps.append({n: p.grad.clone() for n, p in model.named_parameters()
                      if p.grad is not None})
    return steps


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_bitwise_as_torchs_selective_checkpoint_with_offload_read_as_save(name, attention,
                                                                          arena):
    make = MODELS[name]
    ours_fn = functools.partial(spillarena.selective_checkpoint_contexts, attention_policy,
                                arena=arena)
    ours = two_steps(make, ("spillarena", ours_fn, arena), attention)
    assert_as_torch(ours, two_steps(make, ("transformers", torchs(attention_policy)), attention),
                    two_steps(make, None, attention), case=f"{name}-{attention}")
    # per step, each layer's input, and apart each attention's output: Llama 2 layers and 2
    # attentions; T5 4 layers (encoder 2, decoder 2) and 6 attentions (the decoder's self- and
    # cross-attention)
    layers, attentions = (2, 2) if name == "llama" else (4, 6)
    stats = arena.stash_stats()
    assert (stats["inputs_stored"], stats["saved_tensors_stored"]) == (2 * layers, 2 * attentions)
    assert stats["inputs_spilled"] + stats["saved_tensors_spilled"] > 0
    assert_drained(arena)


def listed(ops):
    """A list of ops as a policy: those offloaded, the rest recomputed."""
    def policy_fn(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_CPU_OFFLOAD if op in ops else \
            CheckpointPolicy.PREFER_RECOMPUTE
    return policy_fn


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_enable_with_a_policy_spills_attention_in_one_line(attention, arena):
    ops = spillarena.ATTENTION_OPS
    ours = two_steps(llama, ("policy", ops, arena), attention)
    assert_as_torch(ours, two_steps(llama, ("transformers", torchs(listed(ops))), attention),
                    two_steps(llama, None, attention), case=f"llama-{attention}")
    stats = arena.stash_stats()  # two steps of two layers: their inputs, and their attentions
    assert (stats["inputs_stored"], stats["saved_tensors_stored"]) == (4, 4)
    assert_drained(arena)


@pytest.mark.parametrize("policy, kwargs, match", [
    ([torch.ops.aten.mm], {}, "OpOverloads"),
    (3, {}, "a policy function or a list"),
    (spillarena.ATTENTION_OPS, {"context_fn": lambda: None}, "policy= and context_fn"),
    (spillarena.ATTENTION_OPS, {"use_reentrant": True}, "reentrant form takes no context_fn"),
])
def test_enable_refuses_a_bad_policy_and_leaves_the_model_as_it_was(arena, policy, kwargs, match):
    model = llama()
    with pytest.raises(spillarena.InvalidArgumentError, match=match):
        spillarena.enable(model, arena, policy=policy, **kwargs)
    assert spillarena.arena_of(model) is None and not model.is_activation_checkpointing
    with pytest.raises(spillarena.InvalidArgumentError, match="an AutomaticArena or None"):
        spillarena.enable(model, spillarena.make_in_memory_stash(), policy=spillarena.ATTENTION_OPS)
    assert spillarena.arena_of(model) is None


def test_bf16_under_autocast_is_bitwise_as_torchs(arena):
    ours_fn = functools.partial(spillarena.selective_checkpoint_contexts, attention_policy,
                                arena=arena)
    ours = two_steps(llama, ("spillarena", ours_fn, arena), dtype=torch.bfloat16)
    assert_as_torch(ours, two_steps(llama, ("transformers", torchs(attention_policy)),
                                    dtype=torch.bfloat16),
                    two_steps(llama, None, dtype=torch.bfloat16), case="llama-bf16")
    assert_drained(arena)


# ---------------------------------------------------------------------------------------------
# The offloaded op runs once per step
# ---------------------------------------------------------------------------------------------

RUNS = {"count": 0}


@torch.library.custom_op("spillarena_test::counted_tanh", mutates_args=())
def counted_tanh(x: torch.Tensor) -> torch.Tensor:
    RUNS["count"] += 1
    return torch.tanh(x)


@counted_tanh.register_fake
def _(x):
    return torch.empty_like(x)


def _counted_tanh_backward(ctx, grad):
    (y,) = ctx.saved_tensors
    return grad * (1 - y * y)


def _counted_tanh_setup(ctx, inputs, output):
    ctx.save_for_backward(output)


counted_tanh.register_autograd(_counted_tanh_backward, setup_context=_counted_tanh_setup)
COUNTED = torch.ops.spillarena_test.counted_tanh.default


def layer(x, w):
    return counted_tanh(x @ w) + x


@pytest.mark.parametrize("policy, runs", [(CheckpointPolicy.MUST_CPU_OFFLOAD, 1),
                                          (CheckpointPolicy.PREFER_RECOMPUTE, 2)])
def test_an_offloaded_op_runs_once_per_step_a_recomputed_one_twice(arena, policy, runs):
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(32, 64, requires_grad=True)

    def policy_fn(ctx, op, *args, **kwargs):
        return policy if op is COUNTED else CheckpointPolicy.PREFER_RECOMPUTE

    RUNS["count"] = 0
    context_fn = functools.partial(spillarena.selective_checkpoint_contexts, policy_fn,
                                   arena=arena)
    out = spillarena.checkpoint(layer, x, w, arena=arena, context_fn=context_fn)
    out.sum().backward()
    assert RUNS["count"] == runs
    # the layer input, and apart the op's output where offloaded
    stats = arena.stash_stats()
    assert (stats["inputs_stored"], stats["saved_tensors_stored"]) == (1, 1 if runs == 1 else 0)
    ours = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    torch.utils.checkpoint.checkpoint(layer, x, w, use_reentrant=False).sum().backward()
    assert_as_torch(ours, (x.grad, w.grad))
    assert_drained(arena)


def test_a_list_of_ops_offloads_those_and_recomputes_the_rest(arena):
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(32, 64, requires_grad=True)
    RUNS["count"] = 0
    context_fn = functools.partial(spillarena.selective_checkpoint_contexts, [COUNTED],
                                   arena=arena)
    spillarena.checkpoint(layer, x, w, arena=arena, context_fn=context_fn).sum().backward()
    assert RUNS["count"] == 1
    assert_drained(arena)


def test_a_full_disk_mid_step_keeps_the_outputs_in_memory_and_the_step_trains(small_disk):
    # A 16 MiB file system and an arena of 1 MiB that may grow: the outputs find no room, the
    # grows find the disk full, and what found no room stays in memory.
    arena = spillarena.SpillArena(1 << 20, small_disk, keep_last=0)
    w = torch.randn(512, 512, requires_grad=True)

    def policy_fn(ctx, op, *args, **kwargs):
        return (CheckpointPolicy.MUST_CPU_OFFLOAD if op is COUNTED else
                CheckpointPolicy.PREFER_RECOMPUTE)

    def step(checkpoint, context_fn):
        torch.manual_seed(3)
        h = torch.randn(1024, 512, requires_grad=True)
        out = h
        for _ in range(6):
            out = checkpoint(layer, out, w, context_fn=context_fn)
        out.sum().backward()
        grads = (h.grad.clone(), w.grad.clone())
        w.grad = None
        return grads

    ours_fn = functools.partial(spillarena.selective_checkpoint_contexts, policy_fn, arena=arena)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = step(functools.partial(spillarena.checkpoint, arena=arena), ours_fn)
    assert any(issubclass(c.category, spillarena.SpillArenaWarning) for c in caught)
    theirs = step(functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False),
                  torchs(policy_fn))
    assert_as_torch(ours, theirs)
    assert_drained(arena)


def test_a_layer_that_raises_leaves_the_arena_drained_and_usable(arena):
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(32, 64, requires_grad=True)

    def failing(x, w):
        counted_tanh(x @ w)
        raise ValueError("the layer failed")

    context_fn = functools.partial(spillarena.selective_checkpoint_contexts, [COUNTED],
                                   arena=arena)
    with pytest.raises(ValueError, match="the layer failed"):
        spillarena.checkpoint(failing, x, w, arena=arena, context_fn=context_fn)
    gc.collect()
    assert_drained(arena)
    spillarena.checkpoint(layer, x, w, arena=arena, context_fn=context_fn).sum().backward()
    assert_drained(arena)


# ---------------------------------------------------------------------------------------------
# What it refuses
# ---------------------------------------------------------------------------------------------

def _run(arena, policy_fn, fn=layer):
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(32, 64, requires_grad=True)
    context_fn = functools.partial(spillarena.selective_checkpoint_contexts, policy_fn,
                                   arena=arena)
    return spillarena.checkpoint(fn, x, w, arena=arena, context_fn=context_fn)


def test_a_policy_that_returns_no_policy_is_refused_naming_what_it_returned(arena):
    with pytest.raises(spillarena.InvalidArgumentError, match="the policy returned 'save'"):
        _run(arena, lambda ctx, op, *a, **k: "save")
    gc.collect()
    assert_drained(arena)
    _run(arena, [COUNTED]).sum().backward()  # the arena still usable
    assert_drained(arena)


def test_a_policy_that_raises_raises_as_itself(arena):
    def policy_fn(ctx, op, *args, **kwargs):
        raise KeyError("the policy's own bug")

    with pytest.raises(KeyError, match="the policy's own bug"):
        _run(arena, policy_fn)
    gc.collect()
    assert_drained(arena)


def test_offloading_an_op_without_a_tensor_output_is_refused(arena):
    scalar = torch.ops.aten._local_scalar_dense.default

    def policy_fn(ctx, op, *args, **kwargs):
        return (CheckpointPolicy.MUST_CPU_OFFLOAD if op is scalar
                else CheckpointPolicy.PREFER_RECOMPUTE)

    def reads_a_scalar(x, w):
        return x * (x @ w).sum().item()

    with pytest.raises(spillarena.InvalidArgumentError, match="holds no tensor"):
        _run(arena, policy_fn, reads_a_scalar)
    gc.collect()
    assert_drained(arena)


@pytest.mark.parametrize("bad", [-1, math.nan, 1 << 70, True])
def test_min_bytes_out_of_range_is_refused(arena, bad):
    with pytest.raises(spillarena.InvalidArgumentError, match="min_bytes must be an integer"):
        spillarena.selective_checkpoint_contexts([COUNTED], arena=arena, min_bytes=bad)


def test_allow_cache_entry_mutation_must_be_a_bool_and_an_empty_output_may_be_offloaded(arena):
    with pytest.raises(spillarena.InvalidArgumentError, match="must be True or False, got 'no'"):
        spillarena.selective_checkpoint_contexts([COUNTED], arena=arena,
                                                 allow_cache_entry_mutation="no")
    unbind = torch.ops.aten.unbind.int
    x = torch.randn(8, 4, requires_grad=True)
    context_fn = functools.partial(spillarena.selective_checkpoint_contexts, [unbind],
                                   arena=arena)
    out = spillarena.checkpoint(lambda x: sum(x[:, :0].unbind(1), (x * 2).sum()), x,
                                arena=arena, context_fn=context_fn)  # unbind returns []
    out.backward()
    assert torch.equal(x.grad, torch.full((8, 4), 2.0))
    assert_drained(arena)


def test_ops_must_be_overloads_and_the_policy_a_function_or_list(arena):
    with pytest.raises(spillarena.InvalidArgumentError, match="OpOverloads"):
        spillarena.selective_checkpoint_contexts([torch.ops.aten.mm], arena=arena)
    with pytest.raises(spillarena.InvalidArgumentError, match="a policy function or a list"):
        spillarena.selective_checkpoint_contexts(3, arena=arena)
    with pytest.raises(spillarena.InvalidArgumentError, match="an AutomaticArena or None"):
        spillarena.selective_checkpoint_contexts([COUNTED],
                                                 arena=spillarena.make_in_memory_stash())


def test_the_reentrant_form_refuses_a_policy_as_torch_refuses_context_fn(arena):
    context_fn = functools.partial(spillarena.selective_checkpoint_contexts, [COUNTED],
                                   arena=arena)
    x = torch.randn(4, 64, requires_grad=True)
    with pytest.raises(spillarena.InvalidArgumentError, match="context_fn"):
        spillarena.checkpoint(layer, x, torch.randn(64, 64), arena=arena, use_reentrant=True,
                              context_fn=context_fn)
    assert_drained(arena)


def test_a_compiled_function_inside_the_layer_is_still_compiled(arena):
    # as under torch's own selective checkpoint: the modes leave compile internals alone
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    inner = torch.compile(lambda t: t.sin() * 2, backend=backend)
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(32, 64, requires_grad=True)
    context_fn = functools.partial(spillarena.selective_checkpoint_contexts, [COUNTED],
                                   arena=arena)
    out = torch.utils.checkpoint.checkpoint(lambda x, w: inner(counted_tanh(x @ w)), x, w,
                                            use_reentrant=False, context_fn=context_fn)
    out.sum().backward()
    assert graphs  # dynamo traced the inner function under the caching mode
    assert_drained(arena)


def test_an_offloaded_output_changed_in_place_later_raises_instead_of_training_wrong(arena):
    mul = torch.ops.aten.mul.Tensor

    def layer(x):
        h = x * 2
        h.mul_(3)  # the offloaded output, changed after the forward stored it
        return h.sin()

    def policy_fn(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_CPU_OFFLOAD if op is mul else \
            CheckpointPolicy.PREFER_RECOMPUTE

    context_fn = functools.partial(spillarena.selective_checkpoint_contexts, policy_fn,
                                   arena=arena)
    x = torch.randn(256, 256, requires_grad=True)
    out = spillarena.checkpoint(layer, x, arena=arena, context_fn=context_fn)
    with pytest.raises(RuntimeError, match="the stashed offloaded op output of shape"):
        out.sum().backward()
    del out
    gc.collect()
    assert_drained(arena)
