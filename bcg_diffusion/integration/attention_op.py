"""Attention as ``torch.library`` custom ops, so that compiled code is not split at attention.

While a transformer is accelerated, a call of the patched ``scaled_dot_product_attention`` or
``dispatch_attention_fn`` that dynamo traces becomes ``torch.ops.bcg.sdpa`` or
``torch.ops.bcg.dispatch_attention``: one opaque node of the compiled graph (``fullgraph=True``
works, Inductor fuses what is around it). When the compiled code runs, the op calls the same
eager attention as an uncompiled call would: the backend in force at call time, an eager break
under a breakable capture (or captured where the attention policy allows it). Calls whose
arguments do not fit a schema (``attention_kwargs``, a context-parallel config) stay graph breaks.

Fake implementations run the original attention on fake tensors, so output shapes and strides
are those of the real kernel.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

_ORIGINAL_SDPA = torch.nn.functional.scaled_dot_product_attention
# kind ("sdpa" / "dispatch") -> the eager calls of the installed patches (break logic included)
_EAGER_CALLS: dict[str, list[Callable]] = {"sdpa": [], "dispatch": []}


def _eager_call(kind: str, fallback: Callable) -> Callable:
    calls = _EAGER_CALLS[kind]
    return calls[-1] if calls else fallback  # without a patch (acceleration removed): plain attention


def _original_dispatch() -> Callable:
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    return dispatch_attention_fn


@torch.library.custom_op("bcg::sdpa", mutates_args=())
def sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor],
    dropout_p: float,
    is_causal: bool,
    scale: Optional[float],
    enable_gqa: bool,
) -> torch.Tensor:
    return _run_eager(
        _eager_call("sdpa", _ORIGINAL_SDPA), query, key, value,
        attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
    )


@sdpa.register_fake
def _sdpa_fake(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):  # noqa: ANN001
    return _ORIGINAL_SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


@torch.library.custom_op("bcg::dispatch_attention", mutates_args=())
def dispatch_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor],
    dropout_p: float,
    is_causal: bool,
    scale: Optional[float],
    enable_gqa: bool,
    backend: Optional[str],
) -> torch.Tensor:
    return _run_eager(
        _eager_call("dispatch", _original_dispatch()), query, key, value,
        attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
        backend=_backend(backend),
    )


@dispatch_attention.register_fake
def _dispatch_fake(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, backend):  # noqa: ANN001
    try:
        return _original_dispatch()(
            query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
            enable_gqa=enable_gqa, backend=_backend(backend),
        )
    except Exception:  # noqa: BLE001 - a backend that cannot run on fake tensors: diffusers' (B, S, H, D) layout
        return query.new_empty((*query.shape[:-1], value.shape[-1]))


def _backend(name: Optional[str]) -> Any:
    if name is None:
        return None
    from diffusers.models.attention_dispatch import AttentionBackendName

    return AttentionBackendName(name)


def _run_eager(call: Callable, query, key, value, **kwargs: Any) -> torch.Tensor:
    """``call``'s output, copied where it aliases an input (a custom op's output may not)."""
    out = call(query, key, value, **kwargs)
    return out.clone() if _aliases(out, (query, key, value, kwargs["attn_mask"])) else out


def _aliases(out: torch.Tensor, inputs: tuple) -> bool:
    ptr = out.untyped_storage().data_ptr()
    return any(isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == ptr for t in inputs)


def _arg(args: tuple, kwargs: dict, index: int, name: str, default: Any) -> Any:
    return args[index] if len(args) > index else kwargs.get(name, default)


def traced_call(kind: str, eager: Callable, args: tuple, kwargs: dict) -> Any:
    """What a traced (compiled) call of the patched ``kind`` attention becomes: the custom op, or,
    for arguments no schema holds, ``eager`` behind a graph break."""
    query, key, value = args[0], _arg(args, kwargs, 1, "key", None), _arg(args, kwargs, 2, "value", None)
    attn_mask = _arg(args, kwargs, 3, "attn_mask", None)
    dropout_p = float(_arg(args, kwargs, 4, "dropout_p", 0.0))
    is_causal = bool(_arg(args, kwargs, 5, "is_causal", False))
    scale = _arg(args, kwargs, 6, "scale", None)
    enable_gqa = bool(_arg(args, kwargs, 7, "enable_gqa", False))
    if kind == "sdpa":
        return torch.ops.bcg.sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if _arg(args, kwargs, 8, "attention_kwargs", None) or kwargs.get("parallel_config") is not None:
        return torch._dynamo.disable(eager)(*args, **kwargs)
    backend = kwargs.get("backend")
    name = getattr(backend, "value", backend)
    return torch.ops.bcg.dispatch_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, name)


def register_eager_call(kind: str, call: Callable) -> None:
    """An installed patch's eager call (break logic included), which the op runs for ``kind``."""
    _EAGER_CALLS[kind].append(call)


def unregister_eager_call(kind: str, call: Callable) -> None:
    if call in _EAGER_CALLS[kind]:
        _EAGER_CALLS[kind].remove(call)
