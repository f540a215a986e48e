"""Selective checkpointing whose third choice is the disk: torch's CheckpointPolicy honoured in
eager mode, its MUST_CPU_OFFLOAD and PREFER_CPU_OFFLOAD outputs written to a SpillArena in the
forward and read back in backward instead of recomputed.

    policy = functools.partial(spillarena.selective_checkpoint_contexts,
                               spillarena.ATTENTION_OPS, arena=arena)  # or a policy_fn, as torch's
    h = spillarena.checkpoint(block, h, arena=arena, context_fn=policy)
    spillarena.enable(model, arena, context_fn=policy)               # every layer

See Note [Operation outputs to the arena].
"""

import inspect
from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.checkpoint import SAC_IGNORED_OPS, CheckpointPolicy, SelectiveCheckpointContext

from . import arguments as _arguments
from . import layout as _layout
from .checkpoint import arena_holds, check_arena, stash_for
from .errors import InvalidArgumentError
from .version_watch import detached

# Note [Operation outputs to the arena]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A selective-checkpoint policy chooses, per operation of a checkpointed layer, between keeping
# its output (*_SAVE) and recomputing it (*_RECOMPUTE). Torch names a third choice,
# *_CPU_OFFLOAD, but in eager mode treats it as recompute: only its compiler lowers it. At long
# sequences the recompute that costs most is attention's, whose output is as large as the layer
# input; keeping it costs that much memory per layer. Here the third choice is honoured, and it
# is the disk: selective_checkpoint_contexts returns the pair of dispatch modes torch's
# create_selective_checkpoint_contexts returns — one caching in the forward, one serving the
# recomputation — with the same keying (each op's n-th call, torch's storage key), the same
# errors for a recomputation that does not match, the same version check on what was saved, and
# compile internals left alone. Not its compile-time branch: where torch.compile traces the
# checkpoint itself (torch's own; spillarena's is a graph break), use torch's own contexts.
# *_SAVE outputs stay in memory as torch keeps them; *_CPU_OFFLOAD outputs go to the arena's
# shared stash (the chain of the layer inputs: same regions, integrity check, overflow rule,
# growth, stats) as the forward produces them, asynchronously like layer inputs, and the
# recomputation gets them back instead of running the op. When the recomputation of a layer
# starts, the reads of all of its offloaded outputs are queued at once, so they overlap the ops
# recomputed before them. An output of fewer than min_bytes, or one the arena cannot hold
# (sparse, nested, a dispatch subclass: one SpillArenaWarning per kind), is kept in memory as
# *_SAVE keeps it. The spill's own operations (the copy out, the restore) run outside every
# dispatch mode (Note [The spill's own operations are not the layer's] in layout.py). The policy
# sees only the forward (torch calls it there alone, too); what it returns must be a
# CheckpointPolicy or a bool, and an op it offloads must return tensors. Python decides what
# spills; the C++ stash moves the bytes.


def _attention_ops():
    """The attention kernels of torch's SDPA backends and the softmax of its math path and of
    transformers' eager attention, those this torch has. On the CPU, SDPA runs
    _scaled_dot_product_flash_attention_for_cpu without dropout and its math path
    (_safe_softmax) with it; on CUDA, flash, memory-efficient or cuDNN attention; eager
    attention's probabilities come from _softmax."""
    names = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
             "_safe_softmax", "_softmax")
    return [getattr(torch.ops.aten, n).default for n in names if hasattr(torch.ops.aten, n)]


# transformers' attention, whichever attn_implementation: SDPA's fused kernel or eager's softmax.
ATTENTION_OPS = tuple(_attention_ops())

_OFFLOAD = (CheckpointPolicy.MUST_CPU_OFFLOAD, CheckpointPolicy.PREFER_CPU_OFFLOAD)
_SAVE = (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE)
_RECOMPUTE = object()  # a storage entry: run the op again
_CONSUMED = object()   # ... already served once

def _storage_key(func, args):
    """Where the n-th call of an op is kept: torch's own key where this torch has one (a
    compiled region's calls get a queue of their own: pytorch gh-175258), else the op."""
    key = getattr(torch.utils.checkpoint, "_sac_storage_key", None)
    return key(func, args) if key is not None else func


# torch 2.11's context has no op_output (a policy reading it fails there as under torch's own)
_TAKES_OP_OUTPUT = "op_output" in inspect.signature(SelectiveCheckpointContext).parameters


