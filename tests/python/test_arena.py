"""SpillArena from Python: options, stats, sizing, typed errors, the import-time torch check."""

import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import torch

import spillarena
from spillarena import fields
from conftest import assert_drained, open_fds


def test_stats_are_keyed_by_arena_stats_fields(spill_dir):
    arena = spillarena.SpillArena(4 << 20, spill_dir)
    stats = arena.stats()
    assert tuple(stats) == fields.ARENA_STATS
    for key in ("allocations", "bytes_in_use", "bytes_written", "bytes_read", "peak_bytes_in_use",
                "live_regions", "reuse_hits", "largest_free_block"):
        assert key in stats
    assert stats["capacity_bytes"] == 4 << 20 == arena.capacity_bytes
    assert arena.backing == "disk"
    assert pathlib.Path(arena.directory) == spill_dir
    assert arena.file_system_type not in ("tmpfs", "ramfs")
    assert repr(arena).startswith("<spillarena.SpillArena capacity_bytes=4194304")


def test_options_map_to_arena_options(spill_dir):
    arena = spillarena.SpillArena(4 << 20, directory=str(spill_dir),
                                  start_writeback_after_write=False, page_cache_limit_bytes=1 << 20)
    options = arena.options()
    assert tuple(options) == fields.ARENA_OPTIONS
    # The arena's keywords, then its stash's (spill::StashOptions, kept with the arena).
    assert fields.ARENA_OPTIONS[-len(fields.STASH_OPTIONS):] == fields.STASH_OPTIONS
    assert fields.STASH_OPTIONS == ("asynchronous", "prefetch_depth", "keep_last",
                                    "gds_buffer_bytes")
    assert tuple(arena.stash_stats()) == fields.STASH_STATS
    # io = gds's stats (Note [One registered staging buffer]): empty until a device input.
    gds_stats = ("gds_buffer_bytes", "gds_buffer_registered", "cufile_mode",
                 "cufile_bounce_bytes", "cufile_bytes_written", "cufile_bytes_read")
    assert fields.STASH_STATS[-len(gds_stats):] == gds_stats
    assert arena.stash_stats()["cufile_mode"] == ""
    assert arena.stash_stats()["cufile_bounce_bytes"] == 0
    assert not set(fields.STASH_STATS) & set(fields.ARENA_STATS)
    assert options["start_writeback_after_write"] is False
    assert options["page_cache_limit_bytes"] == 1 << 20
    ram = spillarena.SpillArena(1 << 20, backing="ram")
    assert ram.backing == "ram" and ram.stats()["capacity_bytes"] == 1 << 20


def test_bytes_for_layer_inputs_matches_the_arena():
    per_input = 1 * 64 * 128 * 2
    assert spillarena.bytes_for_layer_inputs(4, (1, 64, 128), torch.bfloat16) == 4 * per_input
    assert spillarena.bytes_for_layer_inputs(4, (1, 64, 128), 2) == 4 * per_input
    assert spillarena.bytes_for_layer_input((1, 64, 128), torch.float32) == 2 * per_input
    with pytest.raises(spillarena.InvalidArgumentError, match="is 0"):
        spillarena.bytes_for_layer_inputs(0, (1, 64, 128), torch.float32)
    with pytest.raises(spillarena.InvalidArgumentError, match="batch"):
        spillarena.bytes_for_layer_inputs(1, (-1, 64, 128), torch.float32)
    with pytest.raises(spillarena.InvalidArgumentError):
        spillarena.bytes_for_layer_inputs(1, (1, 64), torch.float32)


@pytest.mark.parametrize("capacity", [0, -1, 2.5, True, "1G", fields.MAX_CAPACITY_BYTES * 2])
def test_a_bad_capacity_is_an_invalid_argument(capacity, spill_dir):
    with pytest.raises(spillarena.InvalidArgumentError) as caught:
        spillarena.SpillArena(capacity, spill_dir)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("options", [{"no_such_option": 1}, {"backing": "tape"}, {"io": 3},
                                     {"start_writeback_after_write": 1}, {"keep_last": -1}])
def test_a_bad_option_is_an_invalid_argument(options, spill_dir):
    with pytest.raises(spillarena.InvalidArgumentError):
        spillarena.SpillArena(1 << 20, spill_dir, **options)


