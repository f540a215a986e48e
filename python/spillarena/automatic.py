"""spillarena.AutomaticArena: an arena made at the first stored input, sized from it.

    spillarena.enable(model)                      # an AutomaticArena of its own, no numbers
    h = spillarena.checkpoint(block, h)           # the process's default_arena()
    spillarena.enable(model, spillarena.AutomaticArena("/mnt/nvme", when_full="error"))
    spillarena.arena_of(model).stats()            # overflows, grows, capacity_needed_bytes, ...

Nothing is allocated before the first checkpointed layer runs with grad. Then the arena is made
with room for that input's bytes times the layers expected (the checkpointed layers enable()
found, else DEFAULT_LAYERS) times growth_margin; it grows when a step needs more and keeps what
finds no room in memory meanwhile (Note [Growing the arena] in src/core/arena/arena_growth.cc).
A disk with no room for any arena keeps the inputs in memory until one can be made: Note [No
room for the first arena].
"""

import os
import threading
import warnings
import weakref

from . import _C
from . import arena as _arena
from . import arguments as _arguments
from .errors import InsufficientSpaceError, InvalidArgumentError, SpillArenaWarning
from .in_memory_stash import make_in_memory_stash
from .shared_on_copy import SharedOnCopy

# A plain spillarena.checkpoint() without enable() cannot know how many layers it will see: the
# first arena has room for this many inputs of the first one's size (at least MIN_FIRST_BYTES),
# and grows after the first step that needed more.
DEFAULT_LAYERS = 16
MIN_FIRST_BYTES = 64 << 20
_PAGE = _C.PAGE_SIZE_BYTES  # the smallest arena: one region of one page

# Note [No room for the first arena]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A disk with less room than the first guess gets a smaller arena, down to one page, whose
# overflows and grows then do the rest. A disk with not even a page free gets none: under
# when_full="keep_in_memory" (the default) that is an overflow, not an error. The input stays in
# memory, as in-RAM checkpointing holds it (the C++ in-memory stash, behind _HeldInMemory), it is
# counted in stats() (overflows, overflow_bytes) and one SpillArenaWarning names the directory
# and its free space. The arena is tried again at the next empty moment: a first input while no
# input of this AutomaticArena is held in memory for lack of an arena, that is the first input
# of the next step. Not in the middle of a step: its inputs would then live in two places, and
# the arena would be sized from whichever input came when the disk happened to have room. (Two
# threads checkpointing through one AutomaticArena can still split a step: one may make the
# arena between another's finding none and its input's registration as held. Harmless: each
# input is restored from where it went.)
# Making the AutomaticArena on a full disk is no error either: the page-sized probe that checks
# its settings finds no room, after every check but the room has passed, and one in memory
# stands in for it. With when_full="error" every refusal stays InsufficientSpaceError.


def _no_room_on_disk(error):
    # The memory checks (staging, host pool) raise the same class with a "<...>" pseudo-path.
    return not str(error.path).startswith("<")


def _zeros(stats):
    """``stats`` with every value zero ("" for the notes): an arena's stats before it exists."""
    return {key: type(value)() for key, value in stats.items()}


def _probe(directory, options):
    """(directory, resolved options, zero stats) of an arena made with ``options``, from a
    page-sized probe: a bad setting is its typed error now, and nothing of it stays (its file
    never had a name). A disk without a page free: Note [No room for the first arena]."""
    try:
        probe = _arena.SpillArena(_PAGE, directory, **options)
        directory = probe.directory or None  # the RAM backing has none
        return directory, probe.options(), _zeros(probe.stats())
    except InsufficientSpaceError as e:
        if not _no_room_on_disk(e) or options.get("when_full") == "error":
            raise
        in_memory = {k: options[k] for k in ("when_full", "grow", "growth_margin") if k in options}
        probe = _arena.SpillArena(_PAGE, None, backing="ram", **in_memory)
        return e.path, probe.options(), _zeros(probe.stats())


class _HeldInMemory:
    """A layer input its AutomaticArena keeps in memory for lack of an arena: the in-memory
    stash's StashedTensor, on the arena's list of held inputs until it is freed."""

    def __init__(self, stashed, owner):
        self._stashed, self._owner = stashed, owner

    def restore(self):
        return self._stashed.restore()

    def free(self):
        self._stashed.free()
        self._owner._release(self)


