"""A stashed tensor's version, read without holding its bytes (autograd's in-place check)::

    before, watch = x._version, version_watch(x)   # the watch holds none of x's bytes
    x.mul_(2)
    watch._version != before                       # True: restore() refuses, as autograd does
"""

import weakref

import torch


# Note [A version kept without the bytes]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Autograd refuses a saved tensor changed in place after it was saved; the stash must too, or it
# gives back changed bytes: it holds the live input until the input is written (keep_last, a
# write in flight), and a write that starts after the change writes the change. The check needs
# the tensor's version counter, which Python reads only through a tensor sharing it. A weak
# reference to the input missed every change made before its last Python reference died (h =
# x * 2; s = h.sin(); h.mul_(3); return s: a silent wrong gradient under offload and offload
# policies, found by a red-team run). A strong one would keep the bytes the stash exists to let
# go. So the stash keeps a watch: a detached alias of the input (which shares its version
# counter) whose storage is then swapped for an empty one below autograd's in-place tracking
# (set_() under _AutoDispatchBelowADInplaceOrView: no version bump, no bytes held). It reads the
# input's version for as long as the stashed tensor lives; the arena stash hands it to the C++
# stash protocol, which reads it (under the GIL) before it spills and when it restores (Note [One
# stash protocol, two front ends] in src/core/stash/stored_bytes.cc). A torch without the guard
# gets the weak reference's check instead.
def version_watch(tensor: torch.Tensor):
    """An object whose ``_version`` is ``tensor``'s, now and after ``tensor`` is gone, holding
    none of its bytes (Note [A version kept without the bytes])."""
    below = getattr(torch._C, "_AutoDispatchBelowADInplaceOrView", None)
    if below is None or not hasattr(torch._C, "_SetExcludeDispatchKeyGuard"):
        return _WeakVersion(tensor)
    alias = detached(tensor)
    with below():
        alias.set_()
    return alias


def detached(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` detached, sharing its version counter also when called below autograd (inside
    a dispatch mode, an offload policy's, a plain detach() would not): the view tracking is
    switched back on for it, as torch's own selective checkpoint does. Plain detach() where this
    torch lacks the guard."""
    exclude = getattr(torch._C, "_SetExcludeDispatchKeyGuard", None)
    if exclude is None:
        return tensor.detach()
    with exclude(torch._C.DispatchKey.ADInplaceOrView, False):
        return tensor.detach()


class _WeakVersion:
    """The version of a tensor while it lives; the last one seen after (the weak check)."""

    def __init__(self, tensor):
        base = tensor._base if tensor._base is not None else tensor
        self._ref, self._seen = weakref.ref(base), tensor._version

    @property
    def _version(self):
        base = self._ref()
        if base is not None:
            self._seen = base._version
        return self._seen
