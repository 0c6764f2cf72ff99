"""What the model of ``bcg-serve``'s command line cannot do, checked before anything is built (by
:func:`~.server_plan.read_plan`): ``parser.error`` (exit code 2) naming the option to change. A family's limits
are read from its registry configs (:mod:`bcg_diffusion.toolkit.model_limits`); a checkpoint's are checked once it
is loaded (:mod:`.assembly`), only ``--max-pixels`` and the commands' side rule here.
"""

from __future__ import annotations

import argparse

import torch

import bcg_pipelines as pipelines
from bcg_diffusion.toolkit.model_limits import family_side_limit, min_steps
from bcg_diffusion.toolkit.sizes import Size

from .batching.stepping.config import STEP_PIPELINES

__all__ = ["check_model"]


def check_model(spec, args: argparse.Namespace, sizes: list[tuple[str, Size]], device: torch.device | None,
                parser: argparse.ArgumentParser) -> None:
    """``parser.error`` for what the family ``spec`` (``None``: a checkpoint) cannot do: videos, a default step
    count above ``--max-steps`` or ``--steps`` below what its scheduler takes, ``--batching step`` without a step
    loop, a --warmup or --default-size (``sizes``: option and size) it cannot make (beyond its side limit or
    ``--max-pixels`` too), ``--size full`` without CUDA (unless ``--yes``)."""
    if spec is not None:
        check_family(spec, args, parser)
    limit = family_side_limit(spec, args.size if spec is not None else "full")
    model = f"{spec.name} ({args.size})" if spec is not None else "a checkpoint"
    for option, size in sizes:
        if spec is not None and (size.width % spec.spatial_multiple or size.height % spec.spatial_multiple):
            parser.error(f"size {size}: width and height must be positive multiples of "
                         f"{spec.spatial_multiple} for {spec.name} (VAE scale factor x patch size)")
        if max(size.width, size.height) > limit.pixels:
            parser.error(f"{option} {size}: above the limit of {limit.pixels} px per side for {model}: {limit.reason}")
        if size.pixels > args.max_pixels:
            parser.error(f"size {size} has {size.pixels} pixels, above --max-pixels {args.max_pixels}")
    if device is not None and spec is not None and args.size == "full" and device.type != "cuda" and not args.yes:
        parser.error(f"--size full without CUDA builds the published {spec.title} on the CPU (tens of GiB, minutes "
                     "per step); pass --yes to build it anyway")


def check_family(spec, args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """``parser.error`` for a family that makes videos, whose default step count is above ``--max-steps``, whose
    scheduler takes more than ``--steps``, or that has no step loop for ``--batching step``."""
    if spec.is_video:
        images = [n for n in pipelines.list_families() if not pipelines.get_family(n).is_video]
        parser.error(f"--model {spec.name} makes videos; serve.py serves images (the OpenAI images API): "
                     f"choose one of {', '.join(images)}")
    if args.steps is None and spec.default_steps > args.max_steps:
        parser.error(f"{spec.name}'s default of {spec.default_steps} steps is above --max-steps {args.max_steps}: a "
                     "request without num_inference_steps would be refused; give --steps or raise --max-steps")
    if getattr(args, "batching", "request") == "step" and spec.pipeline_class_name not in STEP_PIPELINES:
        parser.error(f"--batching step: {spec.name} ({spec.pipeline_class_name}) has no step loop; step batching "
                     f"splits {', '.join(STEP_PIPELINES)} (use --batching request)")
    fewest = min_steps(spec.scheduler_config, spec.scheduler_class_name)
    if args.steps is not None and args.steps < fewest.steps:
        parser.error(f"--steps {args.steps}: {spec.name}'s scheduler {fewest.reason}; give --steps {fewest.steps} "
                     "or more")
