"""``warmup``: capture the graphs of known shapes before the first real call.

A user who knows the sizes that will be asked (a server's resolutions, a batch job's size) calls
:func:`warmup` once after :func:`~bcg_diffusion.accelerate_pipeline` (and after compiling): one short
pipeline call per shape captures the graph keys those calls need (and compiles, and runs the
one-time set-up of cuBLAS, cuDNN and the VAE), so later calls with the same settings replay from
their first step. Warm-up leaves what later calls produce unchanged: it uses its own generator,
restores the global RNG states and every scheduler's state, and resets the step-cache hooks.
"""

from __future__ import annotations

import copy
import inspect
import logging
import time
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import torch

from .accelerate import get_stats
from .families import is_transformer_component

logger = logging.getLogger("bcg_diffusion")

DEFAULT_PROMPT = "warm-up"
# Call settings warm-up sets itself: a caller's generator must not be advanced, and the callback
# would see steps that are not the user's.
_REFUSED = {
    "generator": "warm-up makes calls with its own generator, so that yours is not advanced; drop it",
    "callback_on_step_end": "warm-up calls are not the user's steps; drop the callback",
    "latents": "warm-up draws its own noise; drop latents (their shape is set by height and width)",
}


@dataclass(frozen=True)
class WarmedShape:
    """One warm-up call: its settings, wall time, and the graph keys it captured."""

    settings: dict
    seconds: float
    captures: int
    capture_time_s: float
    graph_memory_bytes: int


@dataclass(frozen=True)
class WarmupReport:
    """What :func:`warmup` did: one :class:`WarmedShape` per shape, and the total wall time."""

    shapes: tuple[WarmedShape, ...]
    total_s: float
    num_inference_steps: int

    @property
    def captures(self) -> int:
        """Graph keys captured by the warm-up calls (0 when the pipeline is not accelerated)."""
        return sum(s.captures for s in self.shapes)

    def __str__(self) -> str:
        lines = [
            f"warm-up: {len(self.shapes)} shape(s), {self.captures} graph key(s) captured, "
            f"{self.total_s:.2f} s ({self.num_inference_steps} steps per call)"
        ]
        for s in self.shapes:
            what = ", ".join(f"{k}={v}" for k, v in s.settings.items())
            lines.append(
                f"  {what}: {s.seconds:.2f} s, {s.captures} captured (capture {s.capture_time_s:.2f} s, "
                f"{s.graph_memory_bytes / 2**20:.1f} MiB)"
            )
        return "\n".join(lines)


def warmup(
    pipe: Any,
    shapes: Sequence[Mapping[str, Any]],
    *,
    num_inference_steps: int = 2,
    **call: Any,
) -> WarmupReport:
    """Make one short call of ``pipe`` per entry of ``shapes`` so that later calls with the same
    settings hit captured graphs from their first step.

    ``shapes``: a list of dicts of call settings that differ between the calls to warm, usually
    ``dict(height=1024, width=1024)`` (and ``num_frames`` for video). ``call``: the settings the
    real calls share, as they will be passed (``prompt``, ``guidance_scale``,
    ``num_images_per_prompt``, ``negative_prompt``, ``use_resolution_binning``, ...): they decide the
    shapes and the number of transformer calls per step (CFG on or off, batch size), so pass them
    as your calls will. Each call runs ``num_inference_steps`` steps (default 2) and decodes, with
    its own generator. Afterwards the global RNG states, every scheduler's state and the step-cache
    hooks are as before, so later calls produce exactly what they would have without warm-up.

    Call it in the grad mode of the calls it warms: ``torch.inference_mode()`` and a plain call
    (diffusers' ``no_grad``) are different graph keys, so a warm-up outside ``inference_mode`` does
    not serve calls made inside it.

    Works with or without acceleration (it then warms compiled code and library set-up only).
    Raises ``TypeError``/``ValueError`` for settings the pipeline does not take, before any call.
    """
    settings = _checked(pipe, shapes, num_inference_steps, call)
    device = _device_of(pipe)
    start = time.perf_counter()
    warmed = []
    with _preserved_state(pipe):
        for setting in settings:
            warmed.append(_one_call(pipe, setting, device))
    report = WarmupReport(tuple(warmed), time.perf_counter() - start, num_inference_steps)
    logger.info("bcg: %s", report)
    return report


