"""Model families of bcg-diffusion: registry, random-weight builders and real-weight loading.

The folder ``pipelines/`` of the repository installs as the package ``bcg_pipelines`` (``import
bcg_pipelines``), so that it cannot collide with any other top-level ``pipelines``; see docs/pipelines.md.

Public API::

    list_families() -> list[str]
    get_family(name) -> FamilySpec
    describe(family, size="full") -> FamilyDescription
    build_pipeline(family, size="tiny", device=None, dtype=None, seed=0) -> diffusers pipeline
    load_pipeline(model_id_or_path, family=None, device=None, dtype=None) -> diffusers pipeline
    family_of(pipe_or_transformer) -> FamilySpec
    validate_shape(family, height, width, frames=None)
    check_call(family, height=None, width=None, num_frames=None, size="full") -> dict
    plan_call(family, size, prompt=..., height=None, ...) -> dict     (a call before any pipeline exists)
    fit_call(pipe, call, batch=1, exact_shape=False) -> (dict, dropped keys)
    generated(output) -> images, frames or latents of a pipe(...) output
    ignored_call_fields(pipe_or_family, call) -> {keyword: IgnoredField}   (what a call would set for nothing)
    resolve_device(device), resolve_dtype(dtype, device); DTYPES, DTYPE_NAMES, dtype_name(dtype)
"""

from .build import build_pipeline
from .calls import call_parameters, fit_call, generated, plan_call
from .describe import FamilyDescription, describe, transformer_param_count
from .dtypes import DTYPE_NAMES, DTYPES, dtype_name, resolve_device, resolve_dtype
from .ignored import IgnoredField, ignored_call_fields
from .real_weights import load_pipeline
from .registry import (
    CFG_MODES,
    SIZES,
    FamilySpec,
    SizeSpec,
    TextEncoderSpec,
    check_call,
    family_of,
    get_family,
    list_families,
    validate_shape,
)

__all__ = [
    "CFG_MODES",
    "DTYPES",
    "DTYPE_NAMES",
    "SIZES",
    "FamilyDescription",
    "FamilySpec",
    "IgnoredField",
    "SizeSpec",
    "TextEncoderSpec",
    "build_pipeline",
    "call_parameters",
    "check_call",
    "describe",
    "dtype_name",
    "family_of",
    "fit_call",
    "generated",
    "get_family",
    "ignored_call_fields",
    "list_families",
    "load_pipeline",
    "plan_call",
    "resolve_device",
    "resolve_dtype",
    "transformer_param_count",
    "validate_shape",
]
