"""A bad plugin config fails at start with spillarena's error, when axolotl loads the config; never
in training. A capacity too small for the model is not an error: the arena grows."""

import re
import subprocess

import pytest
import torch
from axolotl.cli.config import load_cfg
from axolotl.integrations.base import PluginManager

import spillarena
from conftest import (
    HIDDEN,
    LAYERS,
    MICRO_BATCH,
    PLUGIN,
    RECORDER,
    SEQ,
    axolotl_train,
    read_record,
    write_config,
)

NEEDED_BYTES = spillarena.bytes_for_layer_inputs(LAYERS, (MICRO_BATCH, SEQ, HIDDEN), torch.float32)


@pytest.fixture
def config(workdir, model_dir, dataset, spill_dir, request):
    """Writes a config with the plugin listed; `config(**keys)` adds or replaces keys."""
    def make(**keys):
        keys.setdefault("spillarena_directory", str(spill_dir))
        return write_config(workdir / request.node.name / "config.yml", model_dir, dataset,
                            plugins=[RECORDER, PLUGIN], **keys)
    return make


def _plugin():
    return PluginManager.get_instance().plugins[PLUGIN]


def test_a_missing_directory_is_refused_when_the_config_loads(config, workdir):
    missing = workdir / "no-such-directory"
    with pytest.raises(spillarena.errors.DirectoryError,
                       match=r"does not exist.*spillarena_directory="):
        load_cfg(str(config(spillarena_directory=str(missing))))


def test_an_empty_directory_is_refused_when_the_config_loads(config):
    with pytest.raises(spillarena.InvalidArgumentError,
                       match="spillarena_directory is '': an empty path names no directory; "
                       "leave the key out for the default"):
        load_cfg(str(config(spillarena_directory="")))


def _tmpfs(path):
    out = subprocess.run(["stat", "-f", "-c", "%T", path], capture_output=True, text=True)
    return out.stdout.strip() == "tmpfs"


@pytest.mark.skipif(not _tmpfs("/dev/shm"), reason="/dev/shm is not tmpfs here")
def test_a_memory_backed_directory_is_refused_when_the_config_loads(config):
    with pytest.raises(spillarena.errors.MemoryBackedDirectoryError, match="tmpfs"):
        load_cfg(str(config(spillarena_directory="/dev/shm")))


def test_an_unknown_io_mode_is_refused_when_the_config_loads(config):
    with pytest.raises(spillarena.InvalidArgumentError, match=r"io must be one of.*'fast'"):
        load_cfg(str(config(spillarena_io="fast")))


@pytest.mark.parametrize("keys, named", [
    ({"activation_offloading": True}, "activation_offloading: True"),
    ({"activation_offloading": "disk"}, "activation_offloading: 'disk'"),
    ({"gradient_checkpointing": "offload_disk"}, "gradient_checkpointing: 'offload_disk'"),
])
def test_another_offload_on_the_same_layers_is_refused_when_the_config_loads(config, keys, named):
    with pytest.raises(spillarena.InvalidArgumentError, match=f"{named}.*would both wrap"):
        load_cfg(str(config(**keys)))


@pytest.mark.parametrize("key, value", [
    ("spillarena_capacity_bytes", -1),
    ("spillarena_capacity_bytes", 0),
    ("spillarena_capacity_bytes", True),
    ("spillarena_capacity_bytes", "1073741824"),
    ("spillarena_capacity_bytes", 1.5e9),
    ("spillarena_capacity_bytes", float("nan")),
    ("spillarena_keep_last", -1),
    ("spillarena_keep_last", True),
    ("spillarena_host_pool_bytes", -4096),
    ("spillarena_host_pool_bytes", 2**70),
    ("spillarena_keep_last", 2**64),
])
def test_a_number_that_is_not_a_sane_whole_number_is_refused_when_the_config_loads(config, key,
                                                                                   value):
    # pydantic's ValidationError or spillarena's InvalidArgumentError (both ValueErrors), naming
    # the key (the probe arena names the option: keep_last, host_pool_bytes).
    with pytest.raises(ValueError, match=key.removeprefix("spillarena_")):
        load_cfg(str(config(**{key: value})))


def test_gradient_checkpointing_false_is_refused_when_the_config_loads(config):
    with pytest.raises(spillarena.InvalidArgumentError, match="gradient_checkpointing is false"):
        load_cfg(str(config(gradient_checkpointing=False)))


def test_the_config_checkpoints_and_the_trainer_arguments_do_not(config):
    cfg = load_cfg(str(config()))
    assert cfg.gradient_checkpointing is True  # axolotl's checkpointed-layer handling applies
    assert PluginManager.get_instance().get_training_args(cfg)["gradient_checkpointing"] is False


def test_without_a_capacity_key_the_arena_is_made_at_the_first_layer_input(config):
    cfg = load_cfg(str(config()))
    PluginManager.get_instance().pre_model_load(cfg)
    arena = _plugin().arena
    assert isinstance(arena, spillarena.AutomaticArena)
    assert arena.arena is None and arena.stats() == {}  # nothing preallocated before the model
    _plugin().arena = None


def test_a_given_capacity_is_preallocated_as_given_even_below_one_step(config):
    cfg = load_cfg(str(config(spillarena_capacity_bytes=NEEDED_BYTES // 4)))
    PluginManager.get_instance().pre_model_load(cfg)
    assert _plugin().arena.capacity_bytes == NEEDED_BYTES // 4
    _plugin().arena = None


def test_axolotl_train_with_a_capacity_too_small_grows_and_finishes(config):
    path = config(spillarena_capacity_bytes=4096)
    run = axolotl_train(path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    stats = read_record(path)["steps"][-1]["arena"]
    assert stats["capacity_bytes"] > 4096 and stats["grows"] >= 1, stats
    assert stats["overflows"] > 0 and stats["live_regions"] == 0, stats
    # axolotl silences Python warnings; the plugin's summary line says it instead.
    summary = re.search(r"(\d+) kept in memory for lack of room, (\d+) grows \(capacity 4096",
                        run.stdout + run.stderr)
    assert summary and int(summary[1]) == stats["overflows"], run.stderr[-3000:]
    assert int(summary[2]) == stats["grows"]
