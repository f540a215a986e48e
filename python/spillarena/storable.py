"""Which tensors a stash that moves bytes can hold: dense ones with data of their own::

    storable_kind(x)                 # None, or "sparse_coo", "nested", "meta", "quantized", ...
    check_storable(x, stash.name)    # InvalidArgumentError naming the kind and what to do
"""

import torch

from .errors import InvalidArgumentError


def storable_kind(tensor: torch.Tensor):
    """None when a stash can hold ``tensor``'s bytes (a dense tensor with data of its own);
    else what it is, for messages: "sparse_coo", "nested", "meta", "quantized",
    "MyWrapper subclass"."""
    if tensor.is_nested:
        return "nested"
    if tensor.layout != torch.strided:
        return str(tensor.layout).replace("torch.", "")
    if tensor.is_meta:
        return "meta"
    if tensor.is_quantized:  # its scale and zero point are no bytes of its storage
        return "quantized"
    # A subclass with a __torch_dispatch__ of its own (DTensor, a functional or wrapper tensor)
    # may have no storage behind it: what its data_ptr() shows is not its values.
    if type(tensor).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__:
        return f"{type(tensor).__name__} subclass"
    return None


def check_storable(tensor: torch.Tensor, name: str) -> None:
    """InvalidArgumentError unless the stash called ``name`` can hold ``tensor``."""
    kind = storable_kind(tensor)
    if kind is None:
        return
    raise InvalidArgumentError(
        f"spill: the {name} stash stores dense tensors with data; got a {kind} tensor on "
        f"{tensor.device}. Make it dense (to_dense()) and give it data, or keep it with "
        "make_in_memory_stash()"
    )
