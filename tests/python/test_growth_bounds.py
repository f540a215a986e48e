"""The arena's growth stays bounded by what was live at once, through spillarena.checkpoint: a graph
kept alive does not multiply the file, and a spill directory removed mid-run, or named relatively
before a chdir, does not stop a grow. Note [Growing the arena] (src/core/arena/arena_growth.cc) and
Note [Room is found from the descriptor] (src/core/file/spill_file.cc)."""

import functools
import shutil
import warnings

import pytest
import torch

import spillarena

LAYERS, WIDTH, ROWS = 8, 64, 16
INPUT_BYTES = ROWS * WIDTH * 4  # one layer input, float32: whole pages


def blocks():
    torch.manual_seed(5)
    return [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU())
            for _ in range(LAYERS)]


def forward(layers, checkpoint):
    h = torch.randn(ROWS, WIDTH, requires_grad=True)
    for layer in layers:
        h = checkpoint(layer, h)
    return h.pow(2).mean()


def test_a_graph_kept_alive_holds_its_bytes_but_does_not_multiply_the_file(spill_dir):
    layers = blocks()
    arena = spillarena.SpillArena(2 * INPUT_BYTES, spill_dir, keep_last=0)
    spill = functools.partial(spillarena.checkpoint, arena=arena)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", spillarena.SpillArenaWarning)
        kept = forward(layers, spill)  # never backwarded: a traceback in a notebook holds it
        for _ in range(200):
            forward(layers, spill).backward()
        del kept  # the first empty moment comes at the next step's first store
        forward(layers, spill).backward()
    s = arena.stats()
    # Live at once: the kept graph's 8 inputs and one step's 8; 200 steps' worth before the fix.
    assert s["capacity_needed_bytes"] == 2 * LAYERS * INPUT_BYTES
    assert s["capacity_bytes"] <= 1.25 * s["capacity_needed_bytes"] + 4096
    assert s["grows"] >= 1


@pytest.mark.parametrize("how", ["removed", "relative_then_chdir"])
def test_a_grow_asks_the_open_file_not_the_directory(spill_dir, how, monkeypatch):
    layers = blocks()
    directory = spill_dir / "spill"
    directory.mkdir()
    if how == "relative_then_chdir":
        monkeypatch.chdir(spill_dir)
        arena = spillarena.SpillArena(2 * INPUT_BYTES, "spill", keep_last=0)
        monkeypatch.chdir("/")
    else:
        arena = spillarena.SpillArena(2 * INPUT_BYTES, str(directory), keep_last=0)
        shutil.rmtree(directory)  # the file has no name: nothing keeps the directory
    assert arena.directory == str(directory)  # made absolute once, for messages
    spill = functools.partial(spillarena.checkpoint, arena=arena)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", spillarena.SpillArenaWarning)
        forward(layers, spill).backward()  # 6 of 8 overflow
        forward(layers, spill).backward()  # the grow
    s = arena.stats()
    assert (s["grows"], s["grow_failures"], s["grow_note"]) == (1, 0, "")
    assert arena.stash_stats()["inputs_spilled"] == 2 + LAYERS
    del arena, spill
    if how == "relative_then_chdir":
        directory.rmdir()  # empty: the file had no name and is gone


def test_a_growth_margin_message_prints_the_number_as_given(spill_dir):
    with pytest.raises(spillarena.InvalidArgumentError) as e:
        spillarena.SpillArena(1 << 20, spill_dir, growth_margin=1e308)
    assert "growth_margin = 1e+308 " in str(e.value)
    assert len(str(e.value)) < 160
