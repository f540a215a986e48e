"""Misuse from Python that once crashed or raised raw errors (issue 19): deep copies of enabled
models, pickling, paths that are not UTF-8, the per-file baseline on a full disk, and arguments
that would be silently ignored."""

import copy
import functools
import io
import os
import pathlib
import pickle
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import spillarena
from conftest import assert_drained, our_warnings

# A directory name no UTF-8 decoder accepts (Linux takes any bytes but "/" and NUL).
NOT_UTF8 = b"spill-\xff\xfe-dir"


# ---------------------------------------------------------------------------------------------
# Copies share the arena; pickling is a typed error
# ---------------------------------------------------------------------------------------------


def test_copies_of_an_arena_or_stash_are_the_arena_itself(spill_dir):
    arena = spillarena.SpillArena(1 << 20, spill_dir)
    assert copy.copy(arena) is arena
    assert copy.deepcopy(arena) is arena
    assert copy.deepcopy({"arena": arena})["arena"] is arena
    stash = spillarena.make_in_memory_stash()
    assert copy.deepcopy(stash) is stash
    bound = copy.deepcopy(functools.partial(spillarena.checkpoint, arena=arena))
    assert bound.keywords["arena"] is arena


def test_pickling_an_arena_a_stash_or_an_enabled_model_is_a_typed_error(spill_dir):
    transformers = pytest.importorskip("transformers")
    from test_transformers import tiny_llama

    arena = spillarena.SpillArena(1 << 20, spill_dir)
    shared = spillarena.arena_stash.shared_arena_stash(arena)
    for thing in (arena, spillarena.make_in_memory_stash(), shared):
        with pytest.raises(spillarena.InvalidArgumentError, match="cannot be pickled"):
            pickle.dumps(thing)
    model = spillarena.enable(tiny_llama(), arena)
    layer = model.model.layers[0]  # holds the checkpoint function enable() gave it
    for thing in (layer, model):  # the model once failed first on transformers' embedding hook
        with pytest.raises(spillarena.InvalidArgumentError,
                           match=r"state_dict.*spillarena.disable"):
            pickle.dumps(thing)
        with pytest.raises(spillarena.InvalidArgumentError,
                           match=r"state_dict.*spillarena.disable"):
            torch.save(thing, io.BytesIO())
    torch.save(model.state_dict(), io.BytesIO())
    # What the error says to do works: a disabled model pickles and comes back whole.
    copy_back = pickle.loads(pickle.dumps(spillarena.disable(model)))
    assert not copy_back.is_activation_checkpointing
    for (name, p), (_, q) in zip(model.named_parameters(), copy_back.named_parameters()):
        assert torch.equal(p, q), name
    del transformers


def test_a_deep_copy_of_an_enabled_model_trains_with_the_same_gradients(spill_dir):
    pytest.importorskip("transformers")
    from test_transformers import LAYERS, step, tiny_llama

    torch.manual_seed(0)
    model = tiny_llama().train()
    arena = spillarena.SpillArena(16 << 20, spill_dir, keep_last=0)
    spillarena.enable(model, arena)
    ref_loss, ref_grads = step(model, seed=7)

    twin = copy.deepcopy(model)  # as EMA helpers and some trainers do
    assert twin.is_activation_checkpointing
    before = {**arena.stats(), **arena.stash_stats()}
    loss, grads = step(twin, seed=7)
    after = {**arena.stats(), **arena.stash_stats()}
    assert torch.equal(loss, ref_loss)
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        assert torch.equal(grads[name], ref_grads[name]), name
    # The copy spilled to the same arena, every layer.
    assert after["allocations"] - before["allocations"] == LAYERS
    assert after["restores"] - before["restores"] == LAYERS
    # The original still trains too, independently of the copy.
    loss_again, _ = step(model, seed=7)
    assert torch.equal(loss_again, ref_loss)
    assert_drained(arena)


# ---------------------------------------------------------------------------------------------
# Paths are bytes
# ---------------------------------------------------------------------------------------------


def test_a_directory_whose_name_is_not_utf8_is_usable_as_bytes_str_or_path(spill_dir):
    raw = os.fsencode(spill_dir) + b"/" + NOT_UTF8
    os.mkdir(raw)
    try:
        decoded = os.fsdecode(raw)  # surrogate escapes: what os.listdir gives back
        for spelling in (raw, decoded, pathlib.Path(decoded)):
            arena = spillarena.SpillArena(1 << 20, spelling)
            assert os.fsencode(arena.directory) == raw
            assert os.fsencode(arena.options()["directory"]) == raw
            assert "spill-" in repr(arena)
            x = torch.randn(8, 8, requires_grad=True)
            spillarena.checkpoint(torch.nn.functional.gelu, x, arena=arena).sum().backward()
            assert_drained(arena)
            del arena
            stash = spillarena.make_per_file_stash(spelling)
            stashed = stash.store(torch.arange(4.0))
            assert len(os.listdir(raw)) == 1
            assert torch.equal(stashed.restore(), torch.arange(4.0))
            assert os.listdir(raw) == []
    finally:
        os.rmdir(raw)


