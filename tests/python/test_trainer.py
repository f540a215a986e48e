"""A short transformers Trainer run on the bundled text, tiny Llama, with spillarena.enable."""

import sys

import pytest
import torch

import spillarena
from conftest import REPO, assert_drained, bundled_text_ids

transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(REPO / "examples" / "python"))
from finetune_tiny_llama import ByteBlocks  # noqa: E402  (the example's dataset, trained on here)

STEPS, BATCH, SEQ = 30, 4, 32


class LossRecordingTrainer(transformers.Trainer):
    """Keeps every step's loss unrounded (the log rounds to 4 digits)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.losses = []

    def compute_loss(self, model, inputs, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        self.losses.append((loss[0] if isinstance(loss, tuple) else loss).detach().clone())
        return loss


def train(tmp_path, transformers_checkpointing, arena=None):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
        attention_dropout=0.1)
    model = transformers.LlamaForCausalLM(config)
    if arena is not None:
        spillarena.enable(model, arena)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / ("hf" if transformers_checkpointing else "spill")),
        activation_checkpointing=transformers_checkpointing,
        # the form spillarena's default has, whatever transformers' own default
        activation_checkpointing_kwargs=({"use_reentrant": False} if transformers_checkpointing
                                         else None),
        max_steps=STEPS, per_device_train_batch_size=BATCH, learning_rate=3e-3, warmup_steps=0,
        logging_steps=10, save_strategy="no", report_to="none", use_cpu=True, seed=0,
        dataloader_num_workers=0, disable_tqdm=True)
    dataset = ByteBlocks(bundled_text_ids(max_bytes=64 * 1024), SEQ)
    trainer = LossRecordingTrainer(model=model, args=args, train_dataset=dataset)
    trainer.train()
    return torch.stack(trainer.losses)


def test_trainer_loss_falls_and_matches_transformers_checkpointing_step_for_step(
        tmp_path, spill_dir):
    reference = train(tmp_path, transformers_checkpointing=True)
    arena = spillarena.SpillArena(8 << 20, spill_dir, keep_last=0)
    spilled = train(tmp_path, transformers_checkpointing=False, arena=arena)

    assert len(spilled) == len(reference) == STEPS
    assert torch.equal(spilled, reference), (spilled - reference).abs().max()
    assert spilled[-5:].mean() < spilled[:5].mean() - 0.5  # from ~ln(256) = 5.5 down
    stats = arena.stats()
    assert stats["allocations"] == STEPS * 2  # every step, both layers
    assert stats["reuse_hits"] > 0  # the same regions serve every step
    assert_drained(arena)
