"""spillarena.enable: checkpoint a Hugging Face transformers model's layers through an arena.

    model = AutoModelForCausalLM.from_pretrained(...)
    arena = spillarena.SpillArena(capacity_bytes, "/mnt/nvme/spill")
    spillarena.enable(model, arena)           # every decoder layer; every_n_layers=2: every other
    model.train(); model(**batch).loss.backward()
    spillarena.disable(model)

It goes through transformers' own hook, ``model._set_gradient_checkpointing(enable=True,
gradient_checkpointing_func=...)``, so nothing global is patched and transformers' layer logic
(use_cache turned off under checkpointing, the outermost-wrapper rule for FSDP) stays in force.
With Trainer, leave checkpointing off in TrainingArguments and call enable() on the model.
"""

import functools
import inspect

from .checkpoint import _TORCH_ONLY_ARGUMENTS, _stash_for, checkpoint
from .errors import InvalidArgumentError


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


_CHECKPOINT_ARGUMENTS = ("use_reentrant", "preserve_rng_state", "context_fn") + tuple(_TORCH_ONLY_ARGUMENTS)


def _check_checkpoint_kwargs(kwargs):
    # Anything else would reach the layer's forward(**kwargs), which transformers' layers
    # swallow: an arena option passed here (keep_last=0) would be silently ignored.
    unknown = sorted(set(kwargs) - set(_CHECKPOINT_ARGUMENTS))
    if unknown:
        raise InvalidArgumentError(
            f"spillarena.enable: unknown argument(s) {', '.join(unknown)}; arena options belong "
            f"to SpillArena(...), and enable() passes on only {', '.join(_CHECKPOINT_ARGUMENTS)}"
        )


def enable(model, arena, every_n_layers=1, **checkpoint_kwargs):
    """Checkpoints the layers of ``model`` (a transformers PreTrainedModel, or a PEFT model
    around one) with their inputs spilled to ``arena``; every ``every_n_layers``-th layer when
    that is > 1. Also makes the input embeddings' output require grad, as transformers' own
    checkpointing does, so frozen embeddings (PEFT/LoRA) do not cut the graph. Returns model."""
    target = _pretrained(model)
    parameters = _check_supported(model, target)
    if isinstance(every_n_layers, bool) or not isinstance(every_n_layers, int) or every_n_layers < 1:
        raise InvalidArgumentError(
            f"spillarena.enable: every_n_layers must be an integer >= 1, got {every_n_layers!r}"
        )
    _check_checkpoint_kwargs(checkpoint_kwargs)
    _stash_for(arena)  # a bad arena fails here, not in the first forward
    function = functools.partial(checkpoint, arena=arena, **checkpoint_kwargs)
    options = {}
    if "every_n_layers" in parameters:
        options["every_n_layers"] = every_n_layers
    elif every_n_layers != 1:
        raise InvalidArgumentError(
            "spillarena.enable: this transformers version has no every_n_layers; pass 1"
        )
    target._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=function, **options)
    if getattr(target, "main_input_name", None) == "input_ids" or getattr(
        target, "_hf_peft_config_loaded", False
    ):
        target.enable_input_require_grads()
    return model


def disable(model):
    """Undoes enable(): the model's layers run without checkpointing again. Returns model."""
    target = _pretrained(model)
    _check_supported(model, target)
    target._set_gradient_checkpointing(enable=False)
    if hasattr(target, "_require_grads_hook"):
        target.disable_input_require_grads()
    return model
