"""spillarena.enable: checkpoint a Hugging Face transformers model's layers through an arena.

    model = AutoModelForCausalLM.from_pretrained(...)
    spillarena.enable(model)                  # every decoder layer; every_n_layers=2: every other
    model.train(); model(**batch).loss.backward()
    spillarena.arena_of(model).stats()        # the arena it made at the first layer input
    spillarena.disable(model)

With no arena, enable() gives the model an AutomaticArena of its own (spillarena/automatic.py):
made at the first layer input with room for one input per checkpointed layer, grown when a step
needs more (under when_full="error" only to what the failed step reached: it may take several
steps). An arena of your own: spillarena.enable(model, spillarena.SpillArena(capacity, dir)),
or spillarena.AutomaticArena(dir, **options) for the automatic one in another directory.

It goes through transformers' own hook, ``model._set_gradient_checkpointing(enable=True,
gradient_checkpointing_func=...)``, so nothing global is patched and transformers' layer logic
(use_cache turned off under checkpointing, the outermost-wrapper rule for FSDP) stays in force.
With Trainer, leave checkpointing off in TrainingArguments and call enable() on the model: see
Note [Who wins when both checkpointings are asked for]. Call enable() before torch.compile.
docs/python_integrations.md has the recipes (Trainer, PEFT, TRL, FSDP2, torch.compile).
"""

import inspect
import sys

from . import arguments as _arguments
from . import automatic as _automatic
from . import policy as _policy
from .checkpoint import TORCH_ARGUMENTS, check_arena, checkpoint
from .errors import InvalidArgumentError

# Note [Who wins when both checkpointings are asked for]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# transformers' activation_checkpointing_enable() (and its deprecated alias
# gradient_checkpointing_enable(), which Trainer, TRL and PEFT call when their arguments say
# activation_checkpointing / gradient_checkpointing=True) sets torch's in-RAM checkpoint on the
# same layers enable() gave the arena to. Called after enable(), it would silently undo the spill.
# So enable() puts guards on the model instance in place of those two methods, and they raise
# InvalidArgumentError naming the fix; Trainer.train() calls them in its setup, so the error comes
# before the first step. The other order is fine: enable() after transformers' own checkpointing
# takes the layers over (the later call wins). Once enabled, a model stays spillarena's until
# spillarena.disable(): transformers' activation_checkpointing_disable() (and
# gradient_checkpointing_disable()) pauses the spill, and its enable afterwards resumes it with the
# same arena and options. TRL's generation helper (unwrap_model_for_generation) turns
# checkpointing off around generate() and on again; without the pause it would come back as
# torch's in-RAM checkpoint.
_ENABLE_METHODS = ("activation_checkpointing_enable", "gradient_checkpointing_enable")
_DISABLE_METHODS = ("activation_checkpointing_disable", "gradient_checkpointing_disable")


def _refuse_pickling(what):
    raise InvalidArgumentError(
        f"{what} cannot be pickled: the layers of a model given to spillarena.enable checkpoint "
        "through a SpillArena (a preallocated spill file, not data). Save model.state_dict() "
        "(or save_pretrained), or call spillarena.disable(model) before pickling the model"
    )


class _ArenaCheckpointFunction:
    """The checkpoint function enable() hands transformers for every layer: spillarena.checkpoint
    bound to the arena. Copies share the arena; pickling is an InvalidArgumentError."""

    def __init__(self, arena, checkpoint_kwargs):
        self.arena = arena
        self.checkpoint_kwargs = checkpoint_kwargs

    def __call__(self, function, *args, **kwargs):
        return checkpoint(function, *args, arena=self.arena, **self.checkpoint_kwargs, **kwargs)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce_ex__(self, protocol):
        _refuse_pickling("a layer checkpointed by spillarena.enable")


class _Enabled:
    """What enable() did to a model, shared by the guards that stand in for transformers' methods
    on it (Note [Who wins when both checkpointings are asked for])."""

    def __init__(self, model, target, function, options):
        self.model, self.target, self.function, self.options = model, target, function, options
        self.paused = False

    def switch_on(self):
        self.target._set_gradient_checkpointing(
            enable=True, gradient_checkpointing_func=self.function, **self.options
        )
        if getattr(self.target, "main_input_name", None) == "input_ids" or getattr(
            self.target, "_hf_peft_config_loaded", False
        ):
            _enable_input_require_grads(self.target)
        self.paused = False

    def switch_off(self):
        self.target._set_gradient_checkpointing(enable=False)
        if hasattr(self.target, "_require_grads_hook"):
            self.target.disable_input_require_grads()
        self.paused = True


