"""Which family loop splits a pipeline (:func:`loop_for`), by the diffusers pipeline class it is (an accelerated
pipeline's class derives from it)."""

from __future__ import annotations

from .config import STEP_PIPELINES, StepConfig, StepError
from .family_flux import FluxLoop
from .family_pixart import PixArtLoop
from .family_sana import SanaLoop
from .family_sd3 import SD3Loop
from .family_wan import WanLoop
from .loop import FamilyLoop

__all__ = ["LOOPS", "loop_for"]

LOOPS: tuple[type[FamilyLoop], ...] = (PixArtLoop, SanaLoop, SD3Loop, FluxLoop, WanLoop)


def loop_for(pipe, config: StepConfig) -> FamilyLoop:
    """The family loop of ``pipe``; :class:`StepError` naming the supported pipelines for any other."""
    names = [cls.__name__ for cls in type(pipe).__mro__]
    for loop in LOOPS:
        if any(name in loop.pipeline_names for name in names):
            return loop(pipe, config)
    raise StepError(f"step batching has no denoising loop for {type(pipe).__name__}; it splits "
                    f"{', '.join(STEP_PIPELINES)}")
