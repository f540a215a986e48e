"""spillarena.AutomaticArena: an arena made at the first stored input, sized from it.

    spillarena.enable(model)                      # an AutomaticArena of its own, no numbers
    h = spillarena.checkpoint(block, h)           # the process's default_arena()
    spillarena.enable(model, spillarena.AutomaticArena("/mnt/nvme", when_full="error"))
    spillarena.arena_of(model).stats()            # overflows, grows, capacity_needed_bytes, ...

Nothing is allocated before the first checkpointed layer runs with grad. Then the arena is made
with room for that input's bytes times the layers expected (the checkpointed layers enable()
found, else DEFAULT_LAYERS) times growth_margin; it grows when a step needs more and keeps what
finds no room in memory meanwhile (Note [Growing the arena] in src/core/arena/arena_growth.cc).
"""

import threading

from . import _C
from .errors import InsufficientSpaceError, InvalidArgumentError

# A plain spillarena.checkpoint() without enable() cannot know how many layers it will see: the
# first arena has room for this many inputs of the first one's size (at least MIN_FIRST_BYTES),
# and grows after the first step that needed more.
DEFAULT_LAYERS = 16
MIN_FIRST_BYTES = 64 << 20
_PAGE = 4096


def _round_to_pages(n):
    return max(_PAGE, (int(n) + _PAGE - 1) // _PAGE * _PAGE)


class AutomaticArena:
    """A SpillArena made at the first stored input, sized from it; then that arena.

    ``directory`` and ``options`` are SpillArena's (``when_full``, ``grow``, ``growth_margin``,
    ``io``, ...) and are checked now: a missing or memory-backed directory or a bad option is a
    typed error here, not at the first step. ``layers``: the inputs one step is expected to
    store (enable() passes the layers it checkpoints); None: DEFAULT_LAYERS, at least
    MIN_FIRST_BYTES. Copies share it; it cannot be pickled."""

    def __init__(self, directory=None, *, layers=None, **options):
        if "capacity_bytes" in options:
            raise InvalidArgumentError(
                "spillarena.AutomaticArena sizes itself from the first input; pass a capacity to "
                "spillarena.SpillArena(capacity_bytes, ...) to preallocate one instead"
            )
        if layers is not None and (
            isinstance(layers, bool) or not isinstance(layers, int) or layers < 1
        ):
            raise InvalidArgumentError(
                f"spillarena.AutomaticArena: layers must be an integer >= 1, got {layers!r}"
            )
        # A page-sized probe in the directory with these options: the typed errors of a bad
        # setting come now, and nothing of it stays (its file never had a name).
        probe = _C.SpillArena(_PAGE, directory, **options)
        self.directory = probe.directory or None  # the RAM backing has none
        self.options = dict(options)
        self.layers = layers
        self._margin = probe.options()["growth_margin"]
        del probe
        self._lock = threading.Lock()
        self._arena = None

    @property
    def arena(self):
        """The SpillArena, once the first input made it; None before."""
        return self._arena

    def stats(self):
        """The arena's stats() (a dict); {} before the first input."""
        arena = self._arena
        return arena.stats() if arena is not None else {}

    def first_capacity_bytes(self, tensor):
        """The capacity the first arena gets for a first input like ``tensor``."""
        bytes_ = tensor.numel() * tensor.element_size()
        if self.layers is not None:
            return _round_to_pages(bytes_ * self.layers * self._margin)
        return _round_to_pages(max(bytes_ * DEFAULT_LAYERS * self._margin, MIN_FIRST_BYTES))

    def arena_for(self, tensor):
        """The arena, made now for ``tensor`` (a layer input) when it is the first."""
        arena = self._arena
        if arena is not None:
            return arena
        with self._lock:
            if self._arena is None:
                self._arena = self._make(self.first_capacity_bytes(tensor))
            return self._arena

    def _make(self, capacity):
        # A disk with less room than the first guess gets a smaller arena, not an error: what
        # does not fit stays in memory and the overflow warning says how much room is missing.
        try:
            return _C.SpillArena(capacity, self.directory, **self.options)
        except InsufficientSpaceError as e:
            fits = _round_to_pages(min(capacity, e.available_bytes * 9 // 10))
            if fits >= capacity:
                raise
            try:
                return _C.SpillArena(fits, self.directory, **self.options)
            except InsufficientSpaceError:
                return _C.SpillArena(_PAGE, self.directory, **self.options)

    def __repr__(self):
        made = repr(self._arena) if self._arena is not None else "not made yet"
        return f"<spillarena.AutomaticArena directory={self.directory!r} {made}>"

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce_ex__(self, protocol):
        raise InvalidArgumentError(
            "spillarena: an AutomaticArena cannot be pickled: its arena is an open spill file of "
            "this process. Save the model's state_dict(), or call spillarena.disable(model) first"
        )


_default = None
_default_lock = threading.Lock()


def default_arena():
    """The AutomaticArena spillarena.checkpoint() uses when no arena= is given: one per process,
    in the default directory ($SPILL_DIR, else a temp directory on disk)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = AutomaticArena()
        return _default


def resolve(arena, tensor):
    """The SpillArena or TensorStash behind ``arena`` for an input like ``tensor``."""
    if arena is None:
        arena = default_arena()
    if isinstance(arena, AutomaticArena):
        return arena.arena_for(tensor)
    return arena


__all__ = ["DEFAULT_LAYERS", "MIN_FIRST_BYTES", "AutomaticArena", "default_arena"]
