"""spillarena.checkpoint: torch.utils.checkpoint.checkpoint whose saved layer input is spilled.

    h = x
    for block in blocks:
        h = spillarena.checkpoint(block, h, mask)  # arena=: default_arena(), made at this input
    loss_fn(h).backward()        # each input read back, the block recomputed, its region freed

Transformers calls it as ``fn(functools.partial(layer.forward, layer, **kwargs), *args)``;
tensors may come positionally or inside the partial, and get their gradients either way.

This module is the front door: it checks the arguments, picks the tensor that spills (Note
[Which argument spills]) and the stash, and hands the call (a job.Job: stores the input,
restores it, reruns the layer) to one of two forms, which differ only in how autograd reaches
it: torch's own non-reentrant checkpoint (non_reentrant.py, the default) or one autograd
Function per layer (reentrant.py, use_reentrant=True). Gradients are those of torch's checkpoint
of the same form. Under torch.compile the
checkpoint is a graph break: Note [The checkpoint under torch.compile].
"""

import functools
import sys
import warnings

import torch
import torch.utils.checkpoint as torch_checkpoint
from torch.utils._pytree import tree_flatten

from . import arena as _arena
from . import automatic as _automatic
from . import job as _job
from . import malloc as _malloc
from . import non_reentrant as _non_reentrant
from . import reentrant as _reentrant
from .arena_stash import shared_arena_stash
from .errors import InvalidArgumentError, SpillArenaWarning
from .stash import TensorStash
from .storable import storable_kind

# torch.utils.checkpoint.checkpoint's own keyword arguments (what enable() passes on); one left
# out stands at torch's default.
TORCH_ARGUMENTS = ("use_reentrant", "preserve_rng_state", "context_fn", "determinism_check",
                   "debug", "early_stop")
_TORCH_DEFAULT = object()


def _warn_ignored_by_the_reentrant_form(use_reentrant, early_stop, determinism_check):
    # torch's reentrant form ignores them too; it says nothing, spillarena says so once per call.
    if use_reentrant and (early_stop is False or determinism_check not in (_TORCH_DEFAULT,
                                                                           "default")):
        warnings.warn(
            "spillarena.checkpoint: early_stop and determinism_check apply to the default "
            "(non-reentrant) form; use_reentrant=True recomputes every layer whole and checks "
            "nothing, as torch.utils.checkpoint's reentrant form does",
            UserWarning,
            stacklevel=3,
        )

def check_arena(arena, who="spillarena.checkpoint", stash_too=True):
    """``arena`` as ``who`` takes it: a SpillArena, an AutomaticArena, None (the process's
    default_arena()) and, with ``stash_too``, any TensorStash; InvalidArgumentError else."""
    kinds = (_arena.SpillArena, _automatic.AutomaticArena) + ((TensorStash,) if stash_too else ())
    if arena is None or isinstance(arena, kinds):
        return
    stash = ", a TensorStash" if stash_too else ""
    raise InvalidArgumentError(
        f"{who}: arena= must be a spillarena.SpillArena, an AutomaticArena{stash} or None (the "
        f"process's default_arena()), got {type(arena).__name__}"
    )


def stash_for(arena, tensor):
    """The stash for a layer input like ``tensor`` (``arena`` passed check_arena): an
    AutomaticArena (None: the default one) makes its arena now when this is its first input, or
    keeps the input in memory while a full disk leaves it none (Note [No room for the first
    arena] in automatic.py)."""
    arena = _automatic.resolve(arena, tensor)
    if isinstance(arena, _arena.SpillArena):
        return shared_arena_stash(arena)
    return arena


def _unwrap(function):
    # functools.partial flattens nested partials itself, so one level is all there is.
    if isinstance(function, functools.partial):
        return function.func, tuple(function.args), dict(function.keywords)
    return function, (), {}


def _describe(value) -> str:
    return type(value).__name__ if value is not None else "None"


