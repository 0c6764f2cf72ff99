"""Functions of a transformer's own Python module as eager breaks.

A family names them (:attr:`~bcg_diffusion.families.TransformerInfo.eager_functions`): helpers the
transformer's forward calls by name that do host work (QwenImage's
``compute_text_seq_len_from_mask`` reads a mask's length). Each is replaced in the module, while at
least one transformer needs it (shared, reference-counted), by a wrapper that is a plain call outside
a capture and an eager break inside one (never traced by torch.compile).
"""

from __future__ import annotations

import sys
from typing import Callable

import torch

from ...core.capture import eager_on_graph
from ...core.handles import RemovableHandle
from .shared import acquire, group


def _make_function_break(original: Callable) -> Callable:
    wrapped = torch._dynamo.disable(eager_on_graph(original))
    wrapped.__bcg_original__ = original  # type: ignore[attr-defined]
    return wrapped


def install(transformer: torch.nn.Module, names: tuple[str, ...]) -> RemovableHandle:
    """Make the functions ``names`` of ``transformer``'s module eager breaks (names it lacks are
    passed over); the handle undoes it."""
    home = sys.modules[type(transformer).__module__]
    handles = [acquire(home, name, _make_function_break) for name in names if callable(getattr(home, name, None))]
    return group(handles, f"eager functions of {type(transformer).__name__}")
