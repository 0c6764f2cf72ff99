"""The pipeline zoo: every diffusers pipeline class that runs a transformer, built from tiny components offline.

Public API::

    pipeline_cases() -> list[PipelineCase]          one case per buildable class
    build(case, device, dtype, seed)                the pipeline (random weights, equal for one seed on any device)
    call_kwargs(case, pipe, seed, steps)            keyword arguments of a call of the class's own path
    transformer_pipelines() -> {name: PipelineClass}   derived from the installed diffusers
    NOT_BUILT, NOT_YET_BUILT                        classes of that list with no case, and why

The transformer zoo (:mod:`bcg_pipelines.zoo`) covers the models; this covers the pipelines' own loops
(guidance, image latents per step, masks, control residuals, reference frames). See docs/pipelines.md.
"""

from __future__ import annotations

from .case import OUTPUTS_PER_PROMPT, PipelineCase, build, call_kwargs, outputs_per_prompt_kwarg, parameters
from .catalog import PipelineClass, transformer_pipelines
from .not_built import NOT_BUILT, NOT_YET_BUILT

__all__ = [
    "NOT_BUILT",
    "NOT_YET_BUILT",
    "OUTPUTS_PER_PROMPT",
    "PipelineCase",
    "PipelineClass",
    "build",
    "call_kwargs",
    "get_case",
    "group_of",
    "outputs_per_prompt_kwarg",
    "parameters",
    "pipeline_cases",
    "transformer_pipelines",
]

_CASE_MODULES = ("cases_flux", "cases_sd3", "cases_pixart_sana", "cases_wan", "cases_qwen", "cases_zimage_chroma_flux2", "cases_video_families", "cases_image_other", "cases_video_other", "cases_cosmos", "cases_audio_video_misc", "cases_vl", "cases_qwen3_vl", "cases_ltx2", "cases_hunyuan15", "cases_t5gemma", "cases_bria_fibo", "cases_ernie")


def pipeline_cases() -> list[PipelineCase]:
    """Every case, in module order; ``ValueError`` if two cases name the same class (a programming error)."""
    import importlib

    cases = [case for name in _CASE_MODULES for case in importlib.import_module(f"{__name__}.{name}").CASES]
    names = [case.pipeline for case in cases]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"pipeline zoo cases of the same class: {', '.join(duplicates)}")
    return cases


def get_case(name: str) -> PipelineCase:
    """The case of pipeline class ``name``; ``KeyError`` naming the classes with a case otherwise."""
    cases = {case.pipeline: case for case in pipeline_cases()}
    if name not in cases:
        raise KeyError(f"no pipeline zoo case for {name!r}; the cases are: {', '.join(sorted(cases))}")
    return cases[name]


def group_of(case: PipelineCase) -> str:
    """The family group of a case: its ``group``, else the ``diffusers.pipelines`` folder of its class."""
    if case.group:
        return case.group
    found = transformer_pipelines().get(case.pipeline)
    return found.folder if found is not None else ""
