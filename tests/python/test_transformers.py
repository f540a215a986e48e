"""spillarena with Hugging Face transformers models built from tiny configs (random weights):
bitwise as transformers' own non-reentrant checkpointing, and as no checkpointing where that one
is in the same run (conftest.assert_as_torch)."""

import pytest
import torch

import spillarena
from conftest import assert_as_torch, assert_drained

transformers = pytest.importorskip("transformers")

LAYERS = 3
BATCH, SEQ = 2, 16


# The sizes Llama-style configs share (Llama, Qwen2).
LLAMA_LIKE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  attention_dropout=0.2)


def with_attention(config, implementation):
    config._attn_implementation = implementation
    return config


def tiny_llama():
    config = transformers.LlamaConfig(**LLAMA_LIKE, tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(with_attention(config, "eager"))


def tiny_gpt2():
    config = transformers.GPT2Config(
        vocab_size=256, n_positions=64, n_embd=64, n_layer=LAYERS, n_head=4,
        attn_pdrop=0.2, resid_pdrop=0.1, embd_pdrop=0.1)
    return transformers.GPT2LMHeadModel(with_attention(config, "eager"))


def tiny_qwen2():
    config = transformers.Qwen2Config(**LLAMA_LIKE, use_sliding_window=False)
    return transformers.Qwen2ForCausalLM(with_attention(config, "sdpa"))


# transformers' own checkpointing in the form spillarena's default has.
NON_REENTRANT = {"activation_checkpointing_kwargs": {"use_reentrant": False}}


def step(model, seed):
    """One training step's loss and every parameter gradient, under a fixed RNG seed."""
    model.zero_grad(set_to_none=True)
    generator = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, 256, (BATCH, SEQ), generator=generator)
    torch.manual_seed(seed)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def built(build):
    torch.manual_seed(0)
    return build().train()


@pytest.mark.parametrize("build", [tiny_llama, tiny_gpt2, tiny_qwen2],
                         ids=["llama", "gpt2", "qwen2-sdpa"])
def test_loss_and_every_gradient_are_bit_identical_to_transformers_checkpointing(build,
                                                                                  spill_dir):
    plain = step(built(build), seed=7)
    torchs = built(build)
    torchs.activation_checkpointing_enable(**NON_REENTRANT)
    torchs = step(torchs, seed=7)

    model = built(build)
    arena = spillarena.SpillArena(16 << 20, spill_dir, keep_last=0)
    spillarena.enable(model, arena)
    assert model.is_activation_checkpointing
    before = {**arena.stats(), **arena.stash_stats()}
    loss, grads = step(model, seed=7)
    after = {**arena.stats(), **arena.stash_stats()}

    assert_as_torch((loss, grads), torchs, plain)
    assert len(grads) == len(list(model.parameters()))
    # Every decoder layer stored its input in the arena and restored it in backward.
    hidden_bytes = BATCH * SEQ * 64 * 4
    assert after["allocations"] - before["allocations"] == LAYERS
    assert after["restores"] - before["restores"] == LAYERS
    assert after["bytes_written"] - before["bytes_written"] == LAYERS * hidden_bytes
    assert after["peak_bytes_in_use"] >= LAYERS * hidden_bytes
    assert_drained(arena)

    # Dropout really was on: another seed gives another loss.
    other_loss, _ = step(model, seed=8)
    assert not torch.equal(other_loss, loss)
    spillarena.disable(model)
    assert not model.is_activation_checkpointing
    assert_drained(arena)


def test_every_n_layers_spills_only_those_layers(spill_dir):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=4, num_attention_heads=2)).train()
    arena = spillarena.SpillArena(8 << 20, spill_dir, keep_last=0)
    spillarena.enable(model, arena, every_n_layers=2)
    step(model, seed=1)
    assert arena.stats()["allocations"] == 2
    assert_drained(arena)


