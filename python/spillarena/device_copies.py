"""The stash's device copies and device memory, made by torch for the extension.

The extension links no torch (Note [The stash moves bytes] in src/core/stash/buffer.cc), so
its device path calls these (Note [Device copies through Python] in
python/src/device_engine.cc). Buffers arrive as DLPack capsules of 1-D uint8 tensors; device
types are DLPack's codes::

    c = copy(src_capsule, dst_capsule, 2, 0)    # on a side stream of cuda:0
    c.synchronize()                             # or c.done(), c.order_current_stream()
"""

from __future__ import annotations

import torch
from torch.utils import dlpack as _dlpack

# DLPack's device codes for the devices torch names.
# kDLCUDA, kDLROCM (torch's HIP device is "cuda"), kDLOneAPI.
_DEVICE_TYPES = {2: "cuda", 10: "cuda", 14: "xpu"}
# The devices whose inputs spill (stash.py refuses others at store()).
DEVICE_TYPES = frozenset(_DEVICE_TYPES.values())


def _device(dl_type: int, index: int) -> torch.device:
    name = _DEVICE_TYPES.get(dl_type)
    if name is None:
        raise RuntimeError(
            f"spillarena: no device copies for DLPack device type {dl_type}; spill layer inputs "
            "of CUDA, ROCm or XPU devices, or keep them with make_in_memory_stash()"
        )
    return torch.device(name, index)


class Copy:
    """One queued copy: keeps both tensors alive until its event completed."""

    def __init__(self, event, module, device: torch.device, tensors=()):
        self._event, self._module, self._device, self._tensors = event, module, device, tensors

    def done(self) -> bool:
        return self._event.query()

    def synchronize(self) -> None:
        self._event.synchronize()
        self._tensors = ()

    def order_current_stream(self) -> None:
        self._module.current_stream(self._device).wait_event(self._event)


def _module(device: torch.device):
    return torch.get_device_module(device.type)


def copy(src, dst, dl_type: int, index: int) -> Copy:
    """``dst`` gets ``src``'s bytes on a side stream of the device, after the current stream's
    work (the input is complete there); Note [Accelerator copies]."""
    device = _device(dl_type, index)
    module = _module(device)
    source, dest = _dlpack.from_dlpack(src), _dlpack.from_dlpack(dst)
    with module.device(device):
        inputs_ready = module.current_stream().record_event()
        side = _side_stream(module, device, dest.device.type == "cpu")
        side.wait_event(inputs_ready)
        with module.stream(side):
            dest.copy_(source, non_blocking=True)
            event = side.record_event()
    return Copy(event, module, device, (source, dest))


_SIDE_STREAMS: dict = {}


def _side_stream(module, device: torch.device, to_host: bool):
    """One side stream per device and direction: copies off the device (forward) and back onto it
    (backward's prefetches) do not wait for each other."""
    key = (device, to_host)
    stream = _SIDE_STREAMS.get(key)
    if stream is None:
        stream = _SIDE_STREAMS[key] = module.Stream(device)
    return stream


def marker(dl_type: int, index: int) -> Copy:
    """Completes when the work queued so far on the device's current stream has."""
    device = _device(dl_type, index)
    module = _module(device)
    with module.device(device):
        return Copy(module.current_stream().record_event(), module, device)


def empty(dl_type: int, index: int, nbytes: int, explain):
    """``nbytes`` of device memory from the caching allocator; out of memory, torch's own error
    type with ``explain(torch's message)`` as its message."""
    try:
        t = torch.empty(nbytes, dtype=torch.uint8, device=_device(dl_type, index))
    except torch.OutOfMemoryError as e:
        raise torch.OutOfMemoryError(explain(str(e))) from None
    return _dlpack.to_dlpack(t)


def pinned_host(nbytes: int):
    """Page-locked host memory for the host pool, or None where pinning is refused."""
    try:
        t = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    except RuntimeError:
        return None
    return _dlpack.to_dlpack(t)