class _TransformersEnable:
    """Stands on an enabled model for activation_checkpointing_enable() and its alias."""

    def __init__(self, name, enabled):
        self.name, self.enabled = name, enabled

    def __call__(self, *args, **kwargs):
        if self.enabled.paused:
            self.enabled.switch_on()  # the arena again, not torch's in-RAM checkpoint
            return
        raise InvalidArgumentError(
            f"{self.name}: spillarena.enable already checkpoints this model's layers with their "
            "inputs spilled to a SpillArena; transformers' checkpointing would replace that with "
            "in-RAM checkpointing. Leave activation_checkpointing (gradient_checkpointing) off in "
            "TrainingArguments / SFTConfig, or call spillarena.disable(model) first"
        )


class _TransformersDisable:
    """Stands on an enabled model for activation_checkpointing_disable() and its alias: pauses."""

    def __init__(self, enabled):
        self.enabled = enabled

    def __call__(self):
        self.enabled.switch_off()


def _guarded(model, target):
    # A PEFT model answers for its base model (Trainer calls the wrapper), but a user may call the
    # base model's methods directly: both carry the guards.
    holders = {id(m): m for m in (model, target)}
    if hasattr(target, "get_base_model"):
        base = target.get_base_model()
        holders[id(base)] = base
    return list(holders.values())


def _make_output_require_grad(module, inputs, output):
    output.requires_grad_(True)


def _enable_input_require_grads(target):
    # transformers' own hook is a local function, which makes the whole model unpicklable with an
    # AttributeError before pickling ever reaches a layer; the same hook at module level pickles.
    target.enable_input_require_grads()
    for handle in getattr(target, "_require_grads_hooks", []):
        hooks = handle.hooks_dict_ref()
        if hooks is not None and handle.id in hooks:
            hooks[handle.id] = _make_output_require_grad


def _pretrained(model):
    # A PEFT PeftModel wraps the transformers model; the hook lives on the wrapped one.
    if not hasattr(model, "_set_gradient_checkpointing") and hasattr(model, "get_base_model"):
        return model.get_base_model()
    return model


def _check_supported(model, target):
    if not getattr(target, "supports_gradient_checkpointing", False) or not hasattr(
        target, "_set_gradient_checkpointing"
    ):
        raise InvalidArgumentError(
            f"spillarena.enable: {type(model).__name__} does not support gradient checkpointing "
            "(supports_gradient_checkpointing is not True), so transformers has no layer to hand "
            "to spillarena. Use spillarena.checkpoint in its forward instead."
        )
    parameters = inspect.signature(target._set_gradient_checkpointing).parameters
    if "value" in parameters:
        raise InvalidArgumentError(
            f"spillarena.enable: {type(model).__name__} overrides _set_gradient_checkpointing in "
            "the pre-4.35 format, which cannot take a checkpoint function"
        )
    return parameters


def _compiled(module):
    from torch._dynamo.eval_frame import OptimizedModule

    return (
        isinstance(module, OptimizedModule)
        or getattr(module, "_compiled_call_impl", None) is not None
    )


def _check_not_compiled(model):
    # Dynamo would have traced (or, once run, cached) the layers without the spill; enable() first
    # and compile afterwards keeps the order the graph break at each checkpoint relies on.
    compiled = [name or "the model" for name, module in model.named_modules() if _compiled(module)]
    if compiled:
        raise InvalidArgumentError(
            "spillarena.enable: the model is already compiled (torch.compile / module.compile() on "
            f"{compiled[0]}); call spillarena.enable(model) "
            "first and torch.compile afterwards. Each checkpointed layer then runs eagerly inside "
            "the compiled model (a graph break), see docs/python_integrations.md"
        )


def _enabled_arena(target):
    for module in target.modules():
        function = getattr(module, "_gradient_checkpointing_func", None)
        if getattr(module, "gradient_checkpointing", False) and isinstance(
            function, _ArenaCheckpointFunction
        ):
            return function.arena
    return None


def _check_checkpoint_kwargs(kwargs):
    # Anything else would reach the layer's forward(**kwargs), which transformers' layers
    # swallow: an arena option passed here (keep_last=0) would be silently ignored.
    unknown = sorted(set(kwargs) - set(TORCH_ARGUMENTS))
    if unknown:
        raise InvalidArgumentError(
            f"spillarena.enable: unknown argument(s) {', '.join(unknown)}; arena options belong "
            f"to SpillArena(...), and enable() passes on only {', '.join(TORCH_ARGUMENTS)}"
        )


def _checkpointed_layers(target):
    from transformers.modeling_layers import GradientCheckpointingLayer

    return sum(
        1
        for module in target.modules()
        if isinstance(module, GradientCheckpointingLayer)
        and getattr(module, "gradient_checkpointing", False)
    )