def test_capacity_given_twice_is_a_type_error_as_in_python(spill_dir):
    with pytest.raises(TypeError):
        spillarena.SpillArena(1 << 20, spill_dir, capacity_bytes=5)


def memory_backed_directory():
    with open("/proc/mounts") as mounts:
        for line in mounts:
            _, mount_point, fs_type = line.split()[:3]
            if fs_type == "tmpfs" and os.access(mount_point, os.W_OK):
                return mount_point
    return None


def test_a_tmpfs_directory_is_refused_and_leaks_nothing():
    directory = memory_backed_directory()
    if directory is None:
        pytest.skip("no writable tmpfs mount")
    before_files, before_fds = set(os.listdir(directory)), open_fds()
    with pytest.raises(spillarena.errors.MemoryBackedDirectoryError) as caught:
        spillarena.SpillArena(1 << 20, directory)
    assert caught.value.path == directory and caught.value.file_system_type == "tmpfs"
    assert "saves no memory" in str(caught.value)
    assert set(os.listdir(directory)) == before_files and open_fds() == before_fds
    arena = spillarena.SpillArena(1 << 20, directory, allow_memory_backed_directory=True)
    assert arena.file_system_type == "tmpfs"


def test_the_old_spelling_of_allow_memory_backed_directory_still_works_with_a_warning():
    directory = memory_backed_directory()
    if directory is None:
        pytest.skip("no writable tmpfs mount")
    with pytest.warns(DeprecationWarning, match="allow_memory_backed_directory"):
        arena = spillarena.SpillArena(1 << 20, directory, allow_ram_backed_directory=True)
    assert arena.options()["allow_memory_backed_directory"] is True


