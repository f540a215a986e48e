"""spillarena.offload and the offload policy across a fork and at interpreter exit, as layer
inputs behave there (issue 51: "same fork and interpreter-exit behaviour"): a forked child
offloads, and spills op outputs, to an arena of its own and is refused the parent's with the
typed error; a process that ends with offloaded tensors still in the arena ends in order."""

import functools
import os
import subprocess
import sys

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

import spillarena
from conftest import wait_for_exit_code


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


def gelu_offloaded(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_CPU_OFFLOAD if op is torch.ops.aten.gelu.default else \
        CheckpointPolicy.PREFER_RECOMPUTE


def gelu_saved(ctx, op, *args, **kwargs):
    """gelu_offloaded with offload read as save: what torch's own contexts take."""
    if gelu_offloaded(ctx, op, *args, **kwargs) == CheckpointPolicy.MUST_CPU_OFFLOAD:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def policy_grads(model, arena):
    """The MLP checkpointed with GELU's output offloaded (arena), or torch's own with it saved
    (arena None)."""
    model.zero_grad(set_to_none=True)
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(1), requires_grad=True)
    if arena is None:
        out = torch.utils.checkpoint.checkpoint(
            model, x, use_reentrant=False,
            context_fn=functools.partial(create_selective_checkpoint_contexts, gelu_saved))
    else:
        out = spillarena.checkpoint(model, x, arena=arena, context_fn=functools.partial(
            spillarena.selective_checkpoint_contexts, gelu_offloaded, arena=arena))
    out.pow(2).mean().backward()
    return [p.grad.clone() for p in model.parameters()]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def child_verdict(model, parents, directory):
    """In the forked child: 0 when its own arena takes offloaded tensors and op outputs with
    torch's gradients, and the parent's arena is refused with ForkedProcessError."""
    torch.set_num_threads(1)
    childs = spillarena.SpillArena(64 << 20, directory)
    if not same(grads(model, spillarena.offload(childs, min_bytes=4096)),
                grads(model, torch.autograd.graph.save_on_cpu())):  # this thread count's sums
        return 1
    if not same(policy_grads(model, childs), policy_grads(model, None)):
        return 2
    if childs.stash_stats()["saved_tensors_stored"] == 0:
        return 3  # nothing went to the child's arena: the comparisons proved nothing
    for use_parents in (lambda: grads(model, spillarena.offload(parents, min_bytes=4096)),
                        lambda: policy_grads(model, parents)):
        try:
            use_parents()
            return 4
        except spillarena.errors.ForkedProcessError:
            pass
    return 0


def test_a_forked_child_offloads_to_its_own_arena_and_is_refused_the_parents(tmp_path):
    model = mlp()
    parents = spillarena.SpillArena(64 << 20, str(tmp_path))
    reference = grads(model, torch.autograd.graph.save_on_cpu())
    assert same(grads(model, spillarena.offload(parents, min_bytes=4096)), reference)
    pid = os.fork()
    if pid == 0:  # the child: its verdict is its exit code, and nothing of pytest runs here
        code = 99
        try:
            code = child_verdict(model, parents, str(tmp_path))
        finally:
            os._exit(code)
    assert wait_for_exit_code(pid) == 0
    again = grads(model, spillarena.offload(parents, min_bytes=4096))  # the parent's still works
    assert same(again, reference)
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
    for _ in range(2):
        child = subprocess.run([sys.executable, "-c", EXIT_WITH_OFFLOADED_TENSORS],
                               capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
        live = int(child.stdout.split("exiting")[1])
        assert live > 0  # the exit really had tensors in the arena
        assert "Fatal Python error" not in child.stderr and "terminate" not in child.stderr
