"""A test-only axolotl plugin: writes each step's log (full-precision loss and grad norm), the
checkpoint function the decoder layers hold, and the spillarena arena's stats to
<output_dir>/record.json when training ends. Listed in both runs the test compares."""

import inspect
import json
from pathlib import Path

from axolotl.integrations.base import BasePlugin, PluginManager
from transformers import TrainerCallback

from spillarena.integrations.axolotl_config import PLUGIN


def _arena():
    plugin = PluginManager.get_instance().plugins.get(PLUGIN)
    return getattr(plugin, "arena", None)


def _describe(function):
    target = getattr(function, "func", function)  # transformers binds its kwargs with partial
    kind = target if inspect.isfunction(target) else type(target)
    return f"{kind.__module__}.{kind.__qualname__}"


def _checkpoint_functions(model):
    """What the checkpointed modules call, and whether it holds the plugin's arena."""
    arena = _arena()
    functions = {
        getattr(m, "_gradient_checkpointing_func", None)
        for m in model.modules()
        if getattr(m, "gradient_checkpointing", False)
    } - {None}
    return sorted({(_describe(f), arena is not None and getattr(f, "arena", None) is arena)
                   for f in functions})


class _Recorder(TrainerCallback):
    def __init__(self, path):
        self.path = path
        self.steps = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        arena = _arena()
        self.steps.append({
            "checkpoint_functions": _checkpoint_functions(model),
            "arena": arena.stats() if arena is not None else None,
        })

    def on_train_end(self, args, state, control, **kwargs):
        logs = [entry for entry in state.log_history if "loss" in entry]
        self.path.write_text(json.dumps({"logs": logs, "steps": self.steps}, default=str))


class RecorderPlugin(BasePlugin):
    def add_callbacks_post_trainer(self, cfg, trainer):
        return [_Recorder(Path(cfg.output_dir) / "record.json")]
