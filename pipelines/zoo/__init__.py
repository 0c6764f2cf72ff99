"""The model zoo: a tiny config and a valid forward call of every diffusion transformer of diffusers.

Public API::

    zoo_cases() -> list[ZooCase]                 every case, pipeline-faithful ones first per class
    build_tiny(case, device, dtype, seed)        the model, random weights, eval mode
    tiny_inputs(case, device, dtype, seed)       keyword inputs of one forward call
    transformer_classes() -> {name: class}       ModelMixin classes of diffusers.models.transformers
    EXCLUDED                                     classes left out, with the reason

A case's ``name`` is its class name, or ``Class[variant]`` for another call path of the same class (a
variant reproduces a path a pipeline does not take, or takes only sometimes).
"""

from __future__ import annotations

from .case import InputMaker, ZooCase, build_tiny, tiny_inputs, transformer_class
from .catalog import EXCLUDED, transformer_classes

__all__ = [
    "EXCLUDED",
    "InputMaker",
    "ZooCase",
    "build_tiny",
    "tiny_inputs",
    "transformer_class",
    "transformer_classes",
    "zoo_cases",
]


def zoo_cases() -> list[ZooCase]:
    """All cases: the known families first, then the other image, video and audio transformers.

    Raises ``ValueError`` if two cases share a name (a programming error in the case lists).
    """
    from . import cases_audio, cases_image, cases_known, cases_video

    cases = [*cases_known.CASES, *cases_image.CASES, *cases_video.CASES, *cases_audio.CASES]
    names = [case.name for case in cases]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"zoo cases with the same name: {', '.join(duplicates)}")
    return cases
