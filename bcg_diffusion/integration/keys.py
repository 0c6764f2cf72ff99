"""The explicit key of a captured graph: everything a replay bakes in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..core.tree import tree_map, walk

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
    to a :class:`TensorSpec`, a value or a container descriptor; ``state`` holds the process and
    thread state of :func:`execution_state` (grad, autocast, math modes, the attention backend in
    force); ``weights`` the fingerprint of parameters, buffers and adapter state. The model's
    structure (processors, hooks) is not in the key: a change of it drops every graph of the
    transformer (see :mod:`bcg_diffusion.integration.model_state`).
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
    """Walk positional and keyword inputs (tuples, lists, dicts, dataclasses nested; see
    :mod:`bcg_diffusion.core.tree`).

    Returns the ordered ``(path, spec-or-value)`` fields and the tensors in walk order. Raises
    :class:`UncacheableInput` for values that cannot be keyed.
    """
    fields: list[tuple[str, Any]] = []
    tensors: list[torch.Tensor] = []
    named = [(f"args[{i}]", v) for i, v in enumerate(args)] + list(kwargs.items())
    for root, value in named:
        for path, descriptor, leaf in walk(value, root):
            if descriptor is not None:
                fields.append((path, descriptor))
            elif isinstance(leaf, torch.Tensor):
                if type(leaf) is not torch.Tensor and not isinstance(leaf, torch.nn.Parameter):
                    raise UncacheableInput(f"{path} is a tensor subclass ({type(leaf).__name__})")
                fields.append((path, TensorSpec(tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf.device, leaf.requires_grad)))
                tensors.append(leaf)
            elif isinstance(leaf, _HASHABLE_LEAVES):
                fields.append((path, leaf))
            else:
                raise UncacheableInput(f"{path} is a {type(leaf).__name__}, which cannot be part of a graph key")
    return tuple(fields), tensors


def rebuild_inputs(args: tuple, kwargs: dict, tensors: list[torch.Tensor]) -> tuple[tuple, dict]:
    """``args``/``kwargs`` with their tensors replaced, in walk order, by ``tensors``."""
    it = iter(tensors)
    return tree_map(lambda _: next(it), (args, kwargs))


def _flag(read: Any) -> Any:
    try:
        return read()
    except (AttributeError, RuntimeError, TypeError):  # a switch this torch build does not have
        return None


# Process-wide switches that decide which kernels a capture records (cuBLAS/cuDNN math modes,
# determinism, the default dtype of tensors created inside forward, and the SDPA kernels allowed,
# since attention may be captured under the "capture_safe" policy).
_SWITCHES: tuple[tuple[str, Any], ...] = (
    ("matmul.allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32),
    ("matmul.allow_fp16_reduced_precision", lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction),
    ("matmul.allow_bf16_reduced_precision", lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction),
    ("matmul.allow_fp16_accumulation", lambda: torch.backends.cuda.matmul.allow_fp16_accumulation),
    ("cudnn.allow_tf32", lambda: torch.backends.cudnn.allow_tf32),
    ("cudnn.enabled", lambda: torch.backends.cudnn.enabled),
    ("cudnn.deterministic", lambda: torch.backends.cudnn.deterministic),
    ("cudnn.benchmark", lambda: torch.backends.cudnn.benchmark),
    ("deterministic_algorithms", torch.are_deterministic_algorithms_enabled),
    ("default_dtype", torch.get_default_dtype),
    ("sdp.flash", torch.backends.cuda.flash_sdp_enabled),
    ("sdp.mem_efficient", torch.backends.cuda.mem_efficient_sdp_enabled),
    ("sdp.math", torch.backends.cuda.math_sdp_enabled),
    ("sdp.cudnn", torch.backends.cuda.cudnn_sdp_enabled),
)


def execution_state(module: torch.nn.Module, extra: tuple[tuple[str, Any], ...] = ()) -> tuple[tuple[str, Any], ...]:
    """Process and thread state a capture bakes in: grad and inference mode, autocast, the
    ``training`` flag, the math-mode switches of :data:`_SWITCHES`, and ``extra`` fields."""
    autocast = torch.is_autocast_enabled("cuda")
    dtype = torch.get_autocast_dtype("cuda") if autocast else None
    return (
        ("grad_enabled", torch.is_grad_enabled()),
        ("inference_mode", torch.is_inference_mode_enabled()),
        ("autocast", (autocast, dtype)),
        ("training", module.training),
        *((name, _flag(read)) for name, read in _SWITCHES),
        *extra,
    )


def active_attention_backend() -> Any:
    """The backend diffusers uses where a processor names none (global, or the context manager's)."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    return _AttentionBackendRegistry._active_backend


def value_fields(info: Any, kwargs: dict) -> tuple:
    """Key fields for masks whose values decide shapes inside the model (per-row token counts)."""
    fields = []
    for name in info.value_keyed:
        mask = kwargs.get(name)
        if isinstance(mask, torch.Tensor):
            fields.append((f"{name}.sum(-1)", tuple(mask.sum(-1).flatten().tolist())))
    return tuple(fields)


def build_key(module: torch.nn.Module, info: Any, kwargs: dict, inputs: tuple, weights: Any) -> GraphKey:
    """The key of one call: its flattened ``inputs``, the mask values ``info`` declares, the
    execution state with the attention backend in force, and the weight fingerprint."""
    state = execution_state(module, (("attention_backend", active_attention_backend()),))
    return GraphKey(inputs + value_fields(info, kwargs), state, weights)