def _checked(pipe: Any, shapes: Any, steps: Any, call: dict) -> list[dict]:
    if not callable(pipe) or not isinstance(getattr(pipe, "components", None), dict):
        raise TypeError(f"warmup needs a diffusers pipeline, got {type(pipe).__name__}")
    if isinstance(shapes, Mapping) or not isinstance(shapes, Sequence) or not shapes:
        raise TypeError(
            "warmup: shapes must be a non-empty list of dicts, e.g. [dict(height=1024, width=1024)], "
            f"got {shapes!r}"
        )
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"warmup: num_inference_steps must be an int >= 1, got {steps!r}")
    # Named parameters only: a pipeline's **kwargs ignores a misspelt setting, which would warm the wrong shape.
    parameters = {
        name for name, p in inspect.signature(pipe.__call__).parameters.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    settings = []
    for shape in shapes:
        if not isinstance(shape, Mapping):
            raise TypeError(f"warmup: each shape must be a dict of call settings, got {shape!r}")
        merged = {**call, **shape}
        for name, reason in _REFUSED.items():
            if name in merged:
                raise ValueError(f"warmup: {name!r} is not accepted: {reason}")
        unknown = [k for k in merged if k not in parameters]
        if unknown:
            raise TypeError(
                f"warmup: {type(pipe).__name__}.__call__ takes no {', '.join(map(repr, unknown))}; "
                "pass only settings the pipeline's calls take (named parameters of its __call__)"
            )
        if "prompt" not in merged and "prompt_embeds" not in merged and "prompt" in parameters:
            merged["prompt"] = DEFAULT_PROMPT
        merged["num_inference_steps"] = steps
        settings.append(merged)
    return settings


def _device_of(pipe: Any) -> torch.device:
    device = getattr(pipe, "_execution_device", None) or getattr(pipe, "device", None)
    return torch.device(device) if device is not None else torch.device("cpu")


def _one_call(pipe: Any, setting: dict, device: torch.device) -> WarmedShape:
    before = get_stats(pipe)
    generator = torch.Generator(device).manual_seed(0)
    _synchronize(device)
    t0 = time.perf_counter()
    pipe(**setting, generator=generator)
    _synchronize(device)
    seconds = time.perf_counter() - t0
    after = get_stats(pipe)
    shown = {k: v for k, v in setting.items() if k not in ("prompt", "negative_prompt", "num_inference_steps")}
    if not (before.active and after.active):
        return WarmedShape(shown, seconds, 0, 0.0, 0)
    return WarmedShape(
        shown,
        seconds,
        after.captures - before.captures,
        max(0.0, after.capture_time_s - before.capture_time_s),
        max(0, after.graph_memory_bytes - before.graph_memory_bytes),
    )


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _preserved_state:
    """Global RNG states, schedulers' state, the progress bar setting and step-cache hook state
    are put back as they were on exit (also after an exception)."""

    def __init__(self, pipe: Any) -> None:
        self.pipe = pipe

    def __enter__(self) -> None:
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        self.schedulers = [(s, copy.deepcopy(s.__dict__)) for s in _schedulers(self.pipe)]
        self.had_bar = "_progress_bar_config" in self.pipe.__dict__
        self.bar = copy.copy(self.pipe.__dict__.get("_progress_bar_config"))
        self.pipe.set_progress_bar_config(**{**(self.bar or {}), "disable": True})

    def __exit__(self, *exc: Any) -> None:
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        for scheduler, saved in self.schedulers:
            scheduler.__dict__.clear()
            scheduler.__dict__.update(saved)
        if self.had_bar:
            self.pipe._progress_bar_config = self.bar
        else:
            self.pipe.__dict__.pop("_progress_bar_config", None)
        for module in _denoisers(self.pipe):
            registry = module.__dict__.get("_diffusers_hook")
            if registry is not None:
                registry.reset_stateful_hooks(recurse=True)


def _schedulers(pipe: Any) -> Iterator[Any]:
    for component in pipe.components.values():
        if component is not None and callable(getattr(component, "set_timesteps", None)):
            yield component


def _denoisers(pipe: Any) -> Iterator[torch.nn.Module]:
    for name, component in pipe.components.items():
        if isinstance(component, torch.nn.Module) and (is_transformer_component(name) or name == "unet"):
            yield component