def test_lora_style_frozen_base_still_gets_adapter_gradients(spill_dir):
    # PEFT/LoRA: the base (embeddings included) is frozen, only small adapters train. The layer
    # inputs then do not require grad; the adapters must still get the gradients they get
    # under transformers' own checkpointing.
    def frozen_but_adapters():
        model = built(tiny_llama)
        for p in model.parameters():
            p.requires_grad_(False)
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.requires_grad_(True)
        return model

    plain = step(frozen_but_adapters(), seed=3)
    torchs = frozen_but_adapters()
    torchs.activation_checkpointing_enable(**NON_REENTRANT)
    torchs = step(torchs, seed=3)

    arena = spillarena.SpillArena(16 << 20, spill_dir, keep_last=0)
    loss, grads = step(spillarena.enable(frozen_but_adapters(), arena), seed=3)
    assert_as_torch((loss, grads), torchs, plain)
    assert len(grads) == LAYERS and all("q_proj" in name for name in grads)
    assert_drained(arena)


def test_enable_refuses_a_model_without_gradient_checkpointing(spill_dir):
    arena = spillarena.SpillArena(1 << 20, spill_dir)

    class NoCheckpointing(transformers.PreTrainedModel):
        config_class = transformers.PretrainedConfig
        supports_gradient_checkpointing = False

        def __init__(self, config):
            super().__init__(config)
            self.linear = torch.nn.Linear(4, 4)

    model = NoCheckpointing(transformers.PretrainedConfig())
    with pytest.raises(spillarena.InvalidArgumentError,
                       match="does not support gradient checkpointing"):
        spillarena.enable(model, arena)
    with pytest.raises(ValueError):  # InvalidArgumentError is a ValueError too
        spillarena.enable(torch.nn.Linear(2, 2), arena)
    with pytest.raises(spillarena.InvalidArgumentError, match="arena"):
        spillarena.enable(tiny_llama(), arena="not an arena")
    with pytest.raises(spillarena.InvalidArgumentError, match="every_n_layers"):
        spillarena.enable(tiny_llama(), arena, every_n_layers=0)
    # An arena option passed to enable() would reach the layers' forward(**kwargs) and vanish.
    with pytest.raises(spillarena.InvalidArgumentError, match="keep_last"):
        spillarena.enable(tiny_llama(), arena, keep_last=0)


# ---------------------------------------------------------------------------------------------
# Both checkpointings asked for (Note [Who wins when both checkpointings are asked for])
# ---------------------------------------------------------------------------------------------


def spilled_layers(model, arena):
    """How many layer inputs one training step stores in the arena."""
    before = arena.stats()["allocations"]
    step(model, seed=1)
    return arena.stats()["allocations"] - before


def test_transformers_checkpointing_after_enable_is_an_error_and_the_spill_stays(spill_dir):
    arena = spillarena.SpillArena(16 << 20, spill_dir, keep_last=0)
    model = spillarena.enable(tiny_llama().train(), arena)
    with pytest.raises(spillarena.InvalidArgumentError, match=r"spillarena.disable"):
        model.activation_checkpointing_enable()
    with pytest.raises(spillarena.InvalidArgumentError, match="TrainingArguments"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert spilled_layers(model, arena) == LAYERS  # not switched back to in-RAM checkpointing
    assert_drained(arena)


@pytest.mark.parametrize("argument", ["activation_checkpointing", "gradient_checkpointing"])
def test_trainer_with_checkpointing_on_refuses_an_enabled_model_before_the_first_step(
        argument, spill_dir, tmp_path):
    arena = spillarena.SpillArena(16 << 20, spill_dir, keep_last=0)
    model = spillarena.enable(tiny_llama(), arena)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=BATCH, report_to="none",
        use_cpu=True, save_strategy="no", disable_tqdm=True, **{argument: True})
    ids = torch.randint(0, 256, (4, SEQ))
    dataset = [{"input_ids": row, "labels": row} for row in ids]
    trainer = transformers.Trainer(model=model, args=args, train_dataset=dataset)
    with pytest.raises(spillarena.InvalidArgumentError, match="activation_checkpointing"):
        trainer.train()
    assert trainer.state.global_step == 0
    assert arena.stats()["allocations"] == 0  # no forward ran
    assert spilled_layers(model, arena) == LAYERS
    assert_drained(arena)


