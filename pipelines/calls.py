"""A family's pipeline call: assembling its keyword arguments, and reading what it generated.

Both scripts (``generate.py``, ``bench_step.py``) and the tests build their ``pipe(...)`` calls here, so a
family's defaults, shape rules and per-pipeline keywords are written once.
"""

from __future__ import annotations

import importlib.util
import inspect
from typing import Any

from .registry import FamilySpec, check_call, get_family

__all__ = ["BATCH_KWARGS", "call_parameters", "fit_call", "generated", "plan_call"]

#: The keyword that sets the number of outputs per prompt, by pipeline kind.
BATCH_KWARGS = ("num_images_per_prompt", "num_videos_per_prompt")


def plan_call(
    family: str | FamilySpec | None,
    size: str = "full",
    *,
    prompt: str,
    height: int | None = None,
    width: int | None = None,
    num_frames: int | None = None,
    steps: int | None = None,
    guidance: float | None = None,
    negative_prompt: str | None = None,
) -> dict[str, Any]:
    """Keyword arguments of ``pipe(...)`` for ``family`` at ``size``, before any pipeline exists.

    A family's call is its default call (steps, guidance, CFG extras such as Qwen-Image's negative
    prompt) with the shape checked by :func:`bcg_pipelines.check_call` (``ValueError`` saying what is
    allowed) and the given values put in; the guidance goes to the family's own keyword. With
    ``family=None`` (a checkpoint of no known family) the call holds only what was given.
    """
    call: dict[str, Any] = {"prompt": prompt}
    if family is None:
        shape = {"height": height, "width": width, "num_frames": num_frames}
        call.update({k: v for k, v in shape.items() if v is not None})
        guidance_kwarg = "guidance_scale"
    else:
        spec = get_family(family)
        call.update(spec.default_call(size))
        call.update(check_call(spec, height, width, num_frames, size=size))
        guidance_kwarg = spec.guidance_kwarg
    if guidance is not None:
        call[guidance_kwarg] = guidance
    if steps is not None:
        call["num_inference_steps"] = steps
    if negative_prompt is not None:
        call["negative_prompt"] = negative_prompt
    return call


def call_parameters(pipe) -> dict[str, inspect.Parameter]:
    """The named parameters of the pipeline's own ``__call__`` (``pipe``: a pipeline or a pipeline class).

    Looks through the class hierarchy, past wrappers with a bare ``(*args, **kwargs)`` signature (such as
    the subclass ``accelerate_pipeline`` gives an accelerated pipeline).
    """
    for cls in (pipe if isinstance(pipe, type) else type(pipe)).__mro__:
        fn = cls.__dict__.get("__call__")
        if fn is None:
            continue
        params = inspect.signature(fn).parameters
        if any(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name != "self" for name, p in params.items()):
            return dict(params)
    return dict(inspect.signature(pipe.__call__).parameters)


def fit_call(
    pipe,
    call: dict[str, Any],
    *,
    batch: int = 1,
    exact_shape: bool = False,
    clean_caption: bool | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """``call`` adapted to this pipeline's ``__call__``; returns ``(call, dropped keys)``.

    ``batch`` goes to the pipeline's outputs-per-prompt keyword (``ValueError`` if it has none and
    ``batch != 1``). ``exact_shape`` turns resolution binning off (the shape asked for, not the nearest
    aspect-ratio bin). ``clean_caption`` is passed where the pipeline takes it; ``None`` means False
    only where beautifulsoup4 is missing (diffusers would warn and skip cleaning). Keys the pipeline does
    not take are dropped, unless it takes ``**kwargs``.
    """
    params = call_parameters(pipe)
    call = dict(call)
    batch_kwarg = next((k for k in BATCH_KWARGS if k in params), None)
    if batch_kwarg is not None:
        call[batch_kwarg] = batch
    elif batch != 1:
        raise ValueError(f"{type(pipe).__name__} takes no images-per-prompt argument; use a batch of 1")
    if exact_shape and "use_resolution_binning" in params:
        call["use_resolution_binning"] = False
    if clean_caption is None and importlib.util.find_spec("bs4") is None:
        clean_caption = False
    if clean_caption is not None and "clean_caption" in params:
        call["clean_caption"] = clean_caption
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return call, []
    dropped = [k for k in call if k not in params]
    return {k: v for k, v in call.items() if k in params}, dropped


def generated(output) -> Any:
    """What a ``pipe(...)`` call generated, whatever its ``output_type``: ``.images`` of image pipelines,
    ``.frames`` of video pipelines (latents too, for ``output_type="latent"``), else the first element."""
    for name in ("images", "frames"):
        value = getattr(output, name, None)
        if value is not None:
            return value
    return output[0]
