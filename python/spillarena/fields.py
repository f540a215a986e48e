"""The option keywords and stats keys of an arena and its stash, in declaration order, and the
bounds of two options; each made from its C++ struct (Note [One list of each struct's fields] in
src/core/stash/stash_fields.h)::

    from spillarena import fields
    tuple(arena.stats()) == fields.ARENA_STATS          # spill::ArenaStats, in order
    tuple(arena.stash_stats()) == fields.STASH_STATS    # spill::StashStats
    fields.ARENA_OPTIONS     # SpillArena's keywords: spill::ArenaOptions, then StashOptions
    fields.STASH_OPTIONS     # make_arena_stash's keywords
    fields.MAX_CAPACITY_BYTES, fields.MAX_STAGING_BYTES   # larger is an InvalidArgumentError
"""

from ._C import (
    ARENA_OPTIONS,
    ARENA_STATS,
    MAX_CAPACITY_BYTES,
    MAX_STAGING_BYTES,
    STASH_OPTIONS,
    STASH_STATS,
)

__all__ = [
    "ARENA_OPTIONS",
    "ARENA_STATS",
    "MAX_CAPACITY_BYTES",
    "MAX_STAGING_BYTES",
    "STASH_OPTIONS",
    "STASH_STATS",
]