def test_a_missing_non_utf8_directory_is_a_directory_error_with_its_bytes(spill_dir):
    raw = os.fsencode(spill_dir) + b"/" + NOT_UTF8 + b"-missing"
    with pytest.raises(spillarena.errors.DirectoryError) as caught:
        spillarena.SpillArena(1 << 20, raw)
    assert os.fsencode(caught.value.path) == raw
    assert "\\xff" in str(caught.value)  # printable, bytes shown escaped
    with pytest.raises(spillarena.errors.DirectoryError):
        spillarena.make_per_file_stash(raw)


@pytest.mark.parametrize("directory", [3, 2.5, ["/tmp"], object()])
def test_a_directory_that_is_no_path_is_an_invalid_argument(directory):
    with pytest.raises(spillarena.InvalidArgumentError, match="string, bytes or path"):
        spillarena.SpillArena(1 << 20, directory)
    with pytest.raises(spillarena.InvalidArgumentError, match="string, bytes or path"):
        spillarena.make_per_file_stash(directory)


def test_special_files_as_directories_are_directory_errors(spill_dir):
    fifo = spill_dir / "fifo"
    os.mkfifo(fifo)
    try:
        for path in (fifo, "/dev/null"):
            with pytest.raises(spillarena.errors.DirectoryError):
                spillarena.SpillArena(1 << 20, path)
            with pytest.raises(spillarena.errors.DirectoryError):
                spillarena.make_per_file_stash(path)
    finally:
        os.unlink(fifo)


# ---------------------------------------------------------------------------------------------
# The per-file baseline on a full disk
# ---------------------------------------------------------------------------------------------

FULL_DISK_SCRIPT = textwrap.dedent(
    """
    import os, sys, torch, spillarena
    directory = sys.argv[1]
    before = sorted(os.listdir(directory))
    stash = spillarena.make_per_file_stash(directory)
    try:
        stash.store(torch.zeros(6 << 20))  # 24 MiB on a 16 MiB file system
    except spillarena.InsufficientSpaceError as e:
        assert e.path == directory, e.path
        assert e.needed_bytes >= 24 << 20, e.needed_bytes
        assert "No space left on device" in str(e) and "Free space there" in str(e), str(e)
    else:
        sys.exit("no error")
    assert sorted(os.listdir(directory)) == before, os.listdir(directory)
    small = stash.store(torch.arange(16.0))
    assert torch.equal(small.restore(), torch.arange(16.0))
    print("typed")
    """
)


def test_the_per_file_stash_on_a_full_disk_raises_typed_and_leaves_nothing(small_disk):
    # In a child: before the fix, LibTorch's writer aborted the whole process (SIGABRT).
    child = subprocess.run([sys.executable, "-c", FULL_DISK_SCRIPT, str(small_disk)],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
    assert child.stdout.strip() == "typed"


# ---------------------------------------------------------------------------------------------
# Arguments that would do nothing say so
# ---------------------------------------------------------------------------------------------


def test_torchs_checkpoint_arguments_apply_and_the_reentrant_form_says_what_it_ignores(arena):
    x = torch.randn(4, 4, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = spillarena.checkpoint(torch.sin, x, arena=arena, use_reentrant=False,
                                  determinism_check="none", debug=True, early_stop=False)
    # The default form is torch's: each applies, and spillarena says nothing (what torch says
    # is torch's).
    assert our_warnings(caught) == []
    y.sum().backward()
    with pytest.warns(UserWarning, match="early_stop and determinism_check apply to the default"):
        y = spillarena.checkpoint(torch.sin, x, arena=arena, use_reentrant=True,
                                  determinism_check="none", early_stop=False)
    y.sum().backward()


def test_arena_options_the_backing_or_io_mode_does_not_use_warn(spill_dir):
    with pytest.warns(UserWarning, match="does not use directory, io"):
        spillarena.SpillArena(1 << 20, spill_dir, backing="ram", io="direct")
    with pytest.warns(UserWarning, match="does not use staging_bytes"):
        spillarena.SpillArena(1 << 20, spill_dir, io="buffered", staging_bytes=1 << 20)
    with pytest.warns(UserWarning, match="does not use page_cache_limit_bytes"):
        spillarena.SpillArena(1 << 20, spill_dir, io="direct", page_cache_limit_bytes=1 << 20)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spillarena.SpillArena(1 << 20, spill_dir, io="direct", staging_bytes=1 << 20)
        spillarena.SpillArena(1 << 20, spill_dir, io="buffered", page_cache_limit_bytes=1 << 20)
        spillarena.SpillArena(1 << 20, backing="ram", verify_integrity=False, keep_last=0)
    assert our_warnings(caught) == []  # options that apply: silent
