"""One timed ``pipe(...)`` call: per-step times from the step callback, the final latents, the output."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import pipelines


def _now(device: torch.device) -> float:
    """``perf_counter`` after the device finished its queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class StepTimer:
    """Time stamps at the start of the denoising loop and at the end of each step of one ``pipe(...)`` call.

    The loop start is taken when the pipeline opens its progress bar (right before the first step); step ends
    come from ``callback_on_step_end`` (or the legacy ``callback`` of pipelines such as PixArt-Sigma).
    CUDA is synchronised before each time stamp, so a step's time includes its GPU work.
    """

    def __init__(self, pipe, device: torch.device):
        self.pipe = pipe
        self.device = device
        self.loop_start: float | None = None
        self.ends: list[float] = []
        self.latents = None
        self.mode = "none"

    def install(self) -> dict[str, Any]:
        """Hook the pipeline; return the keyword arguments to add to its call."""
        original_bar = type(self.pipe).progress_bar.__get__(self.pipe)

        def progress_bar(*args, **kwargs):
            bar = original_bar(*args, **kwargs)
            if self.loop_start is None:
                self.loop_start = _now(self.device)
            return bar

        self.pipe.progress_bar = progress_bar
        params = pipelines.call_parameters(self.pipe)
        if "callback_on_step_end" in params:
            self.mode = "callback_on_step_end"
            kwargs: dict[str, Any] = {"callback_on_step_end": self._on_step_end}
            if "callback_on_step_end_tensor_inputs" in params:
                kwargs["callback_on_step_end_tensor_inputs"] = ["latents"]
            return kwargs
        if "callback" in params:
            self.mode = "callback"
            return {"callback": self._on_step, **({"callback_steps": 1} if "callback_steps" in params else {})}
        return {}

    def _on_step_end(self, _pipe, _step, _timestep, callback_kwargs):
        self.ends.append(_now(self.device))
        if callback_kwargs.get("latents") is not None:
            self.latents = callback_kwargs["latents"].detach().clone()
        return callback_kwargs

    def _on_step(self, _step, _timestep, latents):
        self.ends.append(_now(self.device))
        self.latents = latents.detach().clone()

    def uninstall(self) -> None:
        self.pipe.__dict__.pop("progress_bar", None)

    def step_times(self) -> list[float]:
        if not self.ends:
            return []
        start = self.loop_start if self.loop_start is not None and self.loop_start <= self.ends[0] else None
        stamps = ([start] if start is not None else []) + self.ends
        return [b - a for a, b in zip(stamps, stamps[1:])]


@dataclass
class RunResult:
    label: str
    output: Any  # numpy array: images (B, H, W, 3) or videos (B, F, H, W, 3), floats in [0, 1]
    step_times: list[float]
    total_s: float
    latents: Any = None
    bcg_stats: Any = None
    notes: list[str] = field(default_factory=list)
    cache_passes: Any = None  # bcg_diffusion.step_caches.CachePasses of the run (with a step cache)

    @property
    def median_step(self) -> float | None:
        return statistics.median(self.step_times) if self.step_times else None

    @property
    def steady_median_step(self) -> float | None:
        """Median over the steps after the first (the first may include capture or compilation)."""
        rest = self.step_times[1:]
        return statistics.median(rest) if rest else self.median_step


def run_pipeline(pipe, call_kwargs: dict[str, Any], seed: int, device: torch.device, label: str) -> RunResult:
    """One ``pipe(...)`` call with a fresh generator seeded ``seed``; returns its output as numpy and timings."""
    timer = StepTimer(pipe, device)
    extra = timer.install()
    generator = torch.Generator(device="cuda" if device.type == "cuda" else "cpu").manual_seed(seed)
    try:
        t0 = _now(device)
        with torch.inference_mode():
            out = pipe(**call_kwargs, **extra, generator=generator, output_type="np")
        total = _now(device) - t0
    finally:
        timer.uninstall()
    notes = [] if timer.mode != "none" else ["this pipeline has no step callback: per-step times unavailable"]
    return RunResult(label, pipelines.generated(out), timer.step_times(), total, timer.latents, notes=notes)


def compare_outputs(a: RunResult, b: RunResult) -> tuple[bool, str]:
    """Whether two runs' final latents and decoded outputs are bitwise identical, and a sentence saying so."""
    parts, same = [], True
    if a.latents is not None and b.latents is not None:
        eq = a.latents.shape == b.latents.shape and torch.equal(a.latents, b.latents)
        same &= eq
        diff = 0.0 if eq or a.latents.shape != b.latents.shape else (a.latents.float() - b.latents.float()).abs().max().item()
        parts.append("final latents bitwise identical" if eq else f"final latents differ (max abs diff {diff:.3g})")
    oa, ob = np.asarray(a.output), np.asarray(b.output)
    eq = oa.shape == ob.shape and np.array_equal(oa, ob)
    same &= eq
    diff = float(np.abs(oa.astype(np.float64) - ob.astype(np.float64)).max()) if oa.shape == ob.shape else float("nan")
    parts.append("decoded outputs bitwise identical" if eq else f"decoded outputs differ (max abs diff {diff:.3g})")
    return same, "; ".join(parts)
