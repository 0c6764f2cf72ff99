"""Build complete diffusers pipelines with random weights from a family's configs.

``build_pipeline(family, size)`` returns an instance of the family's real diffusers pipeline class whose
``pipe(prompt=..., ...)`` runs end to end. Every module is constructed directly on the target device in
the target dtype (no CPU initialisation of billions of parameters); weights are drawn from torch's RNG
seeded per component from ``seed``, so the same seed on the same device gives bitwise the same weights.
"""

from __future__ import annotations

import contextlib
import logging
import time
import zlib
from typing import Any

import torch

from .dtypes import resolve_device, resolve_dtype
from .registry import FamilySpec, get_family
from .text_encoders import build_text_encoder, build_tokenizer, preset

logger = logging.getLogger(__name__)

__all__ = ["build_components", "build_pipeline"]


def _component_seed(seed: int, name: str) -> int:
    return (int(seed) * 1_000_003 + zlib.crc32(name.encode())) % (2**63 - 1)


@contextlib.contextmanager
def _construct_on(device: torch.device, dtype: torch.dtype, seed: int, name: str):
    """Create tensors on ``device`` in ``dtype`` with the RNG seeded for component ``name``."""
    old = torch.get_default_dtype()
    torch.manual_seed(_component_seed(seed, name))
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device), torch.no_grad():
            yield
    finally:
        torch.set_default_dtype(old)


def _place(module: torch.nn.Module, device: torch.device, dtype: torch.dtype, cast_buffers: bool = True) -> torch.nn.Module:
    """Move to ``device`` and cast floating tensors not yet in ``dtype``, as loading real weights in ``dtype`` does.

    Diffusers' ``from_pretrained(torch_dtype=...)`` casts buffers too; transformers builds under the default
    dtype and leaves explicitly fp32 buffers (RoPE frequencies) alone, hence ``cast_buffers=False`` for text
    encoders. Cast tensor by tensor: ``ModelMixin.to(dtype)`` warns about fp32 modules even when there are none.
    """
    module = module.to(device)
    for m in module.modules():
        for name, p in m._parameters.items():
            if p is not None and p.is_floating_point() and p.dtype != dtype:
                p.data = p.data.to(dtype)
        for name, b in m._buffers.items() if cast_buffers else ():
            if b is not None and b.is_floating_point() and b.dtype != dtype:
                m._buffers[name] = b.to(dtype)
    return module.eval().requires_grad_(False)


def build_components(spec: FamilySpec, size: str, device: torch.device, dtype: torch.dtype, seed: int) -> dict[str, Any]:
    """All constructor arguments of the family's pipeline class, built at ``size`` on ``device``."""
    sz = spec.size(size)
    comps: dict[str, Any] = {}
    for te in spec.text_encoders:
        tok = build_tokenizer(te.tokenizer_style, te.max_length)
        comps[te.tokenizer_component] = tok
        with _construct_on(device, dtype, seed, te.component):
            model = build_text_encoder(te.kind, preset(te.preset(size)), tok)
        comps[te.component] = _place(model, device, dtype, cast_buffers=False)
    with _construct_on(device, dtype, seed, "vae"):
        vae = spec.vae_class(**sz.vae)
    comps["vae"] = _place(vae, device, dtype)
    with _construct_on(device, dtype, seed, "transformer"):
        transformer = spec.transformer_class(**sz.transformer)
    comps["transformer"] = _place(transformer, device, dtype)
    comps["scheduler"] = spec.scheduler_class(**spec.scheduler_config)
    comps.update(spec.extra_components)
    return comps


def build_pipeline(
    family: str | FamilySpec,
    size: str = "tiny",
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    seed: int = 0,
    *,
    progress_bar: bool = False,
):
    """Build the family's real diffusers pipeline with random weights at ``size`` (``"tiny"`` or ``"full"``).

    ``device=None`` means CUDA if available else CPU; ``dtype=None`` bf16 on CUDA, fp32 otherwise. The same
    ``seed`` on the same device gives bitwise-identical weights. Raises ``ValueError`` for an unknown family
    or size. Progress bars are off unless ``progress_bar=True``. Building reseeds torch's global RNG and
    briefly changes the default dtype and device: not thread-safe.
    """
    spec = get_family(family)
    spec.size(size)  # validates the size name before any work
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    t0 = time.perf_counter()
    comps = build_components(spec, size, device, dtype, seed)
    pipe = spec.pipeline_class(**comps)
    pipe.set_progress_bar_config(disable=not progress_bar)
    logger.info("built %s (%s) on %s in %s in %.2fs", spec.name, size, device, dtype, time.perf_counter() - t0)
    return pipe