# Note [Which argument spills]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Torch's checkpoint takes any arguments, tensors anywhere in tuples, lists, dicts and other
# pytrees, or none. One tensor per call goes to the arena: the layer input, the one activation
# that is new at every layer. It is the first floating-point tensor among the positional
# arguments (searched through their pytrees), else among the partial's and keyword arguments,
# else the first tensor of any dtype there; never an nn.Parameter or a view of one (weights stay
# where they are), never a tensor the arena cannot hold — sparse, nested, meta, a subclass with a
# dispatch of its own and maybe no storage (storable_kind in storable.py). Torch's checkpoint
# trains such an input (torch.sparse.mm on a sparse one), and so must spillarena's, in both
# forms: it is held as torch holds it, in memory, and one SpillArenaWarning per kind says so
# (issue 49; before, a sparse input reached layout.py and raised NotImplementedError from
# aten::as_strided).
# Every other tensor — masks, position ids and embeddings, an encoder's output, T5's position
# bias — is held as torch holds it: those are small or shared by every layer, and spilling a
# tensor shared by L layers would write it L times. A call with no tensor to spill runs
# torch.utils.checkpoint.checkpoint itself: there is nothing to spill, and its behaviour is the
# contract. Under transformers (hidden states first) and every call this package documented
# before, the choice is the same as it was: the first positional tensor.
def _pick_spilled(args, prefix, keywords, tensors):
    """Index, among ``tensors`` (every tensor argument in call order: the partial's, the
    positional, the keyword ones), of the one to spill; None when there is none (Note [Which
    argument spills])."""
    if not prefix and args and _is_plain_activation(args[0]):
        return 0  # the common call, decided without flattening anything again
    first_positional = len(_job.Job.tensors_in(prefix))
    positional = range(first_positional, first_positional + len(_job.Job.tensors_in(args)))
    others = [i for i in range(len(tensors)) if i not in positional]
    candidates = [i for i in (*positional, *others)
                  if not is_weight(tensors[i]) and arena_holds(tensors[i])]
    for i in candidates:
        if tensors[i].is_floating_point():
            return i
    return candidates[0] if candidates else None


def _is_plain_activation(value):
    # a plain dense tensor (a subclass or another layout takes the long way: arena_holds)
    return (type(value) is torch.Tensor and value.layout == torch.strided
            and not value.is_nested and not value.is_meta and value.is_floating_point()
            and not is_weight(value))


# (caller, kind) of the inputs SpillArenaWarning named already (once each per process).
_KEPT_IN_MEMORY_NOTICED = set()


def arena_holds(tensor, who="spillarena.checkpoint", what="tensor argument"):
    """Whether the arena can hold ``tensor``; a notice, once per kind and caller, when it
    cannot (Note [Which argument spills])."""
    kind = storable_kind(tensor)
    if kind is None:
        return True
    if (who, kind) not in _KEPT_IN_MEMORY_NOTICED:
        _KEPT_IN_MEMORY_NOTICED.add((who, kind))
        warnings.warn(
            f"{who}: a {kind} {what} stays in memory, as torch keeps it: the arena holds dense "
            "tensors with data of their own. Pass its to_dense() to spill it (said once per "
            "kind of tensor)",
            SpillArenaWarning,
            stacklevel=5,
        )
    return False


def is_weight(tensor):
    """A parameter, or a view of one (W.t(), W[0])."""
    return isinstance(tensor, torch.nn.Parameter) or isinstance(tensor._base, torch.nn.Parameter)


def _torch_options(use_reentrant, options):
    """torch's keyword arguments that are given, checked as torch checks them."""
    given = {k: v for k, v in options.items() if v is not _TORCH_DEFAULT}
    if use_reentrant and ("context_fn" in given or given.get("debug", False)):
        raise InvalidArgumentError(
            "spillarena.checkpoint: context_fn and debug are only supported with "
            "use_reentrant=False (as in torch.utils.checkpoint)")
    return given


def _checkpoint(function, *args, arena=None, use_reentrant=None, preserve_rng_state=True,
                _spillarena_torch_options=None, **kwargs):
    if use_reentrant not in (None, True, False):
        raise InvalidArgumentError(
            f"spillarena.checkpoint: use_reentrant must be None, True or False, got "
            f"{use_reentrant!r}"
        )
    check_arena(arena)
    options = _torch_options(use_reentrant, _spillarena_torch_options or {})
    func, prefix, keywords = _unwrap(function)
    keywords.update(kwargs)
    if not prefix and not keywords and all(isinstance(a, torch.Tensor) for a in args):
        leaves, spec = list(args), None  # func(*tensors): nothing to flatten or rebuild (job.py)
    else:
        leaves, spec = tree_flatten((prefix, args, keywords))
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    job = _job.Job(func, leaves, spec, preserve_rng_state)
    job.spill_index = _pick_spilled(args, prefix, keywords, tensors)
    if job.spill_index is None:  # nothing to spill: torch's own checkpoint, as the caller asked
        return torch_checkpoint.checkpoint(function, *args, use_reentrant=bool(use_reentrant),
                                           preserve_rng_state=preserve_rng_state, **options,
                                           **kwargs)
    if not torch.is_grad_enabled():
        return function(*args, **kwargs)  # no backward will come: nothing to keep
    job.stash = stash_for(arena, tensors[job.spill_index])
    _malloc.use_for_spilling(job.stash)
    if use_reentrant:
        return _reentrant.run(job, tensors)
    return _non_reentrant.run(job, tensors, options)


