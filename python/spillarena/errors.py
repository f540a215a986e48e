"""The exceptions of spillarena: one class per C++ ``spill::Error`` type, same names, same messages.

The C++ extension raises these and sets the numbers each C++ error carries as attributes::

    try:
        arena = spillarena.SpillArena(64 << 30, "/mnt/nvme")
    except spillarena.InsufficientSpaceError as e:
        print(e, e.needed_bytes, e.available_bytes)
    except spillarena.Error as e:          # any other spillarena problem
        print(e)

``Error``, ``SpillArenaWarning``, ``InvalidArgumentError``, ``InsufficientSpaceError`` and
``ArenaExhaustedError`` are in ``spillarena.__all__`` as well; every class's name is
``spillarena.errors.X``.

The classes are made here from the extension's one table of error types (names, bases,
docstrings; see Note [One table of error classes] in python/src/errors_binding.cc): ``Error``
is a ``RuntimeError``, ``InvalidArgumentError`` also a ``ValueError``.
``help(spillarena.errors.IoError)`` shows what each carries.
"""

import builtins

from . import _C


def _make_classes():
    made = {}
    for name, base, builtin, doc in _C._error_classes():
        bases = (made[base],) if base is not None else (RuntimeError,)
        if builtin:
            bases += (getattr(builtins, builtin),)
        namespace = {"__doc__": doc, "__module__": __name__, "__qualname__": name}
        made[name] = type(name, bases, namespace)
    return made


_classes = _make_classes()
globals().update(_classes)



class SpillArenaWarning(UserWarning):
    """An arena's sizing warning, given once per arena: the first input that found no room (it
    stays in memory for that step), the first grow the disk refused, and an AutomaticArena's disk
    without room for any arena (its inputs stay in memory until a step finds room). ``stats()``
    counts them (overflows, grow_failures); ``warnings.filterwarnings("error", category=...)``
    makes them errors."""


__all__ = [*_classes, "SpillArenaWarning"]
