"""spillarena.forward_state: what a layer's forward saw that its recomputation must see again.

    state = forward_state.capture(tensors, with_rng=True)  # in forward, before the layer runs
    ...
    with forward_state.replay(state):  # in backward
        outputs = layer(*inputs)  # the forward's dropout masks, in the forward's precision

The random-number state (CPU, and every device among ``tensors``) makes dropout draw the same
masks; the autocast state makes the recomputation run in the same precision. Leaving replay()
puts back the states it found, so the rest of backward draws what it would have drawn. The
reentrant form of spillarena.checkpoint uses it: Note [The forward's state, replayed in Python].
"""

import contextlib
import dataclasses
from typing import Optional

import torch

# Note [The forward's state, replayed in Python]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The Python extension does not link torch's C++ API, so that one wheel works beside every torch
# >= 2.11 (issue 38): what it would have read from c10 (generators, autocast) is read here through
# torch's public Python API, present in every one of those releases. The C++ front end,
# spill::checkpoint, keeps src/torch_layer/forward_state.cc for C++ users, and the two must
# agree: this module does what that file does (its Note [Device generators] and
# Note [Replaying autocast]); when it was written the two were compared on the same inputs in all
# 16 combinations of RNG, autocast, dtype and cache. tests/python/test_conformance.py runs the
# Python forms, tests/checkpoint_test.cc the C++ one.
# That is more than torch's reentrant checkpoint replays, which saves the generators of one device
# type only, and only once that type's module is initialized: here every device among the
# tensors, of every type that has a generator, and autocast for the CPU and each of those types.
# Autocast is put back with torch.autocast, as torch's checkpoint does: one nesting level per
# device type instead of one in all, the cast cache still cleared when the outermost level ends.


@dataclasses.dataclass(frozen=True)
class Autocast:
    """Autocast's state for one device type."""

    device_type: str
    enabled: bool
    dtype: torch.dtype


@dataclasses.dataclass(frozen=True)
class ForwardState:
    """What capture() saw: generator states (None and () without the random state), autocast."""

    cpu_rng: Optional[torch.Tensor]
    device_rng: tuple  # (torch.device, its generator's state) for every input device
    autocast: tuple  # an Autocast for the CPU and every input device type autocast knows
    autocast_cache_enabled: bool


def _devices_of(tensors):
    """The devices of ``tensors`` but the CPU, each once, in order of first appearance."""
    devices = []
    for tensor in tensors:
        if tensor is not None and tensor.device.type != "cpu" and tensor.device not in devices:
            devices.append(tensor.device)
    return devices


def _generator_module(device_type):
    """torch's module for ``device_type`` when it reaches a default generator; else None: a
    device type without one runs no random op, so there is nothing to replay there."""
    try:
        module = torch.get_device_module(device_type)
    except RuntimeError:  # no module registered (meta)
        return None
    has_rng = hasattr(module, "get_rng_state") and hasattr(module, "set_rng_state")
    return module if has_rng else None


def _device_rng(devices):
    states = []
    for device in devices:
        module = _generator_module(device.type)
        if module is not None:
            states.append((device, module.get_rng_state(device)))
    return tuple(states)


def _install_rng(cpu_rng, device_rng):
    if cpu_rng is not None:
        torch.set_rng_state(cpu_rng)
    for device, state in device_rng:
        _generator_module(device.type).set_rng_state(state, device)


def _autocast_of(device_types):
    """Autocast's state for each of ``device_types`` that autocast knows (meta it does not)."""
    return tuple(
        Autocast(t, torch.is_autocast_enabled(t), torch.get_autocast_dtype(t))
        for t in device_types if torch.amp.is_autocast_available(t)
    )


def capture(tensors, with_rng=True):
    """The state a recomputation of a layer over ``tensors`` must see again: the CPU generator's
    and those of the devices among ``tensors`` (unless ``with_rng`` is false:
    preserve_rng_state=False), and autocast for the CPU and those devices' types."""
    devices = _devices_of(tensors)
    device_types = ["cpu"]
    for device in devices:
        if device.type not in device_types:
            device_types.append(device.type)
    return ForwardState(
        cpu_rng=torch.get_rng_state() if with_rng else None,
        device_rng=_device_rng(devices) if with_rng else (),
        autocast=_autocast_of(device_types),
        autocast_cache_enabled=torch.is_autocast_cache_enabled(),
    )


@contextlib.contextmanager
def replay(state):
    """Installs ``state`` for the body; puts back the generator and autocast states it found."""
    found_cpu_rng = torch.get_rng_state() if state.cpu_rng is not None else None
    found_device_rng = _device_rng([device for device, _ in state.device_rng])
    _install_rng(state.cpu_rng, state.device_rng)
    try:
        with contextlib.ExitStack() as autocast:
            for a in state.autocast:
                autocast.enter_context(torch.autocast(
                    a.device_type, dtype=a.dtype, enabled=a.enabled,
                    cache_enabled=state.autocast_cache_enabled))
            yield
    finally:
        _install_rng(found_cpu_rng, found_device_rng)