def test_too_large_a_capacity_is_insufficient_space_and_leaks_nothing(spill_dir):
    before = open_fds()
    with pytest.raises(spillarena.InsufficientSpaceError) as caught:
        spillarena.SpillArena(fields.MAX_CAPACITY_BYTES // 2, spill_dir)
    e = caught.value
    assert e.needed_bytes == fields.MAX_CAPACITY_BYTES // 2
    assert 0 < e.available_bytes < e.needed_bytes
    assert str(e.needed_bytes) in str(e)
    assert open_fds() == before


@pytest.mark.parametrize("empty", ["", b""])
def test_an_empty_directory_is_refused_not_taken_for_the_default(empty):
    words = "an empty path names no directory; pass directory=None or leave it out"
    with pytest.raises(spillarena.InvalidArgumentError, match=words):
        spillarena.SpillArena(1 << 20, empty)
    with pytest.raises(spillarena.InvalidArgumentError, match=words):
        spillarena.AutomaticArena(empty)


@pytest.mark.parametrize("staging", [0, 1, 4095])
def test_a_staging_pool_below_a_page_is_refused_like_zero(spill_dir, staging):
    with pytest.raises(spillarena.InvalidArgumentError, match=r"use 4\.00 KiB to 64\.00 GiB"):
        spillarena.SpillArena(1 << 20, spill_dir, staging_bytes=staging)


def test_a_missing_directory_is_a_directory_error(spill_dir):
    with pytest.raises(spillarena.errors.DirectoryError) as caught:
        spillarena.SpillArena(1 << 20, spill_dir / "missing")
    assert caught.value.errno != 0


def test_an_exhausted_arena_raises_with_when_full_error_and_stays_usable(spill_dir):
    arena = spillarena.SpillArena(1 << 20, spill_dir, keep_last=0, when_full="error", grow=False)
    layer = torch.nn.Linear(1024, 1024)
    big = torch.randn(512, 1024, requires_grad=True)  # 2 MiB
    with pytest.raises(spillarena.ArenaExhaustedError) as caught:
        spillarena.checkpoint(layer, big, arena=arena)
    assert caught.value.requested_bytes == big.nbytes
    assert caught.value.free_bytes == 1 << 20
    assert "[512, 1024]" in str(caught.value)
    assert_drained(arena)
    small = torch.randn(4, 1024, requires_grad=True)
    spillarena.checkpoint(layer, small, arena=arena).sum().backward()
    assert small.grad is not None
    assert_drained(arena)


@pytest.mark.parametrize("first", [None, 3, "hidden"])
def test_a_call_without_a_tensor_is_torchs_and_a_bad_arena_an_invalid_argument(first, arena):
    # as torch.utils.checkpoint takes it: nothing to spill (Note [Which argument spills])
    assert spillarena.checkpoint(torch.nn.Identity(), first, arena=arena) == first
    with pytest.raises(spillarena.InvalidArgumentError, match="arena= must be"):
        spillarena.checkpoint(torch.nn.Identity(), torch.ones(2), arena=42)
    assert arena.stats()["allocations"] == 0


ERROR_FIELDS = {
    "Error": {},
    "InvalidArgumentError": {},
    "DirectoryError": {"path": "/nowhere", "errno": 2},
    "MemoryBackedDirectoryError": {"path": "/dev/shm", "file_system_type": "tmpfs"},
    "InsufficientSpaceError": {"path": "/spill", "needed_bytes": 2048, "available_bytes": 1024},
    "PreallocationError": {"path": "/spill", "errno": 95},
    "PathError": {"path": "/spill", "errno": 13},
    "ArenaExhaustedError": {"requested_bytes": 4096, "free_bytes": 1024, "largest_free_block": 512},
    "MovedFromRegionError": {},
    "IoError": {"errno": 5, "op": "read", "offset": 4096, "bytes": 8192},
    "IntegrityError": {"region_offset": 4096, "offset_in_region": 0, "bytes": 8192,
                       "expected_hash": 1, "found_hash": 2},
    "GdsUnavailableError": {"library": "libcufile.so.0", "cufile_status": 5011},
    "ForkedProcessError": {"creator_pid": 100, "current_pid": 101},
    "CheckpointError": {},
}


@pytest.mark.parametrize("name", sorted(ERROR_FIELDS))
def test_every_cpp_error_becomes_its_python_class_with_message_and_fields(name):
    cls = getattr(spillarena.errors, name)
    assert issubclass(cls, spillarena.Error) and issubclass(cls, RuntimeError)
    with pytest.raises(cls) as caught:
        spillarena._C._throw(name, f"spill: the message of {name}")
    assert type(caught.value) is cls
    assert str(caught.value) == f"spill: the message of {name}"
    for field, value in ERROR_FIELDS[name].items():
        assert getattr(caught.value, field) == value


def test_import_fails_clearly_under_a_torch_older_than_2_11():
    code = "import torch; torch.__version__ = '2.10.1+cu128'; import spillarena"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    assert "needs torch >= 2.11, but torch 2.10.1+cu128 is installed" in result.stderr
    assert "pip install 'torch>=2.11'" in result.stderr


@pytest.mark.parametrize("version", ["2.11.0", "2.12.1+cpu", "2.15.0+cu130", "3.0.0"])
def test_import_accepts_any_torch_from_2_11(version):
    # One wheel for every torch (Note [One wheel for every torch] in python/CMakeLists.txt): the
    # import check is a floor, not a pin.
    code = f"import torch; torch.__version__ = {version!r}; import spillarena; print('ok')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


def test_the_extension_links_no_torch():
    so = spillarena._C.__file__
    undefined = subprocess.run(["nm", "-D", "--undefined-only", so], capture_output=True,
                               text=True, check=True).stdout
    named = [line for line in undefined.splitlines()
             if "torch" in line.lower() or "c10" in line.lower()]
    assert named == [], named[:10]
    linked = subprocess.run(["ldd", so], capture_output=True, text=True).stdout
    assert "libtorch" not in linked and "libc10" not in linked, linked


def _reopen_spill_file(directory):
    """The arena's unnamed spill file, opened once more through /proc/self/fd."""
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith(f"{directory}/"):
            return os.open(f"/proc/self/fd/{name}", os.O_RDWR)
    raise AssertionError(f"no descriptor refers to a file in {directory}")


def test_a_spill_file_changed_behind_the_arena_raises_integrity_error_in_backward(spill_dir):
    arena = spillarena.SpillArena(8 << 20, spill_dir, keep_last=0, asynchronous=False)
    assert arena.options()["verify_integrity"] is True
    layer = torch.nn.Linear(256, 256)
    x = torch.randn(4, 256, requires_grad=True)
    loss = spillarena.checkpoint(layer, x, arena=arena).sum()
    fd = _reopen_spill_file(spill_dir)
    try:
        byte = os.pread(fd, 1, 0)
        os.pwrite(fd, bytes([byte[0] ^ 0xFF]), 0)
    finally:
        os.close(fd)
    with pytest.raises(spillarena.errors.IntegrityError) as caught:
        loss.backward()
    assert caught.value.region_offset == 0 and caught.value.bytes == 4 * 256 * 4
    assert caught.value.expected_hash != caught.value.found_hash
    assert layer.weight.grad is None and x.grad is None
    assert arena.stats()["integrity_failures"] == 1


def test_path_errors_share_one_base():
    assert issubclass(spillarena.errors.DirectoryError, spillarena.errors.PathError)
    assert issubclass(spillarena.errors.PreallocationError, spillarena.errors.PathError)
    with pytest.raises(spillarena.errors.PathError):
        spillarena.SpillArena(1 << 20, directory="/nonexistent/spillarena")


def test_sizes_may_be_numpy_or_tensor_integers_but_never_floats_or_bools(spill_dir):
    np = pytest.importorskip("numpy")
    assert spillarena.SpillArena(np.int64(1 << 20), spill_dir).capacity_bytes == 1 << 20
    assert spillarena.SpillArena(torch.tensor(1 << 20), spill_dir).capacity_bytes == 1 << 20
    for bad in (np.float64(1 << 20), torch.tensor(1.0 * (1 << 20)), np.bool_(True)):
        with pytest.raises(spillarena.InvalidArgumentError):
            spillarena.SpillArena(bad, spill_dir)


def test_a_directory_with_a_nul_byte_is_refused(spill_dir):
    with pytest.raises(spillarena.InvalidArgumentError, match="NUL"):
        spillarena.SpillArena(1 << 20, str(spill_dir) + "\0x")


def test_the_staging_pool_never_exceeds_the_arena(spill_dir):
    arena = spillarena.SpillArena(1 << 20, spill_dir, io="direct",
                                  staging_bytes=fields.MAX_STAGING_BYTES)
    assert arena.stats()["staging_bytes"] <= 1 << 20


@pytest.mark.parametrize("make", [
    lambda: torch.eye(4).to_sparse(), lambda: torch.empty(4, device="meta"),
    lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
])
def test_tensors_without_dense_data_are_an_invalid_argument(make, arena):
    with pytest.raises(spillarena.InvalidArgumentError, match="dense"):
        spillarena.arena_stash.shared_arena_stash(arena).store(make())


def test_one_handle_restored_and_freed_from_two_threads_never_crashes(arena):
    stash = spillarena.arena_stash.shared_arena_stash(arena)
    source = torch.randn(1 << 20)
    for i in range(20):
        handle = stash.store(source)
        results = []

        def restore(handle=handle, results=results):
            try:
                results.append(torch.equal(handle.restore(), source))
            except spillarena.errors.CheckpointError:
                results.append("refused")

        thread = threading.Thread(target=restore)
        thread.start()
        if i % 2:
            handle.free()
        thread.join()
        handle.free()
        assert results in ([True], ["refused"])


def test_the_host_budget_is_a_keyword_with_typed_errors(spill_dir):
    arena = spillarena.SpillArena(4 << 20, spill_dir, host_pool_bytes=1 << 20,
                                  when_pool_full="keep_on_device")
    assert arena.options()["host_pool_bytes"] == 1 << 20
    assert arena.options()["when_pool_full"] == "keep_on_device"
    for bad in (0, 100):
        with pytest.raises(spillarena.InvalidArgumentError, match="host_pool_bytes"):
            spillarena.SpillArena(4 << 20, spill_dir, host_pool_bytes=bad)
    with pytest.raises(spillarena.InsufficientSpaceError, match="host_pool_bytes"):
        spillarena.SpillArena(4 << 20, spill_dir, host_pool_bytes=1 << 50)
    with pytest.raises(spillarena.InvalidArgumentError, match="when_pool_full"):
        spillarena.SpillArena(4 << 20, spill_dir, when_pool_full="drop")


def test_stash_stats_span_steps_and_bound_the_bytes_in_flight(spill_dir):
    budget = 2 * 64 * 64 * 4  # two layer inputs
    arena = spillarena.SpillArena(8 << 20, spill_dir, keep_last=0, host_pool_bytes=budget)
    weights = [torch.randn(64, 64, requires_grad=True) for _ in range(6)]
    for _ in range(2):
        x = torch.randn(64, 64, requires_grad=True)
        for w in weights:
            x = spillarena.checkpoint(lambda t, w=w: torch.tanh(t @ w), x, arena=arena)
        x.sum().backward()
    stats = arena.stash_stats()
    assert tuple(stats) == tuple(spillarena.make_arena_stash(arena).stats())
    assert stats["inputs_stored"] == 12
    assert stats["peak_host_bytes_in_flight"] <= budget
    assert stats["device_bytes_held"] == 0
    deadline = time.monotonic() + 10  # queued writes' completions land on the progress thread
    while arena.stash_stats()["host_bytes_in_flight"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert arena.stash_stats()["host_bytes_in_flight"] == 0
    assert_drained(arena)


def test_make_arena_stash_takes_the_stash_options(spill_dir):
    arena = spillarena.SpillArena(8 << 20, spill_dir, keep_last=2)
    assert arena.options()["keep_last"] == 2
    x = torch.randn(1024)
    stash = spillarena.make_arena_stash(arena, keep_last=0, asynchronous=False)
    held = stash.store(x)
    assert arena.stats()["allocations"] == 1  # keep_last 0, synchronous: written by store()
    assert arena.stats()["bytes_written"] == x.nbytes
    assert torch.equal(held.restore(), x)
    kept = spillarena.make_arena_stash(arena).store(x)  # the arena's keep_last 2: not spilled
    assert arena.stats()["allocations"] == 1
    assert torch.equal(kept.restore(), x)
    with pytest.raises(spillarena.InvalidArgumentError, match="unknown option 'io'"):
        spillarena.make_arena_stash(arena, io="direct")
    with pytest.raises(spillarena.InvalidArgumentError):
        spillarena.make_arena_stash(arena, prefetch_depth=-1)


def test_the_extension_is_one_file_for_every_cpython():
    # Note [One file for every CPython] in python/src/module.cc: the limited API's file name, and
    # abi3audit (scripts/setup.sh installs it) finds nothing outside CPython 3.10's limited API.
    so = spillarena._C.__file__
    assert so.endswith("_C.abi3.so"), so
    pytest.importorskip("abi3audit")
    audit = subprocess.run([sys.executable, "-m", "abi3audit", "--strict", "--assume-minimum-abi3",
                            "3.10", "--report", so], capture_output=True, text=True)
    assert audit.returncode == 0, audit.stdout[-2000:] + audit.stderr[-2000:]
    assert '"non_abi3_symbols": []' in audit.stdout, audit.stdout[-2000:]


@pytest.mark.parametrize("call", [
    lambda: spillarena._C._arena_stats(object()),
    lambda: spillarena._C._chain_stats(spillarena._C._arena_new(4096, None, {"backing": "ram"})),
    lambda: spillarena._C._stored_restore(None),
    lambda: spillarena.make_arena_stash("not an arena"),
    lambda: spillarena.arena_stash.shared_arena_stash(spillarena.make_in_memory_stash()),
])
def test_a_wrong_handle_is_a_typed_error_not_a_crash(call):
    with pytest.raises(spillarena.InvalidArgumentError):
        call()


def test_a_python_error_raised_by_the_extension_keeps_its_type():
    # Note [Python errors cross C++ as exceptions]: per-file store of something not bytes raises
    # the TypeError CPython set, not a RuntimeError of ours.
    files = spillarena._C._per_file_files(tempfile.mkdtemp())
    with pytest.raises(TypeError):
        spillarena._C._per_file_store(files, "text, not bytes")
    with pytest.raises(spillarena.InvalidArgumentError, match="takes 2 arguments"):
        spillarena._C._per_file_store(files)
