"""Devices and dtypes by name: the one map of dtype names that the pipelines and the scripts share."""

from __future__ import annotations

import torch

__all__ = ["DTYPES", "DTYPE_NAMES", "dtype_name", "resolve_device", "resolve_dtype"]

#: Accepted names of each dtype (CLI choices and ``build_pipeline(dtype="bf16")``).
DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
}
DTYPE_NAMES: tuple[str, ...] = tuple(DTYPES)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None`` -> ``cuda`` if available else ``cpu``."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype:
    """``None`` -> bf16 on CUDA, fp32 elsewhere; a name of :data:`DTYPES`; ``ValueError`` for other names."""
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
        return DTYPES[dtype]
    return dtype
