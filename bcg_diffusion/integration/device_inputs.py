"""Host tensor inputs a transformer moves onto the device itself, moved before the call is keyed.

A CPU tensor of more than :data:`~.keys.HOST_TENSOR_LIMIT` elements makes a call uncacheable (it cannot be keyed by
value, and a capture cannot copy it in). Where a class's ``forward`` moves such an input onto the device before any
use (``TransformerInfo.device_inputs``: Lumina-Next's rotary table), the runner makes that same copy first: the
forward's own ``.to`` is then a no-op and the values it computes with are the same.
"""

from __future__ import annotations

import torch

from ..families import TransformerInfo


def move_device_inputs(info: TransformerInfo, kwargs: dict, device_type: str) -> dict:
    """``kwargs`` with each tensor named in ``info.device_inputs`` that is not on a ``device_type`` device moved to
    the device of the call's first keyword tensor that is (the hidden states); ``kwargs`` itself when nothing moves."""
    names = [n for n in info.device_inputs
             if isinstance(kwargs.get(n), torch.Tensor) and kwargs[n].device.type != device_type]
    device = next((v.device for v in kwargs.values() if isinstance(v, torch.Tensor) and v.device.type == device_type),
                  None)
    if not names or device is None:
        return kwargs
    return {**kwargs, **{name: kwargs[name].to(device) for name in names}}
