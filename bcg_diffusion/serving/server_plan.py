"""``bcg-serve``'s command line read once: every check that needs no pipeline, and the :class:`ServerPlan` that
the start-up (:mod:`.server_build`) reads instead of the raw ``argparse`` namespace.

:func:`read_plan` reports a bad option through ``parser.error`` (exit code 2, one line saying what to change), before
anything is built; the replicas' parser (:mod:`.replica_state`) raises there instead. The serve extra's modules
(:mod:`.requests`, :mod:`.worker`) are imported where used, so :mod:`.server` reads this module's constants (its
``--help``) without the extra.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

import bcg_pipelines as pipelines
from bcg_diffusion.toolkit.choices import MAX_BATCH
from bcg_diffusion.toolkit.model_limits import family_side_limit, min_steps
from bcg_diffusion.toolkit.offload_option import offload_problem, offload_with_quant_problem
from bcg_diffusion.toolkit.options import check_binning_flag, choose_device, family_or_checkpoint
from bcg_diffusion.toolkit.stack_options import StackOptions, read_stack

from .adapter_options import lora_specs
from .adapters import AdapterSpec
from .listen import API_KEY_VARIABLE, warn_if_open
from .stepping.config import STEP_PIPELINES, StepConfig
from .serve_defaults import prog

__all__ = ["API_KEY_PATTERN", "API_KEY_VARIABLE", "ServerPlan", "prog", "read_plan"]

#: An API key: visible ASCII, no spaces (it travels as ``Authorization: Bearer <key>``).
API_KEY_PATTERN = re.compile(r"[!-~]+")
#: Options that must be >= 1 when given.
POSITIVE_OPTIONS = ("max_pixels", "max_steps", "max_n", "max_queue", "steps", "max_batch")

Size = tuple[int, int]


@dataclass(frozen=True)
class ServerPlan:
    """What the server's start-up needs, checked (the options of ``bcg-serve``, see its ``--help``).

    - ``model``: ``--model`` as given; ``spec``: its family (``None`` for a checkpoint, known once loaded);
      ``size``: ``--size`` (random weights); ``yes``: build ``--size full`` without CUDA;
    - ``device``, ``dtype``: where and how to build (``None`` when the plan was read without choosing a device:
      the replicas' head, whose machine may not be the replicas');
    - ``base_model``: the base model's id (``--served-model-name``, else ``model``);
    - ``steps``: a request's default ``num_inference_steps`` (``None``: the model's); ``default_size``: a request's
      default ``(width, height)`` (``None``: the model's); ``warmup``: the sizes warmed before listening;
    - ``max_pixels``, ``max_steps``, ``max_n``, ``max_queue``: the request limits; ``resolution_binning``: not
      ``--no-resolution-binning``;
    - ``max_batch``, ``batch_window_ms``, ``batch_work_limit``: batching (``max_batch`` 1: off); ``step``: the
      step scheduler's settings with ``--batching step`` (``None``: request batching, or none);
    - ``adapters``, ``lora_rank``, ``lora_gpu_slots``: the LoRA adapters served and their slots;
    - ``stack``: the speed stack (``--quant``, ``--cache``, ``--compile``, ``--compile-cache``,
      ``--attention-backend``, read by the parser ``bcg-generate`` shares), ``bcg``: BCG on top of it;
      ``injections``: prompt -> failure kind (testing only);
    - ``api_key``: the key every route but ``/health`` needs (``None``: none); ``host``, ``port``: the address.
    """

    model: str
    spec: Any
    size: str
    yes: bool
    device: torch.device | None
    dtype: torch.dtype | None
    base_model: str
    steps: int | None
    default_size: Size | None
    warmup: tuple[Size, ...]
    max_pixels: int
    max_steps: int
    max_n: int
    max_queue: int
    resolution_binning: bool
    max_batch: int
    batch_window_ms: float
    batch_work_limit: int
    adapters: tuple[AdapterSpec, ...]
    lora_rank: int | None
    lora_gpu_slots: int | None
    stack: StackOptions
    bcg: bool
    injections: Mapping[str, str] = field(default_factory=dict)
    api_key: str | None = None
    host: str = "127.0.0.1"
    port: int = 0
    step: StepConfig | None = None
    offload: int | None = None  # --offload K: the transformer streams its blocks through K slots

    @property
    def compile(self) -> bool:
        """Whether the stack compiles (``--compile``)."""
        return self.stack.compile

    @property
    def random_weights(self) -> bool:
        """Whether ``model`` names a family (built with random weights at ``size``), not a checkpoint."""
        return self.model in pipelines.list_families()


def read_plan(args: argparse.Namespace, parser: argparse.ArgumentParser, *, device: bool = True,
              warn_open_host: bool = False) -> ServerPlan:
    """``args`` checked (``parser.error`` for a bad option, exit code 2) into a :class:`ServerPlan`; with
    ``device=False`` the device is neither chosen nor checked (``device`` and ``dtype`` are ``None``). With
    ``warn_open_host``, a ``--host`` reachable from other machines without an API key is warned about once the
    options are read, before the device and the model are checked."""
    check_numbers(args, parser)
    if problem := (offload_problem(getattr(args, "offload", None))
                   or offload_with_quant_problem(getattr(args, "offload", None), getattr(args, "quant", None))):
        parser.error(problem)
    key = api_key(args, parser)
    warmup, default_size, injections = parse_values(args, parser)
    adapters = lora_specs(args, parser)
    if warn_open_host:
        warn_if_open(args.host, key)
    chosen = choose_device(args, parser) if device else None
    spec = family_or_checkpoint(args.model, parser)
    if spec is not None and args.no_resolution_binning:
        check_binning_flag(spec, parser)
    sizes = [("--warmup", size) for size in warmup] + ([("--default-size", default_size)] if default_size else [])
    check_model(spec, args, sizes, chosen, parser)
    stack = read_stack(args, parser, family=spec.name if spec is not None else None, device=chosen)
    return ServerPlan(
        model=args.model, spec=spec, size=args.size, yes=args.yes, device=chosen,
        dtype=pipelines.resolve_dtype(args.dtype, chosen) if chosen is not None else None,
        base_model=args.served_model_name or args.model, steps=args.steps, default_size=default_size,
        warmup=tuple(warmup), max_pixels=args.max_pixels, max_steps=args.max_steps, max_n=args.max_n,
        max_queue=args.max_queue, resolution_binning=not args.no_resolution_binning, max_batch=args.max_batch,
        batch_window_ms=args.batch_window_ms, batch_work_limit=args.batch_work_limit, adapters=tuple(adapters),
        lora_rank=args.lora_rank, lora_gpu_slots=args.lora_gpu_slots, stack=stack, bcg=bool(args.bcg),
        injections=injections, api_key=key, host=args.host, port=args.port, step=step_config(args, spec, parser),
        offload=getattr(args, "offload", None))


def check_numbers(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """``parser.error`` for a count, limit, window or port out of range."""
    for name in POSITIVE_OPTIONS:
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1 (got {value})")
    if args.max_batch > MAX_BATCH:
        parser.error(f"--max-batch must be in 1 .. {MAX_BATCH} (got {args.max_batch}): every batched call runs that many "
                     "rows, so a lone request pays for all of them")
    if args.steps is not None and args.steps > args.max_steps:
        parser.error(f"--steps {args.steps} is above --max-steps {args.max_steps}: a request without "
                     "num_inference_steps would be refused; lower --steps or raise --max-steps")
    if args.batch_window_ms < 0 or args.batch_work_limit < 0:
        parser.error("--batch-window-ms and --batch-work-limit must be >= 0")
    if args.served_model_name is not None and not 0 < len(args.served_model_name) <= 256:
        parser.error("--served-model-name must have 1 .. 256 characters")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be in 0 .. 65535 (got {args.port})")


def step_config(args: argparse.Namespace, spec, parser: argparse.ArgumentParser) -> StepConfig | None:
    """The step scheduler's settings of ``--batching step`` (``None`` for request batching); ``parser.error`` for
    ``--batching step`` without rows to batch, a family without a step loop, or ``--step-policy`` without it."""
    mode, policy = getattr(args, "batching", "request"), getattr(args, "step_policy", None)
    if mode != "step":
        if policy is not None:
            parser.error("--step-policy applies to --batching step")
        return None
    if args.max_batch < 2:
        parser.error("--batching step needs --max-batch ROWS of 2 or more: the slots of every running batch")
    if spec is not None and spec.pipeline_class_name not in STEP_PIPELINES:
        parser.error(f"--batching step: {spec.name} ({spec.pipeline_class_name}) has no step loop; step batching "
                     f"splits {', '.join(STEP_PIPELINES)} (use --batching request)")
    return StepConfig(rows=args.max_batch, policy=policy or "round_robin")


def parse_values(args: argparse.Namespace, parser: argparse.ArgumentParser):
    """``--warmup`` (a list of sizes), ``--default-size`` (a size or ``None``) and ``--inject`` (prompt -> kind);
    ``parser.error`` for a malformed one."""
    from .requests import RequestError, parse_size
    from .worker import parse_injection

    sizes = {"--warmup": [s.strip() for s in args.warmup.split(",")] if args.warmup else [],
             "--default-size": [args.default_size.strip()] if args.default_size else []}
    parsed = {}
    for name, texts in sizes.items():
        try:
            parsed[name] = [parse_size(text, param=name) for text in texts]
        except RequestError as exc:
            parser.error(exc.message)
    injections = {}
    for text in args.inject:
        try:
            kind, prompt = parse_injection(text)
        except ValueError as exc:
            parser.error(str(exc))
        injections[prompt] = kind
    return parsed["--warmup"], (parsed["--default-size"] or [None])[0], injections


def api_key(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str | None:
    """The API key: ``--api-key``, else :data:`API_KEY_VARIABLE` (empty means none); ``parser.error`` for a key
    that cannot travel in a header."""
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_VARIABLE) or None
    if key is not None and not API_KEY_PATTERN.fullmatch(key):
        source = "--api-key" if args.api_key is not None else API_KEY_VARIABLE
        parser.error(f"{source}: an API key is visible ASCII characters without spaces (it is sent as "
                     "'Authorization: Bearer <key>')")
    return key


def check_steps(spec, args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """``--steps`` below the fewest the family's scheduler takes: ``parser.error`` (a checkpoint's once loaded)."""
    if spec is None or args.steps is None:
        return
    fewest = min_steps(spec.scheduler_config, spec.scheduler_class_name)
    if args.steps < fewest.steps:
        parser.error(f"--steps {args.steps}: {spec.name}'s scheduler {fewest.reason}; give --steps {fewest.steps} or more")


def check_model(spec, args: argparse.Namespace, sizes: list[tuple[str, Size]], device: torch.device | None,
                parser: argparse.ArgumentParser) -> None:
    """``parser.error`` for what a family cannot do, before anything is built: videos, a default step count above
    ``--max-steps`` or ``--steps`` below what its scheduler takes, a --warmup or --default-size (``sizes``: option
    and size) it cannot make (beyond its side limit too), ``--size full`` without CUDA (unless ``--yes``); a
    checkpoint's are checked once it is loaded (only ``--max-pixels`` and the commands' side rule here)."""
    if spec is not None and spec.is_video:
        images = [n for n in pipelines.list_families() if not pipelines.get_family(n).is_video]
        parser.error(f"--model {spec.name} makes videos; serve.py serves images (the OpenAI images API): "
                     f"choose one of {', '.join(images)}")
    if spec is not None and args.steps is None and spec.default_steps > args.max_steps:
        parser.error(f"{spec.name}'s default of {spec.default_steps} steps is above --max-steps {args.max_steps}: a "
                     "request without num_inference_steps would be refused; give --steps or raise --max-steps")
    check_steps(spec, args, parser)
    for option, (width, height) in sizes:
        if spec is not None and (width % spec.spatial_multiple or height % spec.spatial_multiple):
            parser.error(f"size {width}x{height}: width and height must be positive multiples of "
                         f"{spec.spatial_multiple} for {spec.name} (VAE scale factor x patch size)")
        limit = family_side_limit(spec, args.size if spec is not None else "full")
        if max(width, height) > limit.pixels:
            model = f"{spec.name} ({args.size})" if spec is not None else "a checkpoint"
            parser.error(f"{option} {width}x{height}: above the limit of {limit.pixels} px per side for {model}: "
                         f"{limit.reason}")
        if width * height > args.max_pixels:
            parser.error(f"size {width}x{height} has {width * height} pixels, above --max-pixels {args.max_pixels}")
    if device is not None and spec is not None and args.size == "full" and device.type != "cuda" and not args.yes:
        parser.error(f"--size full without CUDA builds the published {spec.title} on the CPU (tens of GiB, minutes "
                     "per step); pass --yes to build it anyway")
