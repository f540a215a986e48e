"""DataLoader workers beside an arena: fork, spawn and forkserver workers never touch the arena,
and training through it goes on with the gradients of torch's own checkpoint (issue: fork safety;
Note [Arenas across fork])."""

import functools
import multiprocessing

import pytest
import torch

import spillarena
from conftest import assert_as_torch, assert_drained


class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        torch.manual_seed(i)
        return torch.randn(16, 32)


def step(weights, batch, checkpoint):
    x = batch.requires_grad_(True)
    for w in weights:
        x = (checkpoint(lambda t, w=w: torch.tanh(t @ w), x) if checkpoint
             else torch.tanh(x @ w))
    x.square().mean().backward()
    grads = [w.grad.clone() for w in weights]
    for w in weights:
        w.grad = None
    return grads


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_dataloader_workers_leave_the_arena_working(context, spill_dir):
    if context not in multiprocessing.get_all_start_methods():
        pytest.skip(f"{context} is not available here")
    torch.manual_seed(0)
    weights = [torch.randn(32, 32, requires_grad=True) for _ in range(4)]
    arena = spillarena.SpillArena(8 << 20, spill_dir, keep_last=0)
    spill = functools.partial(spillarena.checkpoint, arena=arena)
    torchs = functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)
    step(weights, torch.randn(2, 16, 32), spill)  # the arena's threads run before the workers start
    loader = torch.utils.data.DataLoader(Squares(), batch_size=2, num_workers=2,
                                         multiprocessing_context=context, timeout=120)
    for i, batch in enumerate(loader):
        assert_as_torch(step(weights, batch.clone(), spill), step(weights, batch.clone(), torchs),
                        step(weights, batch.clone(), None), case=f"batch {i}")
    assert arena.stats()["bytes_written"] > 0
    assert_drained(arena)