def _forward_context(out):
    if _TAKES_OP_OUTPUT:
        return SelectiveCheckpointContext(is_recompute=False, op_output=out)
    return SelectiveCheckpointContext(is_recompute=False)


_MISMATCH = ("This can happen if the operations in the checkpointed region are nondeterministic "
             "or depend on global state that changed between forward and backward.")


class _Kept:
    """A saved output in memory, with the version it was saved at."""

    __slots__ = ("tensor", "version")

    def __init__(self, tensor):
        self.tensor, self.version = tensor, tensor._version

    def get(self, allow_mutation):
        if not allow_mutation and self.tensor._version != self.version:
            raise RuntimeError(
                "Tensor cached during selective activation checkpoint has been mutated")
        return self.tensor


class _Spilled:
    """An offloaded output in the stash, with the layout it had."""

    __slots__ = ("layout", "stashed")

    def __init__(self, stashed, layout):
        self.stashed, self.layout = stashed, layout

    def get(self, allow_mutation):
        restored = self.stashed.restore()  # the version check is the stash's (torch's words)
        self.stashed.free()
        return _layout.restore(restored, self.layout)

    def prefetch(self):
        self.stashed.prefetch()


def _policy_of(value, func):
    if isinstance(value, bool):
        return CheckpointPolicy.MUST_SAVE if value else CheckpointPolicy.PREFER_RECOMPUTE
    if isinstance(value, CheckpointPolicy):
        return value
    raise InvalidArgumentError(
        f"spillarena.selective_checkpoint_contexts: the policy returned {value!r} for {func}; "
        "it must return a torch.utils.checkpoint.CheckpointPolicy or a bool")


class _Storage:
    """What the forward kept of one checkpointed call, per op and call index, and where the
    offloaded outputs go."""

    def __init__(self, arena, min_bytes):
        self.arena, self.min_bytes = arena, min_bytes
        self.entries = defaultdict(dict)  # op -> {call index: _RECOMPUTE, _CONSUMED or leaves}

    def keep(self, tensor, offload):
        if not isinstance(tensor, torch.Tensor):
            return tensor
        with _layout.outside_dispatch_modes():
            if offload and tensor.numel() * tensor.element_size() >= self.min_bytes and \
                    arena_holds(tensor, "spillarena.selective_checkpoint_contexts", "op output"):
                stored, layout = _layout.compact(tensor)
                stash = stash_for(self.arena, tensor)
                return _Spilled(stash.store(stored, what="offloaded op output"), layout)
            return _Kept(detached(tensor))

    def prefetch_all(self):
        """Queues the reads of every offloaded output not served yet."""
        for calls in self.entries.values():
            for entry in calls.values():
                if isinstance(entry, tuple):
                    for leaf in entry[0]:
                        if isinstance(leaf, _Spilled):
                            leaf.prefetch()


class _CachingMode(TorchDispatchMode):
    """The forward: runs each op, asks the policy, keeps or spills its output."""

    @classmethod
    def ignore_compile_internals(cls):
        return True  # as torch's: a compiled function inside the layer is still compiled

    def __init__(self, policy_fn, storage):
        super().__init__()
        self.policy_fn, self.storage = policy_fn, storage
        self.calls = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SAC_IGNORED_OPS:
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        key = _storage_key(func, args)
        index = self.calls[key]
        self.calls[key] += 1
        policy = _policy_of(self.policy_fn(_forward_context(out), func, *args, **kwargs), func)
        if policy in _SAVE or policy in _OFFLOAD:
            leaves, spec = tree_flatten(out)
            if policy in _OFFLOAD and leaves and \
                    not any(isinstance(t, torch.Tensor) for t in leaves):  # [] is no refusal
                raise InvalidArgumentError(
                    f"spillarena.selective_checkpoint_contexts: the policy offloads {func}, "
                    f"whose output {out!r} holds no tensor; offload ops that return tensors")
            offload = policy in _OFFLOAD
            self.storage.entries[key][index] = (
                [self.storage.keep(t, offload) for t in leaves], spec)
        else:
            self.storage.entries[key][index] = _RECOMPUTE
        return out


