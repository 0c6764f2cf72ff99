"""The explicit key of a captured graph: everything a replay bakes in."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

_HASHABLE_LEAVES = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device)


class UncacheableInput(TypeError):
    """An input whose value cannot be part of a key (an arbitrary object): the call runs eagerly."""


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool

    def __str__(self) -> str:
        return f"tensor{list(self.shape)} {str(self.dtype).replace('torch.', '')} {self.device}"


@dataclass(frozen=True)
class GraphKey:
    """Frozen descriptor of one captured call.

    ``inputs`` maps each input path (``"hidden_states"``, ``"joint_attention_kwargs['scale']"``)
    to a :class:`TensorSpec` or a value; ``state`` holds grad/autocast/training state;
    ``weights`` the fingerprint of parameters, buffers and adapter state.
    """

    inputs: tuple[tuple[str, Any], ...]
    state: tuple[tuple[str, Any], ...]
    weights: Any

    def difference(self, other: "GraphKey") -> str:
        """Human-readable first field in which ``self`` differs from ``other``."""
        mine, theirs = dict(self.inputs), dict(other.inputs)
        for path in list(mine) + [p for p in theirs if p not in mine]:
            if mine.get(path, "<absent>") != theirs.get(path, "<absent>"):
                return f"{path}: {_show(theirs.get(path, '<absent>'))} -> {_show(mine.get(path, '<absent>'))}"
        for (name, value), (_, old) in zip(self.state, other.state):
            if value != old:
                return f"{name}: {old} -> {value}"
        if self.weights != other.weights:
            return "weights (parameters, buffers or adapters changed)"
        return "nothing"

    def summary(self) -> str:
        """Short description: the tensor inputs and their shapes."""
        return ", ".join(f"{p}={v}" for p, v in self.inputs if isinstance(v, TensorSpec))


def _show(value: Any) -> str:
    return str(value) if isinstance(value, TensorSpec) else repr(value)


def flatten_inputs(args: tuple, kwargs: dict) -> tuple[tuple[tuple[str, Any], ...], list[torch.Tensor]]:
    """Walk positional and keyword inputs (tuples, lists, dicts, dataclasses nested).

    Returns the ordered ``(path, spec-or-value)`` fields and the tensors in walk order. Raises
    :class:`UncacheableInput` for values that cannot be keyed.
    """
    fields: list[tuple[str, Any]] = []
    tensors: list[torch.Tensor] = []
    for i, value in enumerate(args):
        _walk(value, f"args[{i}]", fields, tensors)
    for name, value in kwargs.items():
        _walk(value, name, fields, tensors)
    return tuple(fields), tensors


def _walk(value: Any, path: str, fields: list, tensors: list) -> None:
    if isinstance(value, torch.Tensor):
        if type(value) is not torch.Tensor and not isinstance(value, torch.nn.Parameter):
            raise UncacheableInput(f"{path} is a tensor subclass ({type(value).__name__})")
        fields.append(
            (path, TensorSpec(tuple(value.shape), value.stride(), value.dtype, value.device, value.requires_grad))
        )
        tensors.append(value)
    elif isinstance(value, _HASHABLE_LEAVES):
        fields.append((path, value))
    elif isinstance(value, (tuple, list)):
        fields.append((path, (type(value).__name__, len(value))))
        for i, item in enumerate(value):
            _walk(item, f"{path}[{i}]", fields, tensors)
    elif isinstance(value, dict):
        fields.append((path, ("dict", tuple(value.keys()))))
        for k, item in value.items():
            _walk(item, f"{path}[{k!r}]", fields, tensors)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields.append((path, type(value).__qualname__))
        for f in dataclasses.fields(value):
            _walk(getattr(value, f.name), f"{path}.{f.name}", fields, tensors)
    else:
        raise UncacheableInput(f"{path} is a {type(value).__name__}, which cannot be part of a graph key")


def rebuild_inputs(args: tuple, kwargs: dict, tensors: list[torch.Tensor]) -> tuple[tuple, dict]:
    """``args``/``kwargs`` with their tensors replaced, in walk order, by ``tensors``."""
    it = iter(tensors)
    return tuple(_rebuild(a, it) for a in args), {k: _rebuild(v, it) for k, v in kwargs.items()}


def _rebuild(value: Any, it: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return next(it)
    if isinstance(value, tuple):
        items = [_rebuild(v, it) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, list):
        return [_rebuild(v, it) for v in value]
    if isinstance(value, dict):
        return type(value)((k, _rebuild(v, it)) for k, v in value.items())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _rebuild(getattr(value, f.name), it) for f in dataclasses.fields(value) if f.init})
    return value


def execution_state(module: torch.nn.Module) -> tuple[tuple[str, Any], ...]:
    """Global state a capture bakes in: grad mode, autocast, training flag."""
    autocast = torch.is_autocast_enabled("cuda") if _autocast_takes_device() else torch.is_autocast_enabled()
    dtype = torch.get_autocast_dtype("cuda") if autocast and hasattr(torch, "get_autocast_dtype") else None
    return (
        ("grad_enabled", torch.is_grad_enabled()),
        ("autocast", (autocast, dtype)),
        ("training", module.training),
    )


def _autocast_takes_device() -> bool:
    try:
        torch.is_autocast_enabled("cuda")
        return True
    except TypeError:
        return False
