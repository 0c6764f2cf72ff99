"""One pipeline zoo case: how to build a diffusers pipeline class from tiny components, and a call of its own path."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .media import Media
from .parts import Parts, diffusers_class

__all__ = ["OUTPUTS_PER_PROMPT", "PipelineCase", "build", "call_kwargs", "needs_ftfy", "outputs_per_prompt_kwarg",
           "parameters"]

#: The keywords that set how many outputs one prompt makes, by pipeline kind.
OUTPUTS_PER_PROMPT = ("num_images_per_prompt", "num_videos_per_prompt", "num_waveforms_per_prompt")


@dataclass(frozen=True)
class PipelineCase:
    """A diffusers pipeline class with tiny components and a call that takes its own path.

    Attributes:
        pipeline: the class name in ``diffusers``.
        components: ``components(parts) -> kwargs`` of the class's constructor (see :class:`Parts`).
        call: ``call(media) -> kwargs`` of one call without ``generator`` (see :class:`Media`): the prompt, the
            smallest valid sizes, the images, masks, control images or frames the class is for, and
            ``output_type`` (``"latent"`` where the class returns latents: the transformer's work, undecoded).
        steps: denoising steps of the call (``num_inference_steps``, unless ``call`` sets it).
        two_outputs: for a class without an outputs-per-prompt keyword, ``two_outputs(call) -> call`` that
            makes two outputs in one call; ``None``: the class's ``num_*_per_prompt`` keyword is set to 2.
        note: what the call exercises, or why it is shaped so.
        group: the family group (the ``diffusers.pipelines`` folder) when it differs from the class's own
            (PAG and ControlNet classes live in folders of their own).
        dtype: the one dtype the class runs in, where it hard-codes one (``None``: any); :func:`build` uses it
            whatever dtype is asked for.
        setup: ``setup(pipe)`` after construction, for a size the class keeps in an instance attribute (HiDream
            rescales every request to ``default_sample_size`` squared latents).
    """

    pipeline: str
    components: Callable[[Parts], dict[str, Any]]
    call: Callable[[Media], dict[str, Any]]
    steps: int = 2
    two_outputs: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    note: str = ""
    group: str = ""
    dtype: torch.dtype | None = None
    setup: Callable[[Any], None] | None = None

    @property
    def pipeline_class(self) -> type:
        return diffusers_class(self.pipeline)


def needs_ftfy(pipeline_class: type) -> bool:
    """Whether the class's prompt cleaning calls ``ftfy.fix_text`` without checking that ftfy is installed, while it
    is not (diffusers then raises ``NameError: ftfy`` at the first prompt). About 40 pipelines' ``basic_clean`` do;
    the caption cleaning of PixArt and Sana calls it only with ``clean_caption=True``, which the cases turn off."""
    import importlib.util
    import sys

    if importlib.util.find_spec("ftfy") is not None:
        return False
    clean = getattr(sys.modules.get(pipeline_class.__module__), "basic_clean", None)
    try:
        source = inspect.getsource(clean) if clean is not None else ""
    except (OSError, TypeError):
        return False
    return "ftfy.fix_text" in source and "is_ftfy_available" not in source


def build(case: PipelineCase, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
          seed: int = 0):
    """The pipeline of ``case`` with random weights drawn for ``seed`` (equal weights on every device), in
    ``dtype`` (the case's own where it has one), progress bars off. torch's global RNG state is left as it was.
    ``ImportError`` saying what to install when the class needs ftfy and it is missing."""
    if needs_ftfy(case.pipeline_class):
        raise ImportError(f"{case.pipeline} calls ftfy.fix_text on every prompt and ftfy is not installed: "
                          "pip install ftfy (it is in the test extra)")
    components = case.components(Parts(device, case.dtype or dtype, seed))
    pipe = case.pipeline_class(**components)
    pipe.set_progress_bar_config(disable=True)
    for value in vars(pipe).values():  # sub-pipelines a class builds for itself (VisualCloze's upsampling)
        if hasattr(value, "set_progress_bar_config") and value is not pipe:
            value.set_progress_bar_config(disable=True)
    if case.setup is not None:
        case.setup(pipe)
    return pipe


def parameters(pipe) -> dict[str, inspect.Parameter]:
    """The parameters of the class's own ``__call__`` (past ``(*args, **kwargs)`` wrappers)."""
    for cls in (pipe if isinstance(pipe, type) else type(pipe)).__mro__:
        fn = cls.__dict__.get("__call__")
        if fn is not None:
            params = inspect.signature(fn).parameters
            if any(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n != "self" for n, p in params.items()):
                return dict(params)
    return dict(inspect.signature(pipe.__call__).parameters)


def outputs_per_prompt_kwarg(pipe) -> str | None:
    """The keyword of ``pipe``'s call that sets the number of outputs per prompt, or ``None``."""
    params = parameters(pipe)
    return next((name for name in OUTPUTS_PER_PROMPT if name in params), None)


def call_kwargs(case: PipelineCase, pipe, seed: int = 0, steps: int | None = None) -> dict[str, Any]:
    """The keyword arguments of ``case``'s call (inputs drawn for ``seed``), with ``num_inference_steps`` set to
    ``steps`` (default: the case's) where the class takes it and the case did not set it; no ``generator``."""
    device = getattr(pipe, "_execution_device", None) or pipe.device
    dtype = getattr(pipe.transformer, "dtype", torch.float32) if getattr(pipe, "transformer", None) else torch.float32
    kwargs = case.call(Media(seed, device, dtype))
    if "num_inference_steps" in parameters(pipe) and "num_inference_steps" not in kwargs:
        kwargs["num_inference_steps"] = case.steps if steps is None else steps
    return kwargs