def test_enable_after_transformers_checkpointing_takes_the_layers_over(spill_dir):
    model = built(tiny_llama)
    model.activation_checkpointing_enable(**NON_REENTRANT)  # the form ours has: the same floats
    torchs = step(model, seed=5)
    arena = spillarena.SpillArena(16 << 20, spill_dir, keep_last=0)
    spillarena.enable(model, arena)  # the later call wins
    ours = step(model, seed=5)
    assert arena.stats()["allocations"] == LAYERS
    assert_as_torch(ours, torchs)
    assert_drained(arena)


def test_transformers_disable_then_enable_pauses_and_resumes_the_spill(spill_dir):
    # As TRL's unwrap_model_for_generation does around generate(): off, then on again.
    arena = spillarena.SpillArena(16 << 20, spill_dir, keep_last=0)
    model = spillarena.enable(tiny_llama().train(), arena)
    model.gradient_checkpointing_disable()
    assert not model.is_activation_checkpointing
    assert spilled_layers(model, arena) == 0
    with pytest.raises(spillarena.InvalidArgumentError, match="already enabled"):
        spillarena.enable(model, arena)  # still spillarena's until spillarena.disable
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    assert spilled_layers(model, arena) == LAYERS  # the arena again, not torch's checkpoint
    spillarena.disable(model)
    # The user's own choice now: transformers' checkpointing.
    model.activation_checkpointing_enable()
    assert model.is_activation_checkpointing and spilled_layers(model, arena) == 0
    assert_drained(arena)


@pytest.mark.parametrize("given", [True, False], ids=["spill-arena", "automatic-arena"])
def test_arena_of_names_the_arena_while_transformers_checkpointing_is_paused(given, spill_dir):
    arena = spillarena.SpillArena(16 << 20, spill_dir, keep_last=0) if given else None
    model = spillarena.enable(tiny_llama().train(), arena)
    enabled = spillarena.arena_of(model)
    assert enabled is arena if given else isinstance(enabled, spillarena.AutomaticArena)
    model.gradient_checkpointing_disable()  # paused: still spillarena's
    assert spillarena.arena_of(model) is enabled
    model.gradient_checkpointing_enable()
    assert spillarena.arena_of(model) is enabled
    model.activation_checkpointing_disable()
    spillarena.disable(model)
    assert spillarena.arena_of(model) is None


def test_enable_twice_is_an_error_until_disable(spill_dir):
    arena = spillarena.SpillArena(16 << 20, spill_dir, keep_last=0)
    other = spillarena.SpillArena(16 << 20, spill_dir, keep_last=0)
    model = spillarena.enable(tiny_llama().train(), arena)
    with pytest.raises(spillarena.InvalidArgumentError,
                       match=r"already enabled.*spillarena.disable"):
        spillarena.enable(model, other)
    with pytest.raises(spillarena.InvalidArgumentError, match="already enabled"):
        spillarena.enable(model, arena, every_n_layers=2)
    assert spilled_layers(model, arena) == LAYERS and other.stats()["allocations"] == 0
    spillarena.enable(spillarena.disable(model), other)
    assert spilled_layers(model, other) == LAYERS
    assert_drained(arena)
    assert_drained(other)


def test_enable_after_torch_compile_is_an_error(spill_dir):
    arena = spillarena.SpillArena(1 << 20, spill_dir)
    model = tiny_llama()
    with pytest.raises(spillarena.InvalidArgumentError,
                       match=r"enable.*first and torch.compile afterwards"):
        spillarena.enable(torch.compile(model), arena)
    model.compile()  # in place
    with pytest.raises(spillarena.InvalidArgumentError, match="already compiled"):
        spillarena.enable(model, arena)
    model = tiny_llama()
    model.model.layers[1].compile()
    with pytest.raises(spillarena.InvalidArgumentError, match=r"model.layers.1"):
        spillarena.enable(model, arena)
    assert not model.is_activation_checkpointing  # nothing was changed