class _CachedMode(TorchDispatchMode):
    """The recomputation: serves kept and spilled outputs by op and call index, runs the rest."""

    @classmethod
    def ignore_compile_internals(cls):
        return True

    def __init__(self, storage, allow_cache_entry_mutation):
        super().__init__()
        self.storage, self.allow_mutation = storage, allow_cache_entry_mutation
        self.calls = defaultdict(int)

    def __enter__(self):
        self.calls.clear()  # a second backward finds _CONSUMED, not a missing index
        self.storage.prefetch_all()
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SAC_IGNORED_OPS:
            return func(*args, **kwargs)
        key = _storage_key(func, args)
        index = self.calls[key]
        self.calls[key] += 1
        calls = self.storage.entries.get(key)
        if calls is None:
            raise RuntimeError(f"{func} encountered during backward but not found in storage. "
                               f"{_MISMATCH}")
        entry = calls.get(index)
        if entry is None:
            raise RuntimeError(f"{func} invocation index {index} encountered during backward but "
                               f"not found in storage. {_MISMATCH}")
        if entry is _CONSUMED:
            raise RuntimeError("Trying to backward an extra time. You are only allowed to "
                               "backward once on any region computed under selective "
                               "activation checkpoint.")
        if entry is _RECOMPUTE:
            return func(*args, **kwargs)
        calls[index] = _CONSUMED
        leaves, spec = entry
        with _layout.outside_dispatch_modes():
            values = [leaf.get(self.allow_mutation) if isinstance(leaf, (_Kept, _Spilled))
                      else leaf for leaf in leaves]
        return tree_unflatten(values, spec)


def _policy_from_list(ops, caller):
    for op in ops:
        if not isinstance(op, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)):
            raise InvalidArgumentError(
                f"{caller}: expected ops as OpOverloads "
                f"(torch.ops.aten.mm.default, not torch.ops.aten.mm), got {op!r}")
    chosen = frozenset(ops)

    def policy_fn(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_CPU_OFFLOAD if op in chosen else \
            CheckpointPolicy.PREFER_RECOMPUTE
    return policy_fn


def _policy_fn(policy_fn_or_list, caller):
    if isinstance(policy_fn_or_list, (list, tuple)):
        return _policy_from_list(policy_fn_or_list, caller)
    if callable(policy_fn_or_list):
        return policy_fn_or_list
    raise InvalidArgumentError(
        f"{caller}: pass a policy function or a list of ops, "
        f"got {type(policy_fn_or_list).__name__}")


def context_fn_of(policy_fn_or_list, arena, caller):
    """The context_fn that offloads what ``policy_fn_or_list`` marks to ``arena`` (enable()'s
    policy=), checked now rather than at the first forward."""
    policy_fn = _policy_fn(policy_fn_or_list, caller)
    check_arena(arena, caller, stash_too=False)
    return lambda: selective_checkpoint_contexts(policy_fn, arena=arena)


def selective_checkpoint_contexts(policy_fn_or_list, *, arena=None, min_bytes=0,
                                  allow_cache_entry_mutation=False):
    """torch.utils.checkpoint.create_selective_checkpoint_contexts with *_CPU_OFFLOAD honoured:
    those outputs go to ``arena`` (a SpillArena, an AutomaticArena, or None: the process's
    default_arena()) in the forward and come back in backward instead of being recomputed
    (Note [Operation outputs to the arena]). ``policy_fn_or_list``: a policy function, as
    torch's, or a list or tuple of ops to offload (ATTENTION_OPS: transformers' attention), all
    others recomputed. ``allow_cache_entry_mutation`` applies to saved outputs, as torch's; an
    offloaded output changed in place after the forward stored it is always refused: the arena
    holds the bytes from before the change. Pass it as ``context_fn`` to spillarena.checkpoint,
    enable() or torch's own checkpoint (use_reentrant=False)."""
    policy_fn = _policy_fn(policy_fn_or_list, "spillarena.selective_checkpoint_contexts")
    check_arena(arena, "spillarena.selective_checkpoint_contexts", stash_too=False)
    if not isinstance(allow_cache_entry_mutation, bool):
        raise InvalidArgumentError(
            "spillarena.selective_checkpoint_contexts: allow_cache_entry_mutation must be True "
            f"or False, got {allow_cache_entry_mutation!r}")
    storage = _Storage(arena, _arguments.min_bytes(
        min_bytes, "spillarena.selective_checkpoint_contexts"))
    return _CachingMode(policy_fn, storage), _CachedMode(storage, allow_cache_entry_mutation)


__all__ = ["ATTENTION_OPS", "selective_checkpoint_contexts"]
