"""The supported model families: name -> the diffusers transformer class each one runs, in registry order.

This is the one list of families and of the transformer classes they run. A family is an entry here plus a module
``bcg_pipelines/family_specs/<name>.py``; the library knows no family names and lists only the classes it knows
something particular about (``bcg_diffusion.KNOWN_TRANSFORMERS``). ``tests/tools/test_consistency.py`` checks that
this list, the spec modules and the README agree.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

__all__ = ["FAMILIES"]

FAMILIES: Mapping[str, str] = MappingProxyType({
    "flux": "FluxTransformer2DModel",
    "sd3": "SD3Transformer2DModel",
    "pixart": "PixArtTransformer2DModel",
    "sana": "SanaTransformer2DModel",
    "wan": "WanTransformer3DModel",
    "qwenimage": "QwenImageTransformer2DModel",
    "hunyuanvideo": "HunyuanVideoTransformer3DModel",
    "ltx": "LTXVideoTransformer3DModel",
    "cogvideox": "CogVideoXTransformer3DModel",
    "lumina2": "Lumina2Transformer2DModel",
    "zimage": "ZImageTransformer2DModel",
    "chroma": "ChromaTransformer2DModel",
    "flux2": "Flux2Transformer2DModel",
})
