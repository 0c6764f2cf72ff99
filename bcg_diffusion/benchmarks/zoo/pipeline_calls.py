"""One pipeline zoo class through the probe: an accelerated pipeline against its eager twin, call by call.

:func:`probe_class` builds the class's tiny pipeline twice with one seed (both bitwise equal), calls the twin
twice with the same seed (is eager repeatable?), accelerates the other with ``accelerate_pipeline``, and makes
the same calls on both: three seeds, one call with two outputs per prompt, one with a step-end callback that
edits the latents. Every output is compared bitwise with the twin's. ``get_stats`` says what was captured.
Every failure is caught and recorded with the phase it happened in; nothing here raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

import bcg_diffusion
from bcg_pipelines import pipeline_zoo

from .zoo_probe import listening, stats_dict

__all__ = ["CallResult", "ClassResult", "compare_outputs", "output_tensors", "probe_class"]

#: The seeds of the three plain calls; the two-outputs call and the callback call use the next two.
SEEDS = (1, 2, 3)
#: What the callback does to the latents at the end of step 0 (both pipelines get it).
LATENT_EDIT = 0.9


@dataclass
class CallResult:
    """One call on both pipelines: ``bitwise`` (``None``: not compared), the largest difference, and what
    the runner counted for it (hits, first calls, eager calls, captures). ``eager_repeats``: for a call that
    differed, whether the eager twin made the same call again bitwise equal to its first output (``None``: not
    asked, the call did not differ); ``False`` makes the difference no verdict on the replay."""

    label: str
    bitwise: bool | None = None
    max_diff: float | None = None
    counters: dict[str, int] = field(default_factory=dict)
    note: str = ""
    eager_repeats: bool | None = None


@dataclass
class ClassResult:
    """What one class did. ``status``: ``replayed`` (every transformer call after a key's first replayed a
    graph), ``partial`` (some ran eagerly or fell back), ``eager`` (nothing replayed; ``reason`` says why),
    ``not accelerated`` (no CUDA), ``mismatch`` (an accelerated output differed from the twin's),
    ``unrepeatable`` (differed, but the eager twin does not repeat itself either: no verdict), ``crash``
    (``phase`` and ``error`` say where), ``missing package`` (the class needs a package this machine lacks: ftfy),
    ``skipped`` (time budget, or the CUDA context was lost earlier)."""

    name: str
    group: str = ""
    note: str = ""
    status: str = ""
    phase: str = ""
    error: str = ""
    reason: str = ""
    eager_repeatable: bool | None = None
    calls: list[CallResult] = field(default_factory=list)
    stats: dict[str, Any] | None = None
    accelerate_warnings: list[str] = field(default_factory=list)
    bcg_warnings: list[str] = field(default_factory=list)
    eager_reasons: list[str] = field(default_factory=list)
    key_changes: list[str] = field(default_factory=list)  # the runner's "new graph key ... changed ..." lines
    left_eager: list[str] = field(default_factory=list)  # transformer components accelerate_pipeline did not take
    seconds: float = 0.0

    @property
    def ran(self) -> bool:
        """Built, and its eager twin called twice (whatever came after)."""
        return self.eager_repeatable is not None


# -- outputs -------------------------------------------------------------------------------------------
def output_tensors(out: Any, path: str = "out") -> list[tuple[str, torch.Tensor]]:
    """Every array in a pipeline output (tensors, numpy arrays, PIL images; nested in outputs, lists, dicts),
    as ``(path, tensor)`` in a fixed order."""
    if isinstance(out, torch.Tensor):
        return [(path, out.detach())]
    if isinstance(out, np.ndarray):
        return [(path, torch.from_numpy(np.ascontiguousarray(out)))]
    if hasattr(out, "getpixel") and hasattr(out, "size"):  # a PIL image
        return [(path, torch.from_numpy(np.asarray(out).copy()))]
    if isinstance(out, dict):
        return [item for key, value in out.items() for item in output_tensors(value, f"{path}.{key}")]
    if isinstance(out, (list, tuple)):
        return [item for i, value in enumerate(out) for item in output_tensors(value, f"{path}[{i}]")]
    return []


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.detach().reshape(-1).contiguous()
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    return flat.cpu().view(torch.uint8)


def compare_outputs(reference: list[tuple[str, torch.Tensor]], got: list[tuple[str, torch.Tensor]]) -> tuple[bool, float | None]:
    """(bitwise equal, largest absolute difference or ``None`` where the structures differ)."""
    if [p for p, _ in reference] != [p for p, _ in got] or any(
            a.shape != b.shape or a.dtype != b.dtype for (_, a), (_, b) in zip(reference, got)):
        return False, None
    equal, diff = True, 0.0
    for (_, a), (_, b) in zip(reference, got):
        equal = equal and torch.equal(_bits(a), _bits(b))
        if a.is_floating_point():
            delta = (a.double().cpu() - b.double().cpu()).abs()
            finite = delta[torch.isfinite(delta)]
            diff = max(diff, float(finite.max()) if finite.numel() else 0.0)
        elif not torch.equal(a.cpu(), b.cpu()):
            diff = float("inf")
    return equal, diff


# -- calls -------------------------------------------------------------------------------------------------
def _generator(pipe, seed: int) -> torch.Generator:
    device = getattr(pipe, "_execution_device", None) or pipe.device
    return torch.Generator(device=device).manual_seed(seed)


def _edit_latents(pipe, step: int, timestep, callback_kwargs: dict[str, Any]) -> dict[str, Any]:
    """A step-end callback: scales the latents at the end of step 0 (the next steps start from the edit)."""
    latents = callback_kwargs.get("latents")
    if step == 0 and isinstance(latents, torch.Tensor):
        return {"latents": latents * LATENT_EDIT}
    return {}


def _edit_latents_legacy(step: int, timestep, latents: torch.Tensor) -> None:
    """The legacy ``callback(step, timestep, latents)``: edits the latents in place at step 0."""
    if step == 0:
        latents.mul_(LATENT_EDIT)


def callback_kwargs(pipe) -> tuple[dict[str, Any], str]:
    """The keyword arguments that install the latent-editing callback, and a note (``""`` when none fits)."""
    params = pipeline_zoo.parameters(pipe)
    if "callback_on_step_end" in params:
        inputs = getattr(pipe, "_callback_tensor_inputs", None) or []
        if "latents" not in inputs:
            return {}, "its step-end callback cannot take the latents"
        return {"callback_on_step_end": _edit_latents, "callback_on_step_end_tensor_inputs": ["latents"]}, ""
    if "callback" in params:
        kwargs = {"callback": _edit_latents_legacy}
        if "callback_steps" in params:
            kwargs["callback_steps"] = 1
        return kwargs, "legacy callback, latents edited in place"
    return {}, "no step-end callback"


def two_outputs_kwargs(case, pipe, call: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The call changed to make two outputs per prompt, or ``None`` and why not."""
    keyword = pipeline_zoo.outputs_per_prompt_kwarg(pipe)
    if keyword is not None:
        return {**call, keyword: 2}, ""
    if case.two_outputs is not None:
        return case.two_outputs(dict(call)), "two prompts"
    return None, "no outputs-per-prompt keyword"


def planned_calls(case, pipe, steps: int | None) -> list[tuple[str, dict[str, Any] | None, int, str]]:
    """``(label, call or None, seed, note)`` of every call the probe makes on both pipelines."""
    base = pipeline_zoo.call_kwargs(case, pipe, seed=0, steps=steps)
    plan = [(f"seed {seed}", base, seed, "") for seed in SEEDS]
    two, note = two_outputs_kwargs(case, pipe, base)
    plan.append(("2 outputs", two, SEEDS[-1] + 1, note))
    extra, note = callback_kwargs(pipe)
    plan.append(("callback", {**base, **extra} if extra else None, SEEDS[-1] + 2, note))
    return plan


def _seed_globals(seed: int) -> None:
    """Seed the global RNGs too: some pipelines draw without their generator (SD3 ControlNet samples the control
    image's latent distribution with the global RNG), and both pipelines must draw the same numbers."""
    import random

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run_call(pipe, call: dict[str, Any], seed: int) -> list[tuple[str, torch.Tensor]]:
    """One call with a fresh generator for ``seed`` and the global RNGs seeded; its outputs, copied."""
    _seed_globals(seed)
    with torch.no_grad():
        out = pipe(**call, generator=_generator(pipe, seed))
    return [(path, tensor.clone()) for path, tensor in output_tensors(out)]


_COUNTERS = ("hits", "warmup_calls", "eager_calls", "captures", "failed_captures")


def counters(pipe) -> dict[str, int]:
    stats = bcg_diffusion.get_stats(pipe)
    return {name: getattr(stats, name) for name in _COUNTERS}


class _KeyChanges(logging.Handler):
    """Collects the runner's ``new graph key ... changed ...`` info lines (at most :data:`KEY_CHANGES`, distinct)."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "new graph key" in message and message not in self.lines and len(self.lines) < KEY_CHANGES:
            self.lines.append(message[:300])


KEY_CHANGES = 4


@contextlib.contextmanager
def _key_changes(lines: list[str]):
    logger = logging.getLogger("bcg_diffusion")
    handler, level = _KeyChanges(lines), logger.level
    logger.addHandler(handler)
    logger.setLevel(min(level or logging.INFO, logging.INFO))
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


# -- one class ---------------------------------------------------------------------------------------------
def _error_text(exc: BaseException) -> str:
    message = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    return f"{type(exc).__name__}: {message} | " + " <- ".join(
        f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in frames)


def _library_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    """First lines of the RuntimeWarnings (the library's category and ``BCGCaptureWarning``), in order."""
    lines: list[str] = []
    for warning in caught:
        if issubclass(warning.category, RuntimeWarning):
            line = str(warning.message).strip().splitlines()[0][:300] if str(warning.message).strip() else ""
            if line and line not in lines:
                lines.append(line)
    return lines


@dataclass
class Settings:
    device: torch.device
    dtype: torch.dtype
    seed: int = 0
    steps: int | None = None
    debug: bool = False  # BCGConfig(debug=True): segments run eagerly (the CPU check of the plumbing)


def probe_class(case, settings: Settings) -> ClassResult:
    """Run one class (see the module docstring); never raises."""
    result = ClassResult(case.pipeline, case.group or pipeline_zoo.group_of(case), case.note)
    start = time.perf_counter()
    pipes: list[Any] = []
    with listening() as heard, _key_changes(result.key_changes):
        try:
            _probe(case, settings, result, pipes)
        except ImportError as exc:  # a package the class needs is missing here (ftfy): not a crash of the class
            status = "missing package" if result.phase == "build" else "crash"
            result.status, result.error = status, _error_text(exc)
        except Exception as exc:  # noqa: BLE001 - a crash is a result
            result.status, result.error = "crash", _error_text(exc)
        finally:
            _release(pipes, result)
    result.eager_reasons = heard.eager_reasons
    if result.status in ("partial", "eager") and not result.reason:  # the runner's reasons, complete now
        result.status, result.reason = classify(result)
    result.seconds = round(time.perf_counter() - start, 3)
    del pipes
    gc.collect()
    if settings.device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def _probe(case, settings: Settings, result: ClassResult, pipes: list[Any]) -> None:
    result.phase = "build"
    pipe = pipeline_zoo.build(case, settings.device, settings.dtype, settings.seed)
    pipes.append(pipe)
    twin = pipeline_zoo.build(case, settings.device, settings.dtype, settings.seed)
    pipes.append(twin)
    plan = planned_calls(case, pipe, settings.steps)
    result.phase = "eager"
    label, call, seed, _ = plan[0]
    references = {label: run_call(twin, call, seed)}
    result.eager_repeatable = compare_outputs(references[label], run_call(twin, call, seed))[0]
    result.phase = "accelerate"
    _accelerate(pipe, settings, result)
    for label, call, seed, note in plan:
        result.phase = f"call {label}"
        result.calls.append(_compared_call(pipe, twin, references, (label, call, seed, note)))
    result.phase = ""
    result.stats = stats_dict(pipe)
    result.status, result.reason = classify(result)
    if result.status == "not accelerated":
        result.reason = bcg_diffusion.get_stats(pipe).inactive_reason or ""


def _accelerate(pipe, settings: Settings, result: ClassResult) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bcg_diffusion.accelerate_pipeline(pipe, bcg_diffusion.BCGConfig(debug=settings.debug))
    result.accelerate_warnings = _library_warnings(caught)
    if bcg_diffusion.is_accelerated(pipe):
        result.left_eager = left_eager(pipe)


def left_eager(pipe) -> list[str]:
    """``name (Class)`` of the pipeline's components of a diffusers transformer class that are not accelerated
    (``accelerate_pipeline`` takes the components named ``transformer...``: Ideogram 4's
    ``unconditional_transformer`` runs eagerly)."""
    from bcg_pipelines.zoo import transformer_classes

    classes = set(transformer_classes())
    return [f"{name} ({type(module).__name__})" for name, module in pipe.components.items()
            if isinstance(module, torch.nn.Module) and type(module).__name__ in classes
            and not bcg_diffusion.is_accelerated(module)]


def _compared_call(pipe, twin, references: dict, planned: tuple) -> CallResult:
    label, call, seed, note = planned
    if call is None:
        return CallResult(label, note=note or "not made")
    if label not in references:
        try:
            references[label] = run_call(twin, call, seed)
        except Exception as exc:  # noqa: BLE001 - the class cannot make this call, eagerly either
            return CallResult(label, note=f"not made: the eager twin raises {_error_text(exc).split(' | ')[0]}")
    before = counters(pipe)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = run_call(pipe, call, seed)
    after = counters(pipe)
    equal, diff = compare_outputs(references[label], got)
    moved = {name: after[name] - before[name] for name in _COUNTERS}
    result = CallResult(label, equal, diff, moved, note)
    warned = _library_warnings(caught)
    if not equal:
        result.eager_repeats = compare_outputs(references[label], run_call(twin, call, seed))[0]
        if not result.eager_repeats:
            warned.insert(0, "the eager twin does not repeat this call either (no verdict on the replay)")
    if warned:
        result.note = "; ".join(filter(None, [note, *warned]))
    return result


def _release(pipes: list[Any], result: ClassResult) -> None:
    for pipe in pipes:
        try:
            bcg_diffusion.remove_acceleration(pipe)
        except Exception as exc:  # noqa: BLE001 - cleanup must not mask the result
            result.error = result.error or f"remove_acceleration: {_error_text(exc)}"
    pipes.clear()


def classify(result: ClassResult) -> tuple[str, str]:
    """``(status, reason)`` of a class whose calls all ran (see :class:`ClassResult`)."""
    differed = [c for c in result.calls if c.bitwise is False]
    if differed:
        if any(c.eager_repeats is not False for c in differed):  # the twin repeats a call the replay got wrong
            return "mismatch", ""
        calls = ", ".join(c.label for c in differed)
        return "unrepeatable", (f"the eager twin does not repeat itself ({calls}): no verdict; run the class again "
                                "with --deterministic")
    stats = result.stats
    if stats is None:
        return "not accelerated", ""
    entries = stats.get("entries", ())
    fallbacks = sorted({e["fallback"] for e in entries if e["fallback"]})
    if stats["hits"] == 0:
        calls = stats["hits"] + stats["warmup_calls"] + stats["eager_calls"]
        if not fallbacks and not result.eager_reasons and calls and stats["warmup_calls"] == calls:
            kept = len(entries)
            return "eager", (f"every transformer call was the first call of a new key ({stats['misses']} misses, "
                             f"{kept} kept): the inputs change from call to call")
        reason = "; ".join(fallbacks or result.eager_reasons or ["no graph key was replayed"])
        return "eager", reason
    if stats["eager_calls"] or stats["failed_captures"] or fallbacks:
        return "partial", "; ".join(fallbacks or result.eager_reasons)
    return "replayed", ""


def as_dict(result: ClassResult) -> dict[str, Any]:
    record = dataclasses.asdict(result)
    record["ran"] = result.ran
    return record


def release_generators(report: Callable[[str], None] = print) -> None:
    """After a failed capture torch's CUDA generators can believe they still capture: reset them."""
    try:
        from bcg_diffusion.core import reset_generator_capture_state

        reset_generator_capture_state()
    except Exception as exc:  # noqa: BLE001 - the next class reports its own error
        report(f"could not reset the CUDA generators: {_error_text(exc)}")