# Note [The checkpoint under torch.compile]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The spill cannot live inside a compiled graph: store() and restore() are C++ calls on an arena
# that Dynamo cannot trace, and the Function's forward and backward must run the layer the same
# way. Left to itself, Dynamo breaks the graph at the reentrant form's Function.apply and compiles
# the frames that run inside it (the layer's forward, under no_grad) but not the recomputation,
# which the autograd engine runs later outside any compiled frame: the recomputed layer would be
# eager while the forward was compiled, and its dropout masks (Inductor draws them its own way)
# would not be the forward's (the non-reentrant form's recomputation, in a saved-tensor unpack
# hook, runs as late and as eager). The gradients would be silently wrong. So the whole checkpoint,
# the layer inside it included, runs eagerly under torch.compiler.disable: a graph break at each
# checkpointed layer, everything else compiled, forward and recomputation the same eager code,
# gradients bit-identical to eager. Dynamo is imported lazily (seconds at import time); it is in
# sys.modules before any torch.compile can be tracing, so the check below is enough.
_checkpoint_outside_compile = None


def checkpoint(function, *args, arena=None, use_reentrant=None, preserve_rng_state=True,
               context_fn=_TORCH_DEFAULT, determinism_check=_TORCH_DEFAULT, debug=_TORCH_DEFAULT,
               early_stop=_TORCH_DEFAULT, **kwargs):
    """Checkpoints ``function(*args, **kwargs)`` with its layer input spilled to ``arena``.

    The contract of torch.utils.checkpoint.checkpoint: any positional and keyword arguments,
    tensors anywhere in their pytrees, or none; ``function`` may be a functools.partial holding
    keyword arguments (tensors included), as transformers calls it. One tensor spills, the layer
    input (Note [Which argument spills]); the others are held as torch holds them; with none, the
    call is torch's own checkpoint. ``use_reentrant`` None or False (the default): torch's
    non-reentrant checkpoint itself, with ``context_fn``, ``determinism_check``, ``debug`` and
    ``early_stop`` as torch takes them (set_checkpoint_early_stop honoured) and the input in the
    stash instead of in torch's frame (Note [A non-reentrant checkpoint that spills]);
    torch.autograd.grad and backward inside the layer and around it, nesting, retain_graph and
    double backward work. True: one autograd Function per layer that recomputes inside its
    backward (``loss.backward()`` only). ``arena`` is a SpillArena, an AutomaticArena, None (the
    process's default_arena(), made at the first input and grown as steps need) or any
    TensorStash (make_in_memory_stash(): classic checkpointing, no spill). An input that finds
    no room stays in memory for the step (one SpillArenaWarning per arena), also when a full disk
    leaves an AutomaticArena no arena at all, unless the arena was made with when_full="error":
    then ArenaExhaustedError (nothing is left allocated; the arena grows only to what the failed
    step reached, so a model may fail several steps before it fits), or InsufficientSpaceError
    for an AutomaticArena on a full disk. Raises torch's errors where torch raises (its
    CheckpointError is a RuntimeError); spillarena.errors.CheckpointError for the reentrant
    form's second backward after the graph was released. Under torch.compile the call runs
    eagerly, a graph break (Note [The checkpoint under torch.compile]).
    """
    global _checkpoint_outside_compile
    # here, so its warning names the caller's line
    _warn_ignored_by_the_reentrant_form(use_reentrant, early_stop, determinism_check)
    run = _checkpoint
    if "torch._dynamo" in sys.modules:
        if _checkpoint_outside_compile is None:
            _checkpoint_outside_compile = torch.compiler.disable(
                _checkpoint, reason="spillarena.checkpoint spills through C++ and runs eagerly"
            )
        run = _checkpoint_outside_compile
    options = {"context_fn": context_fn, "determinism_check": determinism_check,
               "debug": debug, "early_stop": early_stop}
    return run(function, *args, arena=arena, use_reentrant=use_reentrant,
               preserve_rng_state=preserve_rng_state, _spillarena_torch_options=options,
               **kwargs)
