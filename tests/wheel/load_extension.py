"""Loads the wheel's extension in a CPython that has no torch and runs what needs none (an arena
in memory and on disk, the options and stats, a typed error, the per-file baseline's files): the
cp310-abi3 file works in every CPython from 3.10 on (Note [One file for every CPython] in
python/src/module.cc). tests/wheel/wheel_check.sh runs it with each CPython it finds::

    python3.13 tests/wheel/load_extension.py UNPACKED_WHEEL/spillarena SCRATCH_DIR
"""

import importlib
import sys
import types

package_dir, scratch = sys.argv[1], sys.argv[2]
# The package's directory without its __init__ (which imports torch): _C and errors.py only.
package = types.ModuleType("spillarena")
package.__path__ = [package_dir]
sys.modules["spillarena"] = package
_C = importlib.import_module("spillarena._C")
errors = importlib.import_module("spillarena.errors")
assert _C.__file__.endswith(".abi3.so"), _C.__file__

in_memory = _C._arena_new(1 << 20, None, {"backing": "ram"})
assert _C._arena_stats(in_memory)["capacity_bytes"] == 1 << 20
on_disk = _C._arena_new(1 << 20, scratch, {"io": "buffered"})
assert _C._arena_describe(on_disk)["directory"] == scratch
assert _C._arena_options(on_disk)["io"] == "buffered"
for bad in (-1, 2.5, True, "1"):
    try:
        _C._arena_new(bad, None, {"backing": "ram"})
    except errors.InvalidArgumentError as e:
        assert "capacity_bytes" in str(e), e
    else:
        raise SystemExit(f"capacity_bytes={bad!r} was accepted")
files = _C._per_file_files(scratch)
stored = _C._per_file_store(files, b"spilled bytes")
assert _C._per_file_restore(stored) == b"spilled bytes"
del in_memory, on_disk, stored, files
print(f"load_extension: CPython {sys.version.split()[0]}: the extension loads and works")
