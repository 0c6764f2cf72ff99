"""Model families of bcg-diffusion: registry, random-weight builders and real-weight loading.

Public API::

    list_families() -> list[str]
    get_family(name) -> FamilySpec
    describe(family, size="full") -> FamilyDescription
    build_pipeline(family, size="tiny", device=None, dtype=None, seed=0) -> diffusers pipeline
    load_pipeline(model_id_or_path, family=None, device=None, dtype=None) -> diffusers pipeline
    family_of(pipe_or_transformer) -> FamilySpec
    validate_shape(family, height, width, frames=None)
    check_call(family, height=None, width=None, num_frames=None, size="full") -> dict
"""

from .build import build_pipeline
from .describe import FamilyDescription, describe, transformer_param_count
from .load import load_pipeline
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
    "SIZES",
    "FamilyDescription",
    "FamilySpec",
    "SizeSpec",
    "TextEncoderSpec",
    "build_pipeline",
    "check_call",
    "describe",
    "family_of",
    "get_family",
    "list_families",
    "load_pipeline",
    "transformer_param_count",
    "validate_shape",
]