def _paused_or_enabled(model, target):
    """The _Enabled of an enable() that disable() has not undone, paused or not; else None."""
    for holder in _guarded(model, target):
        guard = holder.__dict__.get(_ENABLE_METHODS[0])
        if isinstance(guard, _TransformersEnable):
            return guard.enabled
    return None


def arena_of(model):
    """The arena enable() gave ``model``'s layers: the SpillArena, TensorStash or AutomaticArena
    it was given, or the AutomaticArena it made (its ``stats()`` are {} before the first step);
    also while transformers' checkpointing is paused (gradient_checkpointing_disable()), since
    the model stays spillarena's until spillarena.disable(). None when the model is not
    enabled."""
    target = _pretrained(model)
    enabled = _paused_or_enabled(model, target)
    return enabled.function.arena if enabled is not None else _enabled_arena(target)


def _policy_context(policy, arena, checkpoint_kwargs):
    """policy= as the context_fn it stands for (Note [Operation outputs to the arena])."""
    if policy is None:
        return checkpoint_kwargs
    for given in ("context_fn", "use_reentrant"):
        if checkpoint_kwargs.get(given):
            raise InvalidArgumentError(
                f"spillarena.enable: policy= and {given}={checkpoint_kwargs[given]!r} cannot go "
                "together" + (": a policy is a context_fn" if given == "context_fn" else
                              ": torch's reentrant form takes no context_fn"))
    context_fn = _policy.context_fn_of(policy, arena, "spillarena.enable: policy=")
    return {**checkpoint_kwargs, "context_fn": context_fn}


def enable(model, arena=None, every_n_layers=1, *, policy=None, **checkpoint_kwargs):
    """Checkpoints the layers of ``model`` (a transformers PreTrainedModel, or a PEFT model
    around one) with their inputs spilled to ``arena``; every ``every_n_layers``-th layer when
    that is > 1. ``arena``: None (an AutomaticArena of the model's own), an AutomaticArena (one
    without ``layers`` is told the layers checkpointed here, to size its first arena), a
    SpillArena or a TensorStash. ``policy``: what else of each layer goes to the arena, as
    spillarena.selective_checkpoint_contexts takes it: a list of ops
    (spillarena.ATTENTION_OPS: attention's output, read back instead of recomputed) or a
    policy function; it stands for that context_fn.
    Also makes the input embeddings' output require grad, as transformers' own checkpointing
    does, so frozen embeddings (PEFT/LoRA) do not cut the graph. Returns model."""
    if "torch._dynamo" in sys.modules:  # nothing can be compiled before Dynamo is imported
        _check_not_compiled(model)
    target = _pretrained(model)
    parameters = _check_supported(model, target)
    if _enabled_arena(target) is not None or _paused_or_enabled(model, target) is not None:
        raise InvalidArgumentError(
            f"spillarena.enable: {type(model).__name__} is already enabled (its layers spill to a "
            "SpillArena, or will again once transformers' checkpointing is turned back on); call "
            "spillarena.disable(model) first to change the arena or the options"
        )
    count = _arguments.integer(every_n_layers)
    if count is None or count < 1:
        raise InvalidArgumentError(
            f"spillarena.enable: every_n_layers must be an integer >= 1, got {every_n_layers!r}"
        )
    every_n_layers = count
    _check_checkpoint_kwargs(checkpoint_kwargs)
    check_arena(arena)  # a bad arena fails here, not in the first forward
    if arena is None:
        arena = _automatic.AutomaticArena()
    checkpoint_kwargs = _policy_context(policy, arena, checkpoint_kwargs)
    function = _ArenaCheckpointFunction(arena, checkpoint_kwargs)
    options = {}
    if "every_n_layers" in parameters:
        options["every_n_layers"] = every_n_layers
    elif every_n_layers != 1:
        raise InvalidArgumentError(
            "spillarena.enable: this transformers version has no every_n_layers; pass 1"
        )
    enabled = _Enabled(model, target, function, options)
    enabled.switch_on()
    if isinstance(arena, _automatic.AutomaticArena) and arena.layers is None:
        arena.layers = _checkpointed_layers(target) or None  # sizes its first arena
    for holder in _guarded(model, target):
        for name in _ENABLE_METHODS:
            setattr(holder, name, _TransformersEnable(name, enabled))
        for name in _DISABLE_METHODS:
            setattr(holder, name, _TransformersDisable(enabled))
    return model


def disable(model):
    """Undoes enable() (or transformers' own checkpointing): the model's layers run without
    checkpointing again. Returns model."""
    target = _pretrained(model)
    _check_supported(model, target)
    for holder in _guarded(model, target):
        for name in _ENABLE_METHODS + _DISABLE_METHODS:
            holder.__dict__.pop(name, None)
    target._set_gradient_checkpointing(enable=False)
    if hasattr(target, "_require_grads_hook"):
        target.disable_input_require_grads()
    return model
