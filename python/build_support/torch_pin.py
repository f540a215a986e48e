"""scikit-build-core metadata plugin: a spillarena build is pinned to the torch it is built against.

pyproject.toml names this module for two fields:
  version       "<CMake project version>+torch<X>.<Y>", e.g. 0.1.0+torch2.13
  dependencies  ["torch==<X>.<Y>.*"], which a local label such as 2.13.0+cpu still satisfies

Note [A wheel is pinned to its torch release]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The extension calls torch's C++ API, which changes between torch releases (see Note [Build against
the installed torch] in python/CMakeLists.txt), so a wheel built against torch 2.13 cannot import
under 2.12 or 2.14. Saying so in the metadata lets pip refuse the mismatch before anything is
installed, instead of an ImportError after; the version's local label tells two wheels of one
spillarena apart by their torch. The pin is X.Y.*, not the exact release: torch keeps its C++ API
within a release line, and the CPU and CUDA builds of one release (2.11.0+cpu, 2.11.0+cu128) export
the same symbols spillarena uses (it names no CUDA symbol). The torch version is read from the
installed distribution's metadata without importing torch, so a build environment whose torch
cannot load (a CUDA build on a machine without the NVIDIA libraries) still builds.
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

_CMAKE_LISTS = Path(__file__).resolve().parents[2] / "CMakeLists.txt"


def torch_release() -> tuple[int, int]:
    try:
        installed = version("torch")
    except PackageNotFoundError:
        raise RuntimeError(
            "spillarena builds against the torch installed in the Python running the build, and "
            "that Python has none: install torch first, then build with "
            "pip install --no-build-isolation . (or scripts/build_wheel.sh)"
        ) from None
    match = re.match(r"(\d+)\.(\d+)", installed)
    if not match:
        raise RuntimeError(f"no release in the installed torch's version {installed!r}")
    return int(match.group(1)), int(match.group(2))


def project_version() -> str:
    text = _CMAKE_LISTS.read_text(encoding="utf-8")
    match = re.search(r"project\(\s*spillarena\s+VERSION\s+([0-9.]+)", text)
    if not match:
        raise RuntimeError(f"no 'project(spillarena VERSION x.y.z' in {_CMAKE_LISTS}")
    return match.group(1)


def dynamic_metadata(field, settings=None, project=None):
    """The scikit-build-core hook, in the signature every release since 0.10 calls."""
    if settings:
        raise RuntimeError(f"torch_pin takes no settings, got {sorted(settings)}")
    major, minor = torch_release()
    if field == "version":
        return f"{project_version()}+torch{major}.{minor}"
    if field == "dependencies":
        return [f"torch=={major}.{minor}.*"]
    raise RuntimeError(f"torch_pin provides 'version' and 'dependencies', not {field!r}")
