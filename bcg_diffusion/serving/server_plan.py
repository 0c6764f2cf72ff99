"""``bcg-serve``'s command line read once, at the door: every check that needs no pipeline (the model's against its
family: :mod:`.model_checks`), and the :class:`ServerPlan` that the start-up (:mod:`.server_build`) reads instead of
the raw ``argparse`` namespace.

:func:`read_plan` reports a bad option through ``parser.error`` (exit code 2, one line saying what to change), before
anything is built; the replicas' parser (:mod:`.replicas.state`) raises there instead. The serve extra's modules
(:mod:`.requests`) are imported where used, so :mod:`.server` reads this module's constants (its
``--help``) without the extra.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass
from typing import Any

import torch

import bcg_pipelines as pipelines
from bcg_diffusion.toolkit.choices import MAX_BATCH
from bcg_diffusion.toolkit.offload_option import offload_problem, offload_with_quant_problem
from bcg_diffusion.toolkit.options import check_binning_flag, choose_device, family_or_checkpoint
from bcg_diffusion.toolkit.sizes import Size
from bcg_diffusion.toolkit.stack_options import StackOptions, read_stack

from .adapters.options import AdapterPlan, served_models
from .batching.stepping.config import StepConfig
from .catalog import ModelCatalog
from .http.listen import API_KEY_VARIABLE, warn_if_open
from .model_checks import check_model
from .serve_defaults import prog

__all__ = ["API_KEY_PATTERN", "API_KEY_VARIABLE", "BatchingPlan", "ModelPlan", "RequestPlan", "ServerPlan", "prog",
           "read_plan"]

#: An API key: visible ASCII, no spaces (it travels as ``Authorization: Bearer <key>``).
API_KEY_PATTERN = re.compile(r"[!-~]+")
#: Options that must be >= 1 when given.
POSITIVE_OPTIONS = ("max_pixels", "max_steps", "max_n", "max_queue", "steps", "max_batch")


@dataclass(frozen=True)
class ModelPlan:
    """What to build: ``name`` (``--model`` as given), ``spec`` its family (``None`` for a checkpoint, known once
    loaded), ``model_size`` (``--size``, random weights), ``yes`` (build ``--size full`` without CUDA), ``device``
    and ``dtype`` (``None`` when the plan was read without choosing a device: the replicas' head, whose machine may
    not be the replicas'), ``offload`` (``--offload K``: the transformer streams its blocks through K slots)."""

    name: str
    spec: Any
    model_size: str
    yes: bool
    device: torch.device | None
    dtype: torch.dtype | None
    offload: int | None = None

    @property
    def random_weights(self) -> bool:
        """Whether ``name`` names a family (built with random weights at ``model_size``), not a checkpoint."""
        return self.name in pipelines.list_families()


@dataclass(frozen=True)
class RequestPlan:
    """A request's defaults and limits: ``steps`` (``None``: the model's), ``default_size`` (``None``: the model's),
    ``max_pixels``, ``max_steps``, ``max_n``, ``max_queue`` (requests waiting or running), ``resolution_binning``
    (not ``--no-resolution-binning``)."""

    steps: int | None
    default_size: Size | None
    max_pixels: int
    max_steps: int
    max_n: int
    max_queue: int
    resolution_binning: bool = True


@dataclass(frozen=True)
class BatchingPlan:
    """``rows`` (``--max-batch``; 1: off), ``window_ms``, ``work_limit``, and ``step``: the step scheduler's
    settings with ``--batching step`` (``None``: request batching, or none)."""

    rows: int = 1
    window_ms: float = 500.0
    work_limit: int = 1 << 21
    step: StepConfig | None = None


@dataclass(frozen=True)
class ServerPlan:
    """What the server's start-up needs, checked (the options of ``bcg-serve``, see its ``--help``): the ``model``
    to build, its speed ``stack`` (``--quant``, ``--cache``, ``--compile``, ``--compile-cache``,
    ``--attention-backend``, read by the parser ``bcg-generate`` shares) and ``bcg`` on top of it, the ``requests``'
    defaults and limits, ``batching``, the ``adapters``, the ``catalog`` of served model ids, the ``warmup`` sizes,
    the ``api_key`` every route but ``/health`` needs (``None``: none), and the address (``host``, ``port``)."""

    model: ModelPlan
    stack: StackOptions
    bcg: bool
    requests: RequestPlan
    batching: BatchingPlan
    adapters: AdapterPlan
    catalog: ModelCatalog
    warmup: tuple[Size, ...] = ()
    api_key: str | None = None
    host: str = "127.0.0.1"
    port: int = 0


def read_plan(args: argparse.Namespace, parser: argparse.ArgumentParser, *, device: bool = True,
              warn_open_host: bool = False) -> ServerPlan:
    """``args`` checked (``parser.error`` for a bad option, exit code 2) into a :class:`ServerPlan`; with
    ``device=False`` the device is neither chosen nor checked (``device`` and ``dtype`` are ``None``). With
    ``warn_open_host``, a ``--host`` reachable from other machines without an API key is warned about once the
    options are read, before the device and the model are checked."""
    check_numbers(args, parser)
    key = api_key(args, parser)
    warmup, default_size = parse_values(args, parser)
    batching = BatchingPlan(args.max_batch, args.batch_window_ms, args.batch_work_limit, step_config(args, parser))
    adapters, catalog = served_models(args, parser)
    if warn_open_host:
        warn_if_open(args.host, key)
    chosen = choose_device(args, parser) if device else None
    spec = family_or_checkpoint(args.model, parser)
    if spec is not None and args.no_resolution_binning:
        check_binning_flag(spec, parser)
    sizes = [("--warmup", size) for size in warmup] + ([("--default-size", default_size)] if default_size else [])
    check_model(spec, args, sizes, chosen, parser)
    stack = read_stack(args, parser, family=spec.name if spec is not None else None, device=chosen)
    model = ModelPlan(args.model, spec, args.size, args.yes, chosen,
                      pipelines.resolve_dtype(args.dtype, chosen) if chosen is not None else None,
                      getattr(args, "offload", None))
    requests = RequestPlan(args.steps, default_size, args.max_pixels, args.max_steps, args.max_n, args.max_queue,
                           resolution_binning=not args.no_resolution_binning)
    return ServerPlan(model, stack, bool(args.bcg), requests, batching, adapters, catalog, tuple(warmup),
                      api_key=key, host=args.host, port=args.port)


def check_numbers(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """``parser.error`` for a count, limit, window or port out of range, and for ``--offload`` (too few slots, or
    with ``--quant``)."""
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
    offload = getattr(args, "offload", None)
    if problem := offload_problem(offload) or offload_with_quant_problem(offload, getattr(args, "quant", None)):
        parser.error(problem)


def step_config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> StepConfig | None:
    """The step scheduler's settings of ``--batching step`` (``None`` for request batching); ``parser.error`` for
    ``--batching step`` without rows to batch, or ``--step-policy`` without it (a family without a step loop:
    :func:`~.model_checks.check_model`)."""
    mode, policy = getattr(args, "batching", "request"), getattr(args, "step_policy", None)
    if mode != "step":
        if policy is not None:
            parser.error("--step-policy applies to --batching step")
        return None
    if args.max_batch < 2:
        parser.error("--batching step needs --max-batch ROWS of 2 or more: the slots of every running batch")
    return StepConfig(rows=args.max_batch, policy=policy or "round_robin")

def parse_values(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[list[Size], Size | None]:
    """``--warmup`` (a list of sizes) and ``--default-size`` (a size or ``None``), each written as a request's size;
    ``parser.error`` for a malformed one."""
    texts = {"--warmup": [s.strip() for s in args.warmup.split(",")] if args.warmup else [],
             "--default-size": [args.default_size.strip()] if args.default_size else []}
    try:
        parsed = {name: [Size.parse(text, name) for text in values] for name, values in texts.items()}
    except ValueError as exc:
        parser.error(str(exc))
    return parsed["--warmup"], (parsed["--default-size"] or [None])[0]


def api_key(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str | None:
    """The API key: ``--api-key``, else :data:`API_KEY_VARIABLE` (empty means none); ``parser.error`` for a key
    that cannot travel in a header."""
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_VARIABLE) or None
    if key is not None and not API_KEY_PATTERN.fullmatch(key):
        source = "--api-key" if args.api_key is not None else API_KEY_VARIABLE
        parser.error(f"{source}: an API key is visible ASCII characters without spaces (it is sent as "
                     "'Authorization: Bearer <key>')")
    return key

