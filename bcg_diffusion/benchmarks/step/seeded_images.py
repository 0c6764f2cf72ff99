"""Whole ``pipe(...)`` calls with a fixed call and seed: what the whole-pipeline rows time."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import bcg_pipelines as pipelines

from ..timing import Clock


class SeededImages:
    """``image()`` runs ``pipe(**call)`` under ``inference_mode`` with a generator seeded with ``seed`` on the
    clock's device, and returns the decoded output as numpy; every call gives the same latents."""

    def __init__(self, pipe, call: dict[str, Any], seed: int, clock: Clock):
        self.pipe, self.call, self.seed, self.clock = pipe, call, seed, clock
        self.device = "cuda" if clock.cuda else "cpu"

    def image(self, **overrides) -> np.ndarray:
        with torch.inference_mode():
            out = self.pipe(**{**self.call, **overrides}, generator=torch.Generator(self.device).manual_seed(self.seed),
                            output_type="np")
        return np.asarray(pipelines.generated(out))
