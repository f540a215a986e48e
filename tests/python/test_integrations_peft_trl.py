"""spillarena with PEFT LoRA and TRL's SFTTrainer, each against transformers' own checkpointing in
the form spillarena's default has (non-reentrant): a few training steps, losses and adapter
weights bit-identical."""

import pytest
import torch

import spillarena
from conftest import assert_as_torch, assert_drained, bundled_text_ids
from test_transformers import LAYERS, tiny_llama

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

STEPS, BATCH, SEQ = 3, 2, 16


def lora_llama():
    torch.manual_seed(0)
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1,
                             target_modules=["q_proj", "v_proj"])
    return peft.get_peft_model(tiny_llama(), config).train()


def adapters(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def train_steps(model):
    """STEPS AdamW steps on byte ids; every step's loss, then the adapters."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = bundled_text_ids(max_bytes=STEPS * BATCH * SEQ).view(STEPS, BATCH, SEQ)
    torch.manual_seed(11)  # LoRA and attention dropout draw from here
    losses = []
    for batch in ids:
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return torch.stack(losses), adapters(model)


def test_peft_lora_trains_as_with_transformers_checkpointing(spill_dir):
    reference = lora_llama()
    # PeftModel passes it to the transformers model.
    reference.activation_checkpointing_enable(
        activation_checkpointing_kwargs={"use_reentrant": False})
    ref_losses, ref_adapters = train_steps(reference)

    arena = spillarena.SpillArena(16 << 20, spill_dir, keep_last=0)
    model = spillarena.enable(lora_llama(), arena)  # the PeftModel itself
    assert model.is_activation_checkpointing
    losses, trained = train_steps(model)

    assert_as_torch((losses, trained), (ref_losses, ref_adapters))
    assert trained and all("lora_" in n for n in trained)
    assert arena.stats()["allocations"] == STEPS * LAYERS
    # The guard is on the wrapper and on the base model both (Trainer calls the wrapper).
    for holder in (model, model.get_base_model()):
        with pytest.raises(spillarena.InvalidArgumentError, match=r"spillarena.disable"):
            holder.activation_checkpointing_enable()
    spillarena.disable(model)
    assert not model.is_activation_checkpointing
    assert_drained(arena)


# ---------------------------------------------------------------------------------------------
# TRL
# ---------------------------------------------------------------------------------------------


def byte_tokenizer():
    """A word-level tokenizer over the bundled text's words, built here (no hub)."""
    tokenizers = pytest.importorskip("tokenizers")
    text = bundled_text_ids(max_bytes=16 * 1024).numpy().tobytes().decode("utf-8", "replace")
    words = text.split()
    vocab = {"<pad>": 0, "<unk>": 1, "<s>": 2, "</s>": 3}
    for word in words:
        if len(vocab) < 256:
            vocab.setdefault(word, len(vocab))
    core = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>",
                                                unk_token="<unk>", bos_token="<s>",
                                                eos_token="</s>")


def text_dataset():
    datasets = pytest.importorskip("datasets")
    text = bundled_text_ids(max_bytes=16 * 1024).numpy().tobytes().decode("utf-8", "replace")
    lines = text.splitlines()
    return datasets.Dataset.from_list([{"text": line} for line in lines
                                       if len(line.split()) > 8][:16])



def sft_train(tmp_path, model, gradient_checkpointing):
    trl = pytest.importorskip("trl")

    class LossRecordingSFTTrainer(trl.SFTTrainer):
        def compute_loss(self, model, inputs, *args, **kwargs):
            loss = super().compute_loss(model, inputs, *args, **kwargs)
            self.losses.append((loss[0] if isinstance(loss, tuple) else loss).detach().clone())
            return loss

    # transformers' own checkpointing in the form spillarena's default has, whatever the default
    kwargs = {"use_reentrant": False} if gradient_checkpointing else None
    args = trl.SFTConfig(output_dir=str(tmp_path / f"sft-{gradient_checkpointing}"),
                         gradient_checkpointing=gradient_checkpointing,
                         gradient_checkpointing_kwargs=kwargs, max_steps=STEPS,
                         per_device_train_batch_size=BATCH, learning_rate=1e-2, max_length=SEQ,
                         logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
                         seed=0, dataloader_num_workers=0, disable_tqdm=True)
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1,
                             target_modules=["q_proj", "v_proj"])
    trainer = LossRecordingSFTTrainer(model=model, args=args, train_dataset=text_dataset(),
                                      processing_class=byte_tokenizer(), peft_config=config)
    trainer.losses = []
    return trainer


def test_trl_sft_trainer_with_lora_matches_its_own_checkpointing_step_for_step(tmp_path, spill_dir):
    torch.manual_seed(0)
    reference = sft_train(tmp_path, tiny_llama(), gradient_checkpointing=True)
    reference.train()
    ref_losses = torch.stack(reference.losses)

    arena = spillarena.SpillArena(16 << 20, spill_dir, keep_last=0)
    torch.manual_seed(0)
    model = spillarena.enable(tiny_llama(), arena)  # before SFTTrainer wraps it in LoRA
    # SFTConfig's default is True.
    trainer = sft_train(tmp_path, model, gradient_checkpointing=False)
    trainer.train()
    losses = torch.stack(trainer.losses)

    assert len(losses) == len(ref_losses) == STEPS
    assert torch.equal(losses, ref_losses), (losses, ref_losses)
    assert arena.stats()["allocations"] == STEPS * LAYERS
    assert_drained(arena)

    # SFTConfig's default (gradient_checkpointing=True) on an enabled model: an error before step 1.
    torch.manual_seed(0)
    again = sft_train(tmp_path, spillarena.enable(tiny_llama(), arena), gradient_checkpointing=True)
    with pytest.raises(spillarena.InvalidArgumentError, match="SFTConfig"):
        again.train()
    assert again.state.global_step == 0 and arena.stats()["allocations"] == STEPS * LAYERS
