"""The explicit key of a captured graph: everything a replay bakes in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..core.tree import node_of, tree_map, walk
from .fingerprint import describe_adapters
from .object_inputs import ObjectLayout, Opaque, copy_with, is_plain_object, object_leaves, witness

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

    def differs_only_in(self, other: "GraphKey", fields: tuple[str, ...]) -> tuple[str, ...]:
        """The ``state`` fields among ``fields`` in which ``self`` differs from ``other``, when the
        two keys are otherwise equal (inputs, the other state fields, weights); ``()`` otherwise."""
        if self.inputs != other.inputs or self.weights != other.weights or len(self.state) != len(other.state):
            return ()
        differing = []
        for (name, value), (other_name, old) in zip(self.state, other.state):
            if name != other_name:
                return ()
            if value != old:
                if name not in fields:
                    return ()
                differing.append(name)
        return tuple(differing)

    def summary(self) -> str:
        """Short description: the tensor inputs and their shapes, then the active adapters where there are any
        (keys that differ in their adapters' state only read differently)."""
        tensors = ", ".join(f"{p}={v}" for p, v in self.inputs if isinstance(v, TensorSpec))
        adapters = describe_adapters(self.weights)
        return f"{tensors}; {adapters}" if adapters else tensors


def _show(value: Any) -> str:
    return str(value) if isinstance(value, TensorSpec) else repr(value)


# CPU tensors up to this many elements among the inputs of a CUDA call are host values (frame
# indices, grid sizes): their values are part of the key and they are passed as they are.
HOST_TENSOR_LIMIT = 4096


@dataclass(frozen=True)
class HostTensor:
    """A small CPU tensor input of a CUDA call, keyed by its values."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    values: tuple

    def __str__(self) -> str:
        return f"cpu tensor{list(self.shape)} {str(self.dtype).replace('torch.', '')} {self.values[:8]}"


def flatten_inputs(
    args: tuple, kwargs: dict, device_type: str | None = None
) -> tuple[tuple[tuple[str, Any], ...], list[torch.Tensor]]:
    """Walk positional and keyword inputs (tuples, lists, dicts, dataclasses nested; see
    :mod:`bcg_diffusion.core.tree`).

    Returns the ordered ``(path, spec-or-value)`` fields and the tensors in walk order. With
    ``device_type`` (the runner passes ``"cuda"``), tensors on other devices are host values: up
    to :data:`HOST_TENSOR_LIMIT` elements they are keyed by value (:class:`HostTensor`) and left
    out of the tensors; plain objects are keyed by their structure and their tensors read like the
    others (:mod:`.object_inputs`). Raises :class:`UncacheableInput` for values that cannot be keyed.
    """
    fields: list[tuple[str, Any]] = []
    tensors: list[torch.Tensor] = []
    named = [(f"args[{i}]", v) for i, v in enumerate(args)] + list(kwargs.items())
    for root, value in named:
        for path, descriptor, leaf in walk(value, root):
            if descriptor is not None:
                fields.append((path, descriptor))
            elif device_type is not None and is_plain_object(leaf):
                for inner, layout, item in object_leaves(leaf, path):
                    if layout is not None:
                        fields.append((inner, layout))
                    else:
                        _add_leaf(inner, item, device_type, fields, tensors, inside_object=True)
            else:
                _add_leaf(path, leaf, device_type, fields, tensors)
    return tuple(fields), tensors


def _add_leaf(path: str, leaf: Any, device_type: str | None, fields: list, tensors: list,
              inside_object: bool = False) -> None:
    """The key field of one leaf (and the tensor a capture copies); inside an object, a value that cannot be keyed
    is keyed by identity (:class:`~.object_inputs.Opaque`)."""
    if isinstance(leaf, torch.Tensor):
        if type(leaf) is not torch.Tensor and not isinstance(leaf, torch.nn.Parameter):
            raise UncacheableInput(f"{path} is a tensor subclass ({type(leaf).__name__})")
        if device_type is not None and leaf.device.type != device_type:
            if leaf.numel() > HOST_TENSOR_LIMIT:
                raise UncacheableInput(
                    f"{path} is a {leaf.device.type} tensor of {leaf.numel()} elements; pass it on the "
                    f"{device_type} device (host tensors up to {HOST_TENSOR_LIMIT} elements are keyed by value)"
                )
            fields.append((path, HostTensor(tuple(leaf.shape), leaf.dtype, tuple(leaf.flatten().tolist()))))
            return
        fields.append((path, TensorSpec(tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf.device, leaf.requires_grad)))
        tensors.append(leaf)
    elif isinstance(leaf, _HASHABLE_LEAVES):
        fields.append((path, leaf))
    elif inside_object and is_plain_object(leaf):  # an object a capture could not copy with its tensors
        raise UncacheableInput(f"{path} is a {type(leaf).__name__} object whose class takes arguments to be made, "
                               "so a capture cannot copy it")
    elif inside_object:
        fields.append((path, Opaque(type(leaf).__qualname__, id(leaf))))
    else:
        raise UncacheableInput(f"{path} is a {type(leaf).__name__}, which cannot be part of a graph key")


def rebuild_inputs(args: tuple, kwargs: dict, tensors: list[torch.Tensor], device_type: str | None = None) -> tuple[tuple, dict]:
    """``args``/``kwargs`` with their tensors (those on ``device_type``, if given) replaced, in walk
    order, by ``tensors``; a plain input object (with ``device_type``) is copied with its tensors
    replaced (:func:`~.object_inputs.copy_with`)."""
    it = iter(tensors)

    def is_replaced(value: Any) -> bool:
        return isinstance(value, torch.Tensor) and (device_type is None or value.device.type == device_type)

    def replace(value: Any) -> Any:
        return next(it) if isinstance(value, torch.Tensor) else copy_with(value, lambda _: next(it), is_replaced)

    def is_leaf(value: Any) -> bool:  # an object: a leaf of the walk (not a dataclass, which it descends into)
        return is_replaced(value) or (device_type is not None and node_of(value) is None and is_plain_object(value))

    return tree_map(replace, (args, kwargs), is_leaf=is_leaf)


def input_objects_witness(args: tuple, kwargs: dict) -> tuple:
    """:func:`~.object_inputs.witness` of every plain object among the inputs (``()`` when there is none)."""
    named = [(f"args[{i}]", v) for i, v in enumerate(args)] + list(kwargs.items())
    return tuple(witness(leaf, path) for root, value in named for path, descriptor, leaf in walk(value, root)
                 if descriptor is None and is_plain_object(leaf))


@dataclass
class Call:
    """One call of ``forward``, its inputs read once (:func:`flatten_inputs` on ``device_type``):
    the key ``fields`` and the ``tensors`` a capture copies; ``unkeyed`` says why it has no key
    (inputs that cannot be keyed, or none on the device), and then it runs eagerly."""

    forward: Callable
    args: tuple
    kwargs: dict
    device_type: str
    fields: tuple = ()
    tensors: list[torch.Tensor] = field(default_factory=list)
    unkeyed: str | None = None
    witness: tuple = ()  # of the input objects (:func:`input_objects_witness`): what a change of them alters

    @classmethod
    def read(cls, forward: Callable, args: tuple, kwargs: dict, device_type: str) -> "Call":
        try:
            fields, tensors = flatten_inputs(args, kwargs, device_type=device_type)
        except UncacheableInput as exc:
            return cls(forward, args, kwargs, device_type, unkeyed=f"uncacheable input: {exc}")
        unkeyed = None if tensors else f"no input tensor is on a {device_type.upper()} device"
        seen = input_objects_witness(args, kwargs) if any(isinstance(v, ObjectLayout) for _, v in fields) else ()
        return cls(forward, args, kwargs, device_type, fields, tensors, unkeyed, seen)

    def run(self) -> Any:
        return self.forward(*self.args, **self.kwargs)

    def on(self, tensors: list[torch.Tensor]) -> "Call":
        """The same call with ``tensors`` in place of its tensors (static inputs for a capture)."""
        args, kwargs = rebuild_inputs(self.args, self.kwargs, tensors, device_type=self.device_type)
        return Call(self.forward, args, kwargs, self.device_type, self.fields, list(tensors))

    def changes(self) -> str | None:
        """What running the call changed in its own inputs (an object it writes to, a host tensor),
        read again now, as ``"path: what"``; ``None`` when nothing did (or it has no such inputs)."""
        if not any(isinstance(v, (ObjectLayout, HostTensor)) for _, v in self.fields):
            return None
        after, _ = flatten_inputs(self.args, self.kwargs, device_type=self.device_type)
        if after != self.fields:
            return GraphKey(after, (), None).difference(GraphKey(self.fields, (), None))
        now = input_objects_witness(self.args, self.kwargs) if self.witness else ()
        for old, new in zip((e for w in self.witness for e in w), (e for w in now for e in w)):
            if old != new:
                return f"{old[0]}: reassigned or written in place"
        return None

    def refusal(self, out: Any) -> str | None:
        """Why a key whose call ran as this one did (returning ``out``) can never be replayed: the call changed
        its own inputs, or returned an object its forward made on the host, which a replay cannot make again
        (Flux.2 Klein KV's cache of the reference tokens); ``None`` when neither."""
        changed = self.changes()  # "path: what changed"; the path alone, so that one reason covers every shape
        if changed is not None:
            where = changed.split(":")[0]
            return f"the call changes its own input {where}, which a replay would not do, so it runs eagerly"
        made = [(path, leaf) for path, descriptor, leaf in walk(out, "out")
                if descriptor is None and is_plain_object(leaf)]
        if made:
            path, leaf = made[0]
            return (f"the call returns a {type(leaf).__qualname__} object ({path}) that its forward makes on the "
                    "host, which a replay cannot make again, so it runs eagerly")
        return None


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


GRAD_MODE_FIELDS = ("grad_enabled", "inference_mode")


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


def build_key(module: torch.nn.Module, info: Any, call: Call, weights: Any, extra: tuple[tuple[str, Any], ...] = ()) -> GraphKey:
    """The key of one call: its input fields, the mask values ``info`` declares, the execution
    state with the attention backend in force and ``extra`` fields, and the weight fingerprint."""
    state = execution_state(module, (("attention_backend", active_attention_backend()), *extra))
    return GraphKey(call.fields + value_fields(info, call.kwargs), state, weights)
