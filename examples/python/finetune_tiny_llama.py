"""Fine-tunes a tiny Llama (random weights, nothing downloaded) on the bundled text with
transformers' Trainer, its layer inputs spilled to a disk arena; prints memory and spill stats.

    pip install .                               # from the repository root (torch >= 2.11)
    pip install transformers accelerate
    python examples/python/finetune_tiny_llama.py --mode spillarena --spill-dir /var/tmp
    python examples/python/finetune_tiny_llama.py --mode transformers   # their checkpointing
    python examples/python/finetune_tiny_llama.py --mode none           # no checkpointing

Byte-level tokens (a 256-symbol vocabulary), so no tokenizer is needed either.
"""

import argparse
import pathlib
import resource
import tempfile
import time

import torch
import transformers

import spillarena

TEXT = pathlib.Path(__file__).resolve().parents[2] / "data" / "kjv-genesis-exodus.txt"


class ByteBlocks(torch.utils.data.Dataset):
    """Byte ids (a 256-symbol vocabulary: no tokenizer to download) cut into blocks of seq;
    each block is its own label. tests/python/test_trainer.py trains on it too."""

    def __init__(self, ids, seq):
        self.blocks = ids[: len(ids) // seq * seq].view(-1, seq)

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, i):
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


class StepTimer(transformers.TrainerCallback):
    def __init__(self):
        self.times = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self.start)


def text_ids():
    return torch.tensor(list(TEXT.read_bytes()), dtype=torch.long)


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["none", "transformers", "spillarena"],
                        default="spillarena")
    parser.add_argument("--spill-dir", default=None,
                        help="default: spillarena.default_spill_directory()")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=max(1, args.hidden // 64),
        max_position_embeddings=args.seq, attention_dropout=0.1)
    model = transformers.LlamaForCausalLM(config)

    arena = None
    if args.mode == "spillarena":
        shape = (args.batch, args.seq, args.hidden)
        capacity = spillarena.bytes_for_layer_inputs(args.layers, shape, torch.float32)
        arena = spillarena.SpillArena(capacity, args.spill_dir)
        # Trainer's own checkpointing stays off (TrainingArguments below); enable() plugs the
        # arena into the model's layers through transformers' _set_gradient_checkpointing.
        spillarena.enable(model, arena)
        print(f"arena: {arena}")

    timer = StepTimer()
    with tempfile.TemporaryDirectory() as output_dir:
        training_args = transformers.TrainingArguments(
            output_dir=output_dir, activation_checkpointing=args.mode == "transformers",
            max_steps=args.steps, per_device_train_batch_size=args.batch, learning_rate=1e-3,
            logging_steps=max(1, args.steps // 5), save_strategy="no", report_to="none",
            use_cpu=True, seed=0, disable_tqdm=True)
        trainer = transformers.Trainer(model=model, args=training_args,
                                       train_dataset=ByteBlocks(text_ids(), args.seq),
                                       callbacks=[timer])
        result = trainer.train()

    steady = timer.times[1:] or timer.times
    print(f"mode={args.mode} layers={args.layers} batch={args.batch} seq={args.seq} "
          f"hidden={args.hidden} threads={torch.get_num_threads()}")
    print(f"final loss {result.training_loss:.4f}; "
          f"step time {1000 * sum(steady) / len(steady):.0f} ms "
          f"(mean of steps 2..{len(timer.times)}); peak RSS {peak_rss_mib():.0f} MiB")
    if arena is not None:
        stats = {**arena.stats(), **arena.stash_stats()}
        print("spill: " + ", ".join(f"{k}={stats[k]}" for k in (
            "capacity_bytes", "peak_bytes_in_use", "allocations", "reuse_hits", "bytes_written",
            "bytes_read", "io_mode", "io_backend", "restores", "prefetch_hits")))


if __name__ == "__main__":
    main()
