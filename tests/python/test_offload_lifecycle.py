"""spillarena.offload and the offload policy across a fork and at interpreter exit, as layer
inputs behave there (issue 51: "same fork and interpreter-exit behaviour"): a forked child
offloads to an arena of its own and is refused the parent's with the typed error; a process
that ends with offloaded tensors still in the arena ends in order."""

import os
import subprocess
import sys

import pytest
import torch

import spillarena
from conftest import wait_for_exit_code

transformers = pytest.importorskip("transformers")


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(),
                               torch.nn.Linear(256, 256))


def grads(model, context):
    model.zero_grad(set_to_none=True)
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    with context:
        loss = model(x).pow(2).mean()
    loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def test_a_forked_child_offloads_to_its_own_arena_and_is_refused_the_parents(tmp_path):
    model = mlp()
    parents = spillarena.SpillArena(64 << 20, str(tmp_path))
    reference = grads(model, torch.autograd.graph.save_on_cpu())
    assert all(torch.equal(a, b) for a, b in zip(grads(model, spillarena.offload(
        parents, min_bytes=4096)), reference))
    pid = os.fork()
    if pid == 0:  # the child: its verdict is its exit code, and nothing of pytest runs here
        code = 99
        try:
            torch.set_num_threads(1)
            childs = spillarena.SpillArena(64 << 20, str(tmp_path))
            own = grads(model, spillarena.offload(childs, min_bytes=4096))
            theirs = grads(model, torch.autograd.graph.save_on_cpu())  # this thread count's sums
            code = 2 if all(torch.equal(a, b) for a, b in zip(own, theirs)) else 1
            try:
                grads(model, spillarena.offload(parents, min_bytes=4096))
            except spillarena.errors.ForkedProcessError:
                code = 0 if code == 2 else code
        finally:
            os._exit(code)
    assert wait_for_exit_code(pid) == 0
    again = grads(model, spillarena.offload(parents, min_bytes=4096))  # the parent's still works
    assert all(torch.equal(a, b) for a, b in zip(again, reference))
    assert parents.stats()["live_regions"] == 0


EXIT_WITH_OFFLOADED_TENSORS = """
import functools, torch, spillarena
from torch.utils.checkpoint import CheckpointPolicy
arena = spillarena.SpillArena(64 << 20, ".")
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 256))
x = torch.randn(64, 256, requires_grad=True)
with spillarena.offload(arena, min_bytes=4096):
    kept = model(x).sum()            # its graph holds offloaded tensors, never backwarded
policy = functools.partial(spillarena.selective_checkpoint_contexts,
                           lambda ctx, op, *a, **k: CheckpointPolicy.MUST_CPU_OFFLOAD,
                           arena=arena)
also = spillarena.checkpoint(model, x, arena=arena, context_fn=policy).sum()
print("exiting", arena.stats()["live_regions"], flush=True)
"""


def test_exiting_with_offloaded_tensors_alive_is_an_orderly_exit(tmp_path):
    for _ in range(3):
        child = subprocess.run([sys.executable, "-c", EXIT_WITH_OFFLOADED_TENSORS],
                               capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
        live = int(child.stdout.split("exiting")[1])
        assert live > 0  # the exit really had tensors in the arena
        assert list(tmp_path.iterdir()) == []  # and the spill file went with the process
