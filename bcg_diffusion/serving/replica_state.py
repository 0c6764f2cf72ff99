"""The single server's application state built inside another process (a Ray Serve replica), without a socket.

:func:`parse_server_args` reads ``bcg-serve``'s own options (the same parser, so the same checks and messages),
raising :class:`ServerOptionsError` instead of exiting; :func:`check_server_args` runs every check that needs no
pipeline (safe on a machine without the GPU the replicas will get); :func:`build_server_state` builds, speeds up
and warms the pipeline as ``bcg-serve`` does before it listens, and returns the :class:`~.app.ServerState` that
:func:`~.app.create_app` serves. Nothing here imports Ray.
"""

from __future__ import annotations

import argparse
import shlex
import time
from typing import Any, Sequence

import bcg_pipelines as pipelines
from bcg_diffusion.toolkit.options import Failure, choose_device, family_or_checkpoint

from . import server
from .adapter_options import attach_adapters, warm_adapters
from .app import ServerState
from .worker import ImageGenerator, PipelineWorker, ServerCounters

__all__ = ["ServerOptionsError", "build_server_state", "check_server_args", "parse_server_args", "stop_server_state"]


class ServerOptionsError(ValueError):
    """Server options that ``bcg-serve`` would refuse (its message), or a failed build or warm-up."""


def _raising_parser() -> argparse.ArgumentParser:
    parser = server.build_parser()

    def error(message: str):
        raise ServerOptionsError(message)

    parser.error = error  # argparse reports every bad option through parser.error
    return parser


def parse_server_args(argv: str | Sequence[str]) -> argparse.Namespace:
    """``bcg-serve``'s options from a command line (a string is split as a shell would)."""
    words = shlex.split(argv) if isinstance(argv, str) else list(argv)
    return _raising_parser().parse_args(words)


def check_server_args(args: argparse.Namespace) -> dict[str, Any]:
    """Every check ``bcg-serve`` makes before it builds, except the device's (the replicas' machines may differ
    from this one); the parsed warm-up sizes, default size, injections and API key."""
    parser = _raising_parser()
    options = server.check_arguments(args, parser)
    spec = family_or_checkpoint(args.model, parser)
    server.check_image_family(spec, parser)
    server.precheck_family(spec, args, parser)
    server.precheck_sizes(spec, options["warmup"] + ([options["default_size"]] if options["default_size"] else []),
                          args, parser)
    if args.device is not None and ":" in args.device:
        parser.error(f"--device {args.device}: with replicas, Ray gives each replica its own GPU (its "
                     "CUDA_VISIBLE_DEVICES); use --device cuda")
    return options


def build_server_state(args: argparse.Namespace) -> ServerState:
    """Build the pipeline of ``args``, speed it up and warm it (as ``bcg-serve`` before it listens); the state of
    its application. :class:`ServerOptionsError` for anything ``bcg-serve`` would refuse or fail at."""
    parser = _raising_parser()
    try:
        options = check_server_args(args)
        device = choose_device(args, parser)
        dtype = pipelines.resolve_dtype(args.dtype, device)
        spec = family_or_checkpoint(args.model, parser)
        if spec is not None and args.size == "full" and device.type != "cuda" and not args.yes:
            parser.error(f"--size full without CUDA builds the published {spec.title} on the CPU; pass --yes to "
                         "build it anyway")
        print(f"building {args.model} on {device} in {pipelines.dtype_name(dtype)} ...", flush=True)
        t0 = time.perf_counter()
        pipe, spec = server.build(args, spec, device, dtype)
        adapters = attach_adapters(pipe, options["adapters"], args, server.served_model_name(args), "bcg-serve")
        notes = server.speed_up(pipe, args, device)
        planner = server.make_planner(pipe, spec, args, options["default_size"])
        if adapters is not None:
            planner.adapter_ids = tuple(adapters.names)
        print(f"built in {time.perf_counter() - t0:.1f} s; {'; '.join(notes) or 'eager'}", flush=True)
        shapes = server.batching_setup(pipe, planner, args, options["warmup"])
        counters = ServerCounters()
        worker = PipelineWorker()
        generator = ImageGenerator(pipe, device, counters, options["injections"])
        try:
            warmup = server.warm_up(worker, generator, planner, options["warmup"], shapes)
            warm_adapters(adapters, worker, generator,
                          lambda: server.warm_up(worker, generator, planner, options["warmup"], shapes))
        except BaseException:
            worker.stop()
            raise
        info = server.server_info(args, spec, pipe, device, dtype, planner, warmup, options["api_key"] is not None)
    except Failure as failure:
        raise ServerOptionsError(str(failure)) from failure
    batcher = (server.RequestBatcher(worker, generator.generate_batch, shapes, server.BatchStats(shapes.policy))
               if shapes is not None else None)
    return ServerState(planner, worker, generator, counters, info, args.max_queue, api_key=options["api_key"],
                       batcher=batcher)


def stop_server_state(state: ServerState) -> None:
    """Stop what :func:`build_server_state` started: the batcher (if any), then the worker thread."""
    if state.batcher is not None:
        state.batcher.stop()
    state.worker.stop()
