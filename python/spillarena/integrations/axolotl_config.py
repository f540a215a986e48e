"""The spillarena_* keys of an axolotl config: their schema, their checks, and the arena they make.

    check_config(raw_cfg)   # at config load: conflicts, directory, I/O mode, options
    arena = make_arena(cfg)  # before the model loads: an AutomaticArena, or the capacity given

Imported by axolotl by name (SpillArenaArgs) and by the plugin in axolotl.py; nothing here runs
on its own.
"""

from typing import Any

from pydantic import BaseModel, Field, model_validator

import spillarena
from spillarena.errors import Error, InvalidArgumentError

PLUGIN = "spillarena.integrations.axolotl.SpillArenaPlugin"

# Keys of the config that name an arena option, and the option. Anything else goes through
# spillarena_options, as SpillArena(...) takes it.
_KEY_TO_OPTION = {
    "spillarena_io": "io",
    "spillarena_host_pool_bytes": "host_pool_bytes",
    "spillarena_keep_last": "keep_last",
}

# Big enough for any alignment the arena rounds to, small enough to cost nothing.
_PROBE_CAPACITY_BYTES = 1 << 20


def _listed(data) -> bool:
    # axolotl accepts "module.Class" and the entry-point form "module:Class".
    return PLUGIN in [str(name).replace(":", ".") for name in data.get("plugins") or []]


class SpillArenaArgs(BaseModel):
    """The plugin's keys; axolotl merges them into its config schema."""

    spillarena_directory: str | None = Field(
        default=None,
        json_schema_extra={"description": "Directory of the spill file, on a disk (not tmpfs). "
                           "Default: spillarena.default_spill_directory() ($SPILL_DIR, ...)."},
    )
    spillarena_io: str | None = Field(
        default=None,
        json_schema_extra={"description": "buffered, direct, automatic or gds. Default: the "
                           "arena's own default."},
    )
    # Strict whole numbers: pydantic's lax mode would take true as 1, "12" as 12 and 3.0 as 3, so
    # a typo in the YAML could size an arena. The upper bounds are the arena's own (checked by
    # the probe arena when the config loads, with the key named).
    spillarena_capacity_bytes: int | None = Field(
        default=None, strict=True, ge=1,
        json_schema_extra={"description": "Size of the spill file, preallocated before the model "
                           "loads. Default: none needed; the arena is made at the first layer "
                           "input with room for one per checkpointed layer, and grows when a "
                           "step needs more (spillarena.AutomaticArena)."},
    )
    spillarena_host_pool_bytes: int | None = Field(default=None, strict=True, ge=0)
    spillarena_keep_last: int | None = Field(default=None, strict=True, ge=0)
    spillarena_options: dict[str, Any] | None = Field(
        default=None,
        json_schema_extra={"description": "Any other SpillArena(...) keyword "
                           "(staging_bytes, verify_integrity, prefetch_depth, ...)."},
    )

    @model_validator(mode="before")
    @classmethod
    def checkpointing_on(cls, data):
        # Note [gradient_checkpointing is on in the config, off in the trainer's arguments]
        # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
        # The plugin checkpoints every decoder layer, so the config says so: axolotl's
        # model-specific handling of checkpointed layers (use_cache off, shared-KV fixes, ...)
        # keys on cfg.gradient_checkpointing. The trainer's arguments say the opposite
        # (SpillArenaPlugin.get_training_args), or Trainer.train() would call
        # gradient_checkpointing_enable() and put torch's checkpoint back in our place.
        if isinstance(data, dict) and _listed(data) and data.get("gradient_checkpointing") is None:
            data["gradient_checkpointing"] = True
        return data


