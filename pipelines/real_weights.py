"""Load real-weight pipelines through diffusers, with the family detected from the transformer class."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from .dtypes import resolve_device, resolve_dtype
from .registry import FamilySpec, family_of, get_family

logger = logging.getLogger(__name__)

__all__ = ["load_pipeline", "own_weights"]

#: Byte alignment of torch's CPU allocator; CPU GEMM kernels may take another code path (and round
#: differently) for operands that start elsewhere.
ALIGNMENT = 64


def own_weights(pipe) -> int:
    """Copy every parameter and buffer of ``pipe``'s modules that does not start on an :data:`ALIGNMENT`
    boundary into memory torch allocated; return how many were copied.

    ``safetensors.torch.load_file`` (which ``from_pretrained`` uses) returns zero-copy views of the
    memory-mapped file, where tensors start at ``8 + header length``: 8-byte aligned. On a CPU the
    loaded pipeline would then compute in a different order from the one that was saved (last-bit
    differences) and keep the file mapped. On CUDA ``.to(device)`` already copied everything.
    """
    copied = 0
    for component in pipe.components.values():
        if not isinstance(component, torch.nn.Module):
            continue
        for module in component.modules():
            for tensors in (module._parameters, module._buffers):
                for name, tensor in tensors.items():
                    if tensor is not None and tensor.device.type == "cpu" and tensor.data_ptr() % ALIGNMENT:
                        tensor.data = tensor.data.clone()
                        copied += 1
    return copied


def _offline_hint(model_id: str, err: BaseException) -> str:
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}
    why = "the Hugging Face Hub is offline (HF_HUB_OFFLINE is set)" if offline else "it could not be fetched"
    return (
        f"could not load pipeline {model_id!r}: it is not a local directory, not in the local Hugging Face "
        f"cache, and {why} ({type(err).__name__}: {err}). Pass a local path instead: download the repository "
        f"on a machine with access (e.g. `huggingface-cli download {model_id} --local-dir /path/to/{model_id.split('/')[-1]}`), "
        f"copy it here and call load_pipeline('/path/to/{model_id.split('/')[-1]}'), or build random weights with "
        f"build_pipeline(family, size='full')."
    )


def load_pipeline(
    model_id_or_path: str | os.PathLike,
    family: str | FamilySpec | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    **from_pretrained_kwargs: Any,
):
    """Load a pipeline with real weights via ``from_pretrained`` and move it to ``device``.

    With ``family`` given, that family's pipeline class loads it; otherwise ``DiffusionPipeline`` picks the
    class from ``model_index.json`` and the family is detected from the transformer class (``ValueError``
    if no known family matches). ``device``/``dtype`` default as in :func:`bcg_pipelines.build_pipeline`. An id
    that is neither a local directory nor cached raises ``OSError`` saying how to pass a local path.
    The weights live in torch-allocated memory (:func:`own_weights`), so a saved and reloaded pipeline
    computes bitwise what the saved one did on the same device.
    """
    from diffusers import DiffusionPipeline

    spec = get_family(family) if family is not None else None
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    path = os.fspath(model_id_or_path)
    cls = spec.pipeline_class if spec is not None else DiffusionPipeline
    try:
        pipe = cls.from_pretrained(path, dtype=dtype, **from_pretrained_kwargs)
    except OSError as err:
        if os.path.isdir(path):
            raise
        raise OSError(_offline_hint(path, err)) from err
    except Exception as err:  # hub client errors that are not OSError subclasses
        if os.path.isdir(path) or type(err).__module__.split(".")[0] not in {"huggingface_hub", "requests", "httpx"}:
            raise
        raise OSError(_offline_hint(path, err)) from err
    detected = family_of(pipe)
    if spec is not None and detected.name != spec.name:
        logger.warning("load_pipeline: asked for family %r but the transformer is %s (%r)",
                       spec.name, type(pipe.transformer).__name__, detected.name)
    pipe.to(device)
    own_weights(pipe)
    logger.info("loaded %s as family %r on %s in %s", path, detected.name, device, dtype)
    return pipe
