"""spillarena.integrations.axolotl: axolotl's decoder layers checkpointed with their inputs on disk.

    # the axolotl YAML
    plugins:
      - spillarena.integrations.axolotl.SpillArenaPlugin
    spillarena_directory: /mnt/nvme/spill   # on a disk; default $SPILL_DIR,
                                            # see default_spill_directory
    spillarena_io: direct                   # buffered | direct | automatic | gds;
                                            # default: the arena's
    # spillarena_capacity_bytes:   default: none needed; the arena is made at the first layer
    #                              input and grows when a step needs more
    # spillarena_host_pool_bytes, spillarena_keep_last, spillarena_options: {verify_integrity: true}

    $ axolotl train config.yml

gradient_checkpointing may stay unset or true: the plugin is the checkpoint function either way.
activation_offloading, gradient_checkpointing: offload / offload_disk / false,
selective_checkpointing and FSDP's activation_checkpointing are refused when the config loads,
as are a missing or memory-backed directory and an unknown I/O mode or option, each with a
spillarena error. A step that needs more room than the arena has never ends the run: its inputs
stay in memory and the arena grows before the next step (Note [Growing the arena]).
"""

from axolotl.integrations.base import BasePlugin
from axolotl.utils.logging import get_logger

import spillarena

from .axolotl_config import check_config, make_arena

# Under axolotl's name: its log setup shows INFO only for loggers named axolotl.*, and these
# lines (the arena made, the bytes spilled) are the ones a user looks for.
LOG = get_logger("axolotl.integrations.spillarena")


class SpillArenaPlugin(BasePlugin):
    """Makes the arena before the model loads, calls spillarena.enable() on the loaded model
    (adapters included), keeps the trainer from swapping its own checkpointing back in, and
    lets the arena go when training ends."""

    def __init__(self):
        super().__init__()
        self.arena = None

    def get_input_args(self):
        return "spillarena.integrations.axolotl_config.SpillArenaArgs"

    def register(self, cfg):
        # The raw config, before axolotl validates it: the earliest point a plugin sees.
        self.arena = None
        check_config(cfg)

    def pre_model_load(self, cfg):
        self.arena = make_arena(cfg)
        LOG.info(f"spillarena: {self.arena!r}")

    def post_model_load(self, cfg, model):
        # After axolotl's own gradient_checkpointing_enable() (LoRA, k-bit preparation), so
        # ours is the function the layers keep.
        spillarena.enable(model, self.arena)  # tells an AutomaticArena the layers it checkpoints

    def get_training_args(self, cfg):
        # See Note [gradient_checkpointing is on in the config, off in the trainer's arguments]
        # in axolotl_config.py.
        return {"gradient_checkpointing": False}

    def post_train(self, cfg, model):
        # axolotl calls this twice (after trainer.train() and after saving): once is enough.
        if self.arena is None:
            return
        stats = self.arena.stats()
        if stats:
            LOG.info(
                f"spillarena: {stats['allocations']} layer inputs spilled, "
                f"{stats['bytes_written']} bytes written, {stats['bytes_read']} read, "
                f"peak {stats['peak_bytes_in_use']} of {stats['capacity_bytes']} bytes in use; "
                f"{stats['overflows']} kept in memory for lack of room, {stats['grows']} grows "
                f"(capacity {stats['initial_capacity_bytes']} at first)"
            )
        spillarena.disable(model)
        self.arena = None
