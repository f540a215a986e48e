"""SharedOnCopy: the copy policy of an arena and of a stash over one, resources of this process::

    copy.deepcopy(arena) is arena      # True: a deep-copied model spills to the same arena
    pickle.dumps(arena)                # InvalidArgumentError, saying what to do instead
"""

from .errors import InvalidArgumentError


# Note [An arena is shared by copies, never pickled]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# An arena (and a stash over one) is a resource of this process, like an open file: its spill
# file has no name to reopen and its regions belong to this process's graphs. copy.copy and
# copy.deepcopy return the object itself, so copy.deepcopy(model) after spillarena.enable (EMA
# copies, trainers that copy models) gives a model whose checkpoint function spills to the same
# arena (issue 19). Pickling raises InvalidArgumentError saying what to do instead.
class SharedOnCopy:
    """A resource of this process, like an open file: copy.copy and copy.deepcopy give back the
    object itself (a deep-copied model spills to the same arena); pickling raises
    InvalidArgumentError with ``_pickle_refusal``."""

    _pickle_refusal = "spillarena: this object cannot be pickled"

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce_ex__(self, protocol):
        raise InvalidArgumentError(self._pickle_refusal)
