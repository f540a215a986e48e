"""The package as a newcomer draws it: modules that import each other without a loop, a short
__all__, and every error class under its full name, spillarena.errors.X."""

import ast
import pathlib

import pytest

import spillarena
from spillarena import errors

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "python" / "spillarena"

# What a user catches at the top level: the base class, the sizing warning, and the three the
# README and docs/python_api.md show (a bad argument, a disk too small, an arena that is full
# under when_full="error").
CAUGHT_AT_THE_TOP = {"Error", "SpillArenaWarning", "InvalidArgumentError",
                     "InsufficientSpaceError", "ArenaExhaustedError"}


def module_name(path):
    """spillarena.x.y for PACKAGE/x/y.py; the package itself for an __init__.py."""
    parts = ("spillarena", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules():
    """{module name: path} of every module of the package's source, integrations included, and
    of those the build adds (the extension _C, _build_info: no imports of the package's)."""
    installed = pathlib.Path(spillarena.__file__).parent
    built = {"spillarena." + p.name.split(".")[0]: None for p in installed.iterdir()
             if p.suffix in (".py", ".so") and not (PACKAGE / p.name).exists()}
    return built | {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported_by(name, path, modules):
    """The package's modules ``path`` imports anywhere (also inside a function), by name."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = resolve(name, is_package, node.module, node.level)
            # "from . import arena" names a module; "from .arena import handle_of" does not.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                       for alias in node.names]
        else:
            continue
        found.update(target for target in targets if target in modules)
    return found


def resolve(name, is_package, module, level):
    """The absolute module of ``from <level dots><module> import ...`` written in ``name``."""
    if level == 0:
        return module
    parts = name.split(".") if is_package else name.split(".")[:-1]
    parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([module] if module else []))


def import_graph():
    modules = package_modules()
    return {name: imported_by(name, path, modules) if path else set()
            for name, path in modules.items()}


def a_cycle(graph):
    """One import loop of ``graph`` as [a, b, ..., a], or None (depth-first, white-grey-black)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_module_of_the_package_imports_one_that_imports_it_back():
    graph = import_graph()
    assert "spillarena.arena" in graph["spillarena.arena_stash"]  # the graph sees imports
    cycle = a_cycle(graph)
    assert cycle is None, "import loop: " + " -> ".join(cycle)


def test_the_cycle_check_sees_a_loop_through_a_function_level_import(tmp_path):
    (tmp_path / "a.py").write_text("from .b import f\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import g  # the dodge\n")
    modules = {"spillarena.a": tmp_path / "a.py", "spillarena.b": tmp_path / "b.py"}
    graph = {name: imported_by(name, path, modules) for name, path in modules.items()}
    assert a_cycle(graph) == ["spillarena.a", "spillarena.b", "spillarena.a"]


def test_relative_imports_resolve_from_modules_and_packages():
    assert resolve("spillarena.arena", False, "errors", 1) == "spillarena.errors"
    assert resolve("spillarena", True, "errors", 1) == "spillarena.errors"
    assert resolve("spillarena.integrations.axolotl", False, None, 2) == "spillarena"
    assert resolve("spillarena.integrations", True, "axolotl", 1) == (
        "spillarena.integrations.axolotl")


def test_the_package_exports_what_the_docs_count():
    # docs/python_api.md, "What spillarena exports": the names a user calls, counted there.
    assert len(spillarena.__all__) == 28, sorted(spillarena.__all__)
    assert len(set(spillarena.__all__)) == len(spillarena.__all__)
    assert "shared_arena_stash" not in spillarena.__all__  # internal, as in C++
    for name in spillarena.__all__:
        assert hasattr(spillarena, name), name


def test_only_the_errors_a_user_catches_are_exported_at_the_top():
    exported = {name for name in spillarena.__all__ if name in errors.__all__}
    assert exported == CAUGHT_AT_THE_TOP
    for name in CAUGHT_AT_THE_TOP:
        assert getattr(spillarena, name) is getattr(errors, name)


@pytest.mark.parametrize("name", sorted(errors.__all__))
def test_every_error_class_has_its_full_name(name):
    cls = getattr(spillarena.errors, name)
    assert cls.__module__ == "spillarena.errors" and cls.__qualname__ == name


def test_the_fields_of_the_cpp_structs_are_in_their_own_module():
    from spillarena import fields

    assert set(fields.__all__) == {"ARENA_OPTIONS", "ARENA_STATS", "STASH_OPTIONS",
                                   "STASH_STATS", "MAX_CAPACITY_BYTES", "MAX_STAGING_BYTES"}
    assert not set(fields.__all__) & set(spillarena.__all__)
    for name in fields.__all__:
        assert getattr(fields, name) is getattr(spillarena._C, name)


def test_each_stash_kind_is_a_module_of_its_own():
    from spillarena import arena_stash, in_memory_stash, per_file_stash, stash

    assert spillarena.make_arena_stash is arena_stash.make_arena_stash
    assert spillarena.make_in_memory_stash is in_memory_stash.make_in_memory_stash
    assert spillarena.make_per_file_stash is per_file_stash.make_per_file_stash
    assert (spillarena.TensorStash, spillarena.StashedTensor) == (stash.TensorStash,
                                                                    stash.StashedTensor)