class _NoArenaYet:
    """The stash spillarena.checkpoint gets from an AutomaticArena that has no arena yet (Note
    [No room for the first arena]): each input stays in memory and counts as an overflow. Made
    per call, so the AutomaticArena holds no reference back to itself."""

    def __init__(self, owner):
        self._owner = owner

    spills = False  # malloc's policy stays off

    @property
    def name(self):
        return self._owner._in_memory.name

    def store(self, tensor, *, what="layer input"):
        held = _HeldInMemory(self._owner._in_memory.store(tensor, what=what), self._owner)
        self._owner._hold(held, tensor.numel() * tensor.element_size())
        return held


class AutomaticArena(SharedOnCopy):
    """A SpillArena made at the first stored input, sized from it; then that arena.

    ``directory`` and ``options`` are SpillArena's (``when_full``, ``grow``, ``growth_margin``,
    ``io``, ...) and are checked now: a missing or memory-backed directory or a bad option is a
    typed error here, not at the first step. ``layers``: the inputs one step is expected to
    store (enable() passes the layers it checkpoints); None: DEFAULT_LAYERS, at least
    MIN_FIRST_BYTES. A disk with no room for an arena is no error under the default
    when_full="keep_in_memory": the inputs stay in memory until a step starts with room there
    (Note [No room for the first arena]). With when_full="error" a step whose inputs find no room
    raises, and the arena grows only to what that step reached: a model may fail several steps
    before it fits. Copies share it; it cannot be pickled."""

    _pickle_refusal = (
        "spillarena: an AutomaticArena cannot be pickled: its arena is an open spill file of "
        "this process. Save the model's state_dict(), or call spillarena.disable(model) first"
    )

    def __init__(self, directory=None, *, layers=None, **options):
        if "capacity_bytes" in options:
            raise InvalidArgumentError(
                "spillarena.AutomaticArena sizes itself from the first input; pass a capacity to "
                "spillarena.SpillArena(capacity_bytes, ...) to preallocate one instead"
            )
        count = None if layers is None else _arguments.integer(layers)
        if layers is not None and (count is None or count < 1):
            raise InvalidArgumentError(
                f"spillarena.AutomaticArena: layers must be an integer >= 1, got {layers!r}"
            )
        layers = count
        self.directory, resolved, self._zero_stats = _probe(directory, options)
        self.options = dict(options)
        self.layers = layers
        self._margin = resolved["growth_margin"]
        self._keeps_in_memory = resolved["when_full"] == "keep_in_memory"
        self._lock = threading.Lock()
        self._arena = None
        self._in_memory = make_in_memory_stash()
        # _HeldInMemory not yet freed: added and discarded under _lock; garbage collection also
        # drops entries (under the GIL)
        self._held = weakref.WeakSet()
        self._overflows = 0  # inputs kept in memory for lack of an arena; GUARDED_BY(_lock)
        self._overflow_bytes = 0  # GUARDED_BY(_lock)
        self._warned = False  # GUARDED_BY(_lock)

    @property
    def arena(self):
        """The SpillArena, once the first input made it; None before."""
        return self._arena

    def stats(self):
        """The arena's stats() (a dict), its overflows and overflow_bytes counting also the
        inputs kept in memory before it could be made; {} before the first input; the same keys,
        zero but those two, while a disk without room has kept it from being made."""
        with self._lock:
            arena, overflows, overflow_bytes = self._arena, self._overflows, self._overflow_bytes
        if arena is None:
            if not overflows:
                return {}
            return {**self._zero_stats, "overflows": overflows, "overflow_bytes": overflow_bytes}
        stats = arena.stats()
        stats["overflows"] += overflows
        stats["overflow_bytes"] += overflow_bytes
        return stats

    def first_capacity_bytes(self, tensor):
        """The capacity the first arena gets for a first input like ``tensor``: that many
        inputs as the arena reserves them (pages, size classes), with the growth margin, as a
        grow sizes it (spill::capacity_with_margin)."""
        one = _C._bytes_for_layer_inputs(1, (1, 1, max(1, tensor.numel())), tensor.element_size())
        needed = min(one * (self.layers or DEFAULT_LAYERS), _C.MAX_CAPACITY_BYTES)  # no overflow
        capacity = _C._capacity_with_margin(needed, self._margin)
        return capacity if self.layers is not None else max(capacity, MIN_FIRST_BYTES)

    def arena_for(self, tensor):
        """Where ``tensor`` (a layer input) goes: the arena, made now when this is the first
        input of a step and there is none yet; else a stash that keeps it in memory (Note [No
        room for the first arena])."""
        arena = self._arena
        if arena is not None:
            return arena
        with self._lock:
            if self._arena is None and not self._held:
                self._arena = self._make(self.first_capacity_bytes(tensor))
            return self._arena if self._arena is not None else _NoArenaYet(self)

    def _make(self, capacity):
        """A SpillArena of ``capacity`` bytes, or less where the disk has less room; None when
        it has not a page (Note [No room for the first arena])."""
        try:
            return self._make_fitting(capacity)
        except InsufficientSpaceError as e:
            if not self._keeps_in_memory or not _no_room_on_disk(e):
                raise
            self._warn_no_room(capacity, e.available_bytes)
            return None

    def _make_fitting(self, capacity):
        # What does not fit in a smaller arena stays in memory, and the overflow warning says
        # how much room is missing.
        try:
            return _arena.SpillArena(capacity, self.directory, **self.options)
        except InsufficientSpaceError as e:
            fits = max(_PAGE, min(capacity, e.available_bytes * 9 // 10) // _PAGE * _PAGE)
            if fits >= capacity:
                raise
            try:
                return _arena.SpillArena(fits, self.directory, **self.options)
            except InsufficientSpaceError:
                return _arena.SpillArena(_PAGE, self.directory, **self.options)

    def _warn_no_room(self, capacity, available_bytes):
        if self._warned:
            return
        self._warned = True
        warnings.warn(
            f"spillarena: no room for an arena in {self.directory!r}: "
            f"{_C._bytes_with_units(available_bytes)} free, the first arena needs "
            f"{_C._bytes_with_units(capacity)} (one page at least). Layer inputs stay in memory, "
            "as in-RAM checkpointing holds them, and the arena is made at the first step that "
            "finds room there; free space there or choose another directory "
            "(AutomaticArena(directory) or $SPILL_DIR). Counted in stats(): overflows",
            SpillArenaWarning,
            stacklevel=1,  # here, as the store's own warnings name where they were raised
        )

    def _hold(self, held, bytes_):
        with self._lock:
            self._held.add(held)
            self._overflows += 1
            self._overflow_bytes += bytes_

    def _release(self, held):
        with self._lock:
            self._held.discard(held)

    def __repr__(self):
        made = repr(self._arena) if self._arena is not None else "not made yet"
        return f"<spillarena.AutomaticArena directory={self.directory!r} {made}>"



_default = None
_default_lock = threading.Lock()


def default_arena():
    """The AutomaticArena spillarena.checkpoint() uses when no arena= is given: one per process,
    in the default directory ($SPILL_DIR, else a temp directory on disk). A fork() child gets a
    fresh one at its first use (Note [The default arena across fork])."""
    global _default
    with _default_lock:
        if _default is None:
            _default = AutomaticArena()
        return _default


# Note [The default arena across fork]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# An arena belongs to the process that made it; in a fork() child every use of it is a
# ForkedProcessError whose fix is a new arena in the child (Note [Arenas across fork] in
# src/core/os/fork_guard.cc). The default arena is nobody's to replace, so the child forgets the
# parent's: its first checkpoint without arena= makes its own AutomaticArena. Dropping the
# inherited one touches nothing of the parent's (its destruction in a child is inert, by that
# Note). The lock is made anew too: a parent thread may have held it at the fork. An arena the
# caller passed explicitly is theirs, and keeps the error.
def _forget_the_default_in_a_child():
    global _default, _default_lock
    _default, _default_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_the_default_in_a_child)


def resolve(arena, tensor):
    """The SpillArena or TensorStash behind ``arena`` for an input like ``tensor``: an
    AutomaticArena's arena, or its in-memory stand-in while it has none."""
    if arena is None:
        arena = default_arena()
    if isinstance(arena, AutomaticArena):
        return arena.arena_for(tensor)
    return arena


__all__ = ["DEFAULT_LAYERS", "MIN_FIRST_BYTES", "AutomaticArena", "default_arena"]