def _conflicts(cfg) -> list:
    found = []
    offloading = cfg.get("activation_offloading")
    if offloading not in (None, False):
        found.append(f"activation_offloading: {offloading!r}")
    checkpointing = cfg.get("gradient_checkpointing")
    if checkpointing in ("offload", "offload_disk"):
        found.append(f"gradient_checkpointing: {checkpointing!r} (activation offloading)")
    if cfg.get("selective_checkpointing"):
        found.append("selective_checkpointing")
    if (cfg.get("fsdp_config") or {}).get("activation_checkpointing"):
        found.append("fsdp_config.activation_checkpointing")
    return found


def arena_options(cfg) -> dict:
    """SpillArena keywords from the spillarena_* keys, without capacity_bytes and directory."""
    options = dict(cfg.get("spillarena_options") or {})
    for reserved in ("capacity_bytes", "directory"):
        if reserved in options:
            raise InvalidArgumentError(
                f"axolotl config: spillarena_options.{reserved} is set; use "
                f"spillarena_{reserved} instead (the plugin sizes and places the arena from it)"
            )
    for key, option in _KEY_TO_OPTION.items():
        if cfg.get(key) is None:
            continue
        if option in options:
            raise InvalidArgumentError(
                f"axolotl config: {key} and spillarena_options.{option} are both set; keep one"
            )
        options[option] = cfg.get(key)
    return options


def spill_directory(cfg) -> str:
    directory = cfg.get("spillarena_directory")
    if directory == "":
        raise InvalidArgumentError(
            "axolotl config: spillarena_directory is '': "
            + spillarena._C._empty_directory_refusal("leave the key out")
        )
    return spillarena.default_spill_directory() if directory is None else directory


def _arena(capacity_bytes, cfg):
    """A SpillArena of ``capacity_bytes``, or an AutomaticArena when it is None."""
    directory, options = spill_directory(cfg), arena_options(cfg)
    try:
        if capacity_bytes is None:
            return spillarena.AutomaticArena(directory, **options)
        return spillarena.SpillArena(capacity_bytes, directory, **options)
    except Error as error:
        # Same type and attributes; the message also names where the values came from.
        error.args = (f"{error} (from the axolotl config: spillarena_directory={directory!r}, "
                      f"arena options {options})",)
        raise


def check_config(cfg) -> None:
    """Refuses, before anything loads, what would make training fail or silently not spill:
    another offload or checkpoint wrapper on the same layers, gradient_checkpointing: false,
    and (through a 1 MiB probe arena, made and dropped here) a missing, unwritable or
    memory-backed directory, an unknown I/O mode or arena option. Raises spillarena's errors."""
    conflicts = _conflicts(cfg)
    if conflicts:
        raise InvalidArgumentError(
            f"axolotl config: {', '.join(conflicts)} and the spillarena plugin would both wrap "
            "the decoder layers, and a layer has one checkpoint function. The plugin "
            "checkpoints them with their inputs spilled to disk: remove "
            f"{' and '.join(c.split(':')[0] for c in conflicts)}, or remove {PLUGIN} from plugins"
        )
    if cfg.get("gradient_checkpointing") is False:
        raise InvalidArgumentError(
            "axolotl config: gradient_checkpointing is false, but the spillarena plugin "
            "checkpoints every decoder layer. Set gradient_checkpointing: true (or leave it "
            f"out), or remove {PLUGIN} from plugins"
        )
    # Note [Why a probe arena at config load]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # The arena's own checks (directory, file system, I/O mode, option names and values) are
    # the ones that count, and they run in its constructor. The real arena comes later: made in
    # pre_model_load with spillarena_capacity_bytes, or without it at the first layer input (an
    # AutomaticArena, sized from that input); a probe of 1 MiB runs the checks now, before
    # datasets are tokenized. Its file has no name (see SpillArena.opened_without_name): nothing
    # is left.
    _arena(_PROBE_CAPACITY_BYTES, cfg)


def make_arena(cfg):
    """The arena of this run: spillarena_capacity_bytes preallocated when given, else an
    AutomaticArena (made at the first layer input, grown when a step needs more; the plugin's
    enable() tells it the checkpointed layers)."""
    return _arena(cfg.get("spillarena_capacity_bytes"), cfg)
