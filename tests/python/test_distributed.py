"""Two ranks on CPU (gloo), each with its own arena: DDP and FSDP2 through spillarena, by
spillarena.enable and by torch's
apply_activation_checkpointing(checkpoint_fn=spillarena.checkpoint). Each rank's gradients are
those of torch's own checkpointing in the same wrappers, and of no checkpointing where torch's own
are (conftest.assert_as_torch)."""

import faulthandler
import functools
import os
import pathlib
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import spillarena
from conftest import assert_as_torch

transformers = pytest.importorskip("transformers")

WORLD = 2


def tiny_llama():
    torch.manual_seed(0)  # the same weights on every rank
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, attention_dropout=0.2)
    config._attn_implementation = "eager"
    return transformers.LlamaForCausalLM(config).train()


def one_step(model, rank):
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(100 + rank))
    torch.manual_seed(10 + rank)  # each rank its own dropout masks
    model(input_ids=ids, labels=ids).loss.backward()


def gradients(module):
    return {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}


def checkpoint_layers(model, **checkpoint_fn):
    """torch's own recipe: every decoder layer in a CheckpointWrapper (before fully_shard).

    transformers turns the KV cache off only under its own checkpointing; behind a wrapper the
    recompute would append to the cache a second time, so it is turned off here."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    model.config.use_cache = False
    apply_activation_checkpointing(
        model, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, **checkpoint_fn),
        check_fn=lambda module: isinstance(
            module, transformers.models.llama.modeling_llama.LlamaDecoderLayer))
    return model


def leave_without_finalizing():
    """Ends a rank whose results are written, skipping the interpreter's finalization. gloo's
    worker thread (ProcessGroupGloo::runLoop) may still destroy a finished work object holding
    Python tensors then; its GIL acquire during finalization ends the thread by forced unwind
    through a noexcept frame: std::terminate, "terminate called without an active exception",
    SIGABRT (a core of this test's rank, 2026-12-07; torch's bug, pytorch/pytorch PR 179291).
    Our own exit path is tested where it is ours (test_device_copies, test_offload_lifecycle)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_rank(rank, init_file, spill_root, out_dir, wrap, checkpointing="enable"):
    # A rank that dies of a signal prints every thread's Python stack first.
    faulthandler.enable(all_threads=True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        spill_dir = pathlib.Path(spill_root) / f"rank{rank}"
        spill_dir.mkdir()
        arena = spillarena.SpillArena(8 << 20, spill_dir, keep_last=0)  # one arena per rank

        def reference(checkpoint):
            model = tiny_llama()
            if checkpoint and checkpointing == "wrapper":
                checkpoint_layers(model)  # torch's checkpoint in the same wrappers
            elif checkpoint:
                model.activation_checkpointing_enable(
                    activation_checkpointing_kwargs={"use_reentrant": False})
            one_step(wrap(model), rank)
            return gradients(model)

        plain, torchs = reference(checkpoint=False), reference(checkpoint=True)
        checkpointed = tiny_llama()
        if checkpointing == "wrapper":
            checkpoint_layers(checkpointed, checkpoint_fn=spillarena.checkpoint, arena=arena)
        else:
            spillarena.enable(checkpointed, arena)
        wrapped = wrap(checkpointed)
        one_step(wrapped, rank)
        result = gradients(checkpointed)

        stats = arena.stats()
        torch.save({"plain": {n: full(g) for n, g in plain.items()},
                    "torchs": {n: full(g) for n, g in torchs.items()},
                    "result": {n: full(g) for n, g in result.items()},
                    "stats": stats, "files": sorted(os.listdir(spill_dir))},
                   pathlib.Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    leave_without_finalizing()


def full(grad):
    # FSDP2 gradients are DTensor shards; gather them for the comparison.
    return grad.full_tensor() if hasattr(grad, "full_tensor") else grad


def ddp(model):
    return torch.nn.parallel.DistributedDataParallel(model)


def fsdp2(model):
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer)
    return fully_shard(model)


def spawn(tmp_path, wrap, checkpointing="enable"):
    spill_root = (pathlib.Path(spillarena.default_spill_directory())
                  / f"spillarena-dist-{os.getpid()}")
    spill_root.mkdir()
    try:
        mp.spawn(run_rank,
                 args=(str(tmp_path / "init"), str(spill_root), str(tmp_path), wrap, checkpointing),
                 nprocs=WORLD, join=True)
        assert sorted(p.name for p in spill_root.iterdir()) == ["rank0", "rank1"]
    finally:
        for rank_dir in spill_root.iterdir():
            rank_dir.rmdir()  # fails if a rank left a file
        spill_root.rmdir()
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def unwrapped(grads):
    """Gradients by the names they have without torch's CheckpointWrapper around each layer."""
    return {n.replace("._checkpoint_wrapped_module", ""): g for n, g in grads.items()}


def check(results):
    for rank, out in enumerate(results):
        assert out["files"] == [], f"rank {rank} left files"
        assert out["result"]
        assert_as_torch(*(unwrapped(out[k]) for k in ("result", "torchs", "plain")),
                        case=f"rank {rank}")
        assert out["stats"]["allocations"] == 2 and out["stats"]["live_regions"] == 0
    # After the all-reduce every rank holds the same gradients.
    for name, grad in results[0]["result"].items():
        assert torch.equal(results[1]["result"][name], grad), name


def test_ddp_gradients_after_all_reduce_are_bit_identical(tmp_path):
    check(spawn(tmp_path, ddp))


def test_fsdp2_gradients_are_bit_identical(tmp_path):
    pytest.importorskip("torch.distributed.fsdp")
    check(spawn(tmp_path, fsdp2))


def test_fsdp2_with_torch_checkpoint_wrapper_around_spillarena_is_bit_identical_to_torch_checkpoint(
        tmp_path):
    # apply_activation_checkpointing(checkpoint_fn=spillarena.checkpoint, arena=arena), then
    # fully_shard on each wrapper: the reference is the same recipe with torch's own checkpoint.
    pytest.importorskip("torch.distributed.fsdp")
    results = spawn(tmp_path, fsdp2, checkpointing="wrapper")
    check(results)
    assert all("_checkpoint_wrapped_module" in name for name in results[0]["result"]
               if ".layers." in name)
