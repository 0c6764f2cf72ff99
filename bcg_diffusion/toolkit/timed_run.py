"""One timed ``pipe(...)`` call: per-step times from the step callback, the final latents, the output, and the
shapes of the ``hidden_states`` the transformer received (the size it actually ran)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import bcg_pipelines as pipelines


def _now(device: torch.device) -> float:
    """``perf_counter`` after the device finished its queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class InputShapes:
    """The shapes of the ``hidden_states`` a transformer receives while the ``with`` block runs.

    A forward pre-hook on the transformer (registered on entry, removed on exit) reads the first of
    ``hidden_states`` / ``x`` (keyword) or the first positional argument: a tensor, or a list of tensors
    (Z-Image takes one latent per sample). Only shapes are read (host metadata: no device sync). ``shapes``
    holds each distinct value once, in the order seen: a tensor's shape (a tuple of ints), or for a list the
    tuple of its tensors' shapes.
    """

    def __init__(self, transformer: torch.nn.Module | None):
        self.transformer = transformer
        self.shapes: list[tuple] = []
        self._handle = None

    def __enter__(self) -> "InputShapes":
        if self.transformer is not None:
            self._handle = self.transformer.register_forward_pre_hook(self._record, with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _record(self, _module, args, kwargs) -> None:  # None: the call's arguments are left as they are
        value = next((kwargs[k] for k in ("hidden_states", "x") if k in kwargs), args[0] if args else None)
        if isinstance(value, torch.Tensor):
            shapes = tuple(value.shape)
        elif isinstance(value, (list, tuple)) and value and all(isinstance(t, torch.Tensor) for t in value):
            shapes = tuple(tuple(t.shape) for t in value)
        else:
            return
        if shapes not in self.shapes:
            self.shapes.append(shapes)


@dataclass(frozen=True)
class RanSize:
    """The size one recorded transformer input stands for (see :func:`ran_size`).

    ``frames``, ``height`` and ``width`` are latent sizes (``None`` for packed token sequences, where only
    ``tokens`` is known); ``tokens`` of a latent grid is counted at the transformer config's patch size
    (``patch``, e.g. ``"2"`` or ``"1x2x2"``; ``None`` when the config names none).
    """

    shapes: tuple  # the InputShapes entry: a tensor shape, or a tuple of them (a list input)
    frames: int | None
    height: int | None
    width: int | None
    tokens: int | None
    patch: str | None

    def describe(self) -> str:
        """E.g. ``64x64 latents (WxH; 1024 tokens at patch 2; hidden_states 2x4x64x64)``."""
        if _is_list(self.shapes):
            dims = f"a list of {len(self.shapes)}: " + ", ".join("x".join(map(str, s)) for s in self.shapes)
        else:
            dims = "x".join(map(str, self.shapes))
        if self.height is None or self.width is None:
            return f"{self.tokens} tokens (hidden_states {dims})" if self.tokens else f"hidden_states {dims}"
        grid = f"{self.width}x{self.height} latents"
        if self.frames is not None and self.frames > 1:
            grid = f"{self.frames} frames of {grid}"
        tokens = f"; {self.tokens} tokens at patch {self.patch}" if self.tokens else ""
        return f"{grid} (WxH{tokens}; hidden_states {dims})"


def _patch_sizes(config) -> tuple[int, int, int] | None:
    """(frames, height, width) patch of a transformer config, or ``None``."""
    def first(value):
        return value[0] if isinstance(value, (list, tuple)) and value else value

    spatial = config.get("patch_size", None)
    if spatial is None:
        spatial = first(config.get("all_patch_size", None))
    temporal = config.get("patch_size_t", None) or first(config.get("all_f_patch_size", None)) or 1
    if isinstance(spatial, (list, tuple)):
        return tuple(spatial) if len(spatial) == 3 else (temporal, *spatial) if len(spatial) == 2 else None
    return (temporal, spatial, spatial) if isinstance(spatial, int) else None


def _is_list(shapes: tuple) -> bool:
    return bool(shapes) and isinstance(shapes[0], tuple)


def ran_size(shapes: tuple, config) -> RanSize:
    """Read one :class:`InputShapes` entry with the transformer's ``config``.

    Layouts: ``(B, S, C)`` packed tokens (Flux, Qwen-Image, LTX, ...); ``(B, C, H, W)`` images;
    ``(B, C, F, H, W)`` or ``(B, F, C, H, W)`` videos (told apart by ``config.in_channels``); a list of
    ``(C, F, H, W)`` latents, one per sample (Z-Image).
    """
    in_channels = config.get("in_channels", None)
    frames = height = width = None
    if _is_list(shapes):
        first = shapes[0]
        if len(first) == 4 and first[0] == in_channels:
            frames, height, width = first[1:]
    elif len(shapes) == 3:
        return RanSize(shapes, None, None, None, shapes[1], None)
    elif len(shapes) == 4:
        height, width = shapes[2], shapes[3]
    elif len(shapes) == 5:
        if shapes[1] == in_channels:
            frames, height, width = shapes[2:]
        elif shapes[2] == in_channels:
            frames, height, width = shapes[1], shapes[3], shapes[4]
    if height is None:
        return RanSize(shapes, None, None, None, None, None)
    patch = _patch_sizes(config)
    tokens = text = None
    if patch is not None:
        pt, ph, pw = patch
        tokens = -(-(frames or 1) // pt) * (height // ph) * (width // pw)
        text = f"{ph}" if (frames or 1) == 1 and pt == 1 and ph == pw else "x".join(map(str, patch))
    return RanSize(shapes, frames, height, width, tokens, text)


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
    input_shapes: list = field(default_factory=list)  # InputShapes.shapes: what the transformer received

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
    inputs = InputShapes(getattr(pipe, "transformer", None))
    try:
        t0 = _now(device)
        with torch.inference_mode(), inputs:
            out = pipe(**call_kwargs, **extra, generator=generator, output_type="np")
        total = _now(device) - t0
    finally:
        timer.uninstall()
    notes = [] if timer.mode != "none" else ["this pipeline has no step callback: per-step times unavailable"]
    return RunResult(label, pipelines.generated(out), timer.step_times(), total, timer.latents, notes=notes,
                     input_shapes=inputs.shapes)


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
