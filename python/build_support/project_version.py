"""scikit-build-core metadata plugin: the wheel's version is CMake's project version.

pyproject.toml names this module for the version field, so CMakeLists.txt's
``project(spillarena VERSION x.y.z)`` is the one place a release is numbered. The wheel once
carried its torch in a local label (0.1.0+torch2.13); it now works beside every torch from 2.11
on (Note [One wheel for every torch] in python/CMakeLists.txt), so the version names spillarena
alone.
"""

from __future__ import annotations

import re
from pathlib import Path

_CMAKE_LISTS = Path(__file__).resolve().parents[2] / "CMakeLists.txt"


def project_version() -> str:
    text = _CMAKE_LISTS.read_text(encoding="utf-8")
    match = re.search(r"project\(\s*spillarena\s+VERSION\s+([0-9.]+)", text)
    if not match:
        raise RuntimeError(f"no 'project(spillarena VERSION x.y.z' in {_CMAKE_LISTS}")
    return match.group(1)


def dynamic_metadata(field, settings=None, project=None):
    """The scikit-build-core hook, in the signature every release since 0.10 calls."""
    if settings:
        raise RuntimeError(f"project_version takes no settings, got {sorted(settings)}")
    if field == "version":
        return project_version()
    raise RuntimeError(f"project_version provides 'version', not {field!r}")
