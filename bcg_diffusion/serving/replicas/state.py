"""The single server's application state built inside another process (a Ray Serve replica), without a socket.

:func:`parse_server_args` reads ``bcg-serve``'s own options (the same parser, so the same checks and messages),
raising :class:`ServerOptionsError` instead of exiting; :func:`check_server_args` runs every check that needs no
pipeline (safe on a machine without the GPU the replicas will get); :func:`build_server_state` builds, speeds up
and warms the pipeline with ``bcg-serve``'s own start-up (:func:`~..server_build.build_server`, from the
:class:`~..server_plan.ServerPlan` of the options), and returns the :class:`~..state.ServerState` that
:func:`~..http.app.create_app` serves. Nothing here imports Ray.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any, Sequence

from bcg_diffusion.toolkit.options import Failure

from .. import command_line
from ..server_build import build_server
from ..server_plan import ServerPlan, read_plan
from ..state import ServerState

__all__ = ["ServerOptionsError", "build_server_state", "check_server_args", "parse_server_args", "stop_server_state"]


class ServerOptionsError(ValueError):
    """Server options that ``bcg-serve`` would refuse (its message), or a failed build or warm-up."""


def _raising_parser() -> argparse.ArgumentParser:
    parser = command_line.build_parser()

    def error(message: str):
        raise ServerOptionsError(message)

    parser.error = error  # argparse reports every bad option through parser.error
    return parser


def parse_server_args(argv: str | Sequence[str]) -> argparse.Namespace:
    """``bcg-serve``'s options from a command line (a string is split as a shell would)."""
    words = shlex.split(argv) if isinstance(argv, str) else list(argv)
    return _raising_parser().parse_args(words)


def check_server_args(args: argparse.Namespace) -> ServerPlan:
    """Every check ``bcg-serve`` makes before it builds, except the device's (the replicas' machines may differ
    from this one); the plan, without a device (its ``api_key`` resolved from the environment here)."""
    parser = _raising_parser()
    plan = read_plan(args, parser, device=False)
    if args.device is not None and ":" in args.device:
        parser.error(f"--device {args.device}: with replicas, Ray gives each replica its own GPU (its "
                     "CUDA_VISIBLE_DEVICES); use --device cuda")
    return plan


def build_server_state(args: argparse.Namespace, replica: dict[str, Any] | None = None) -> ServerState:
    """Build the pipeline of ``args``, speed it up and warm it (:func:`~..server_build.build_server`, as
    ``bcg-serve`` before it listens); the state of its application (``replica``: the replica's identity in
    ``/stats``). :class:`ServerOptionsError` for anything ``bcg-serve`` would refuse or fail at."""
    check_server_args(args)
    try:
        return build_server(read_plan(args, _raising_parser()), replica)
    except Failure as failure:
        raise ServerOptionsError(str(failure)) from failure


def stop_server_state(state: ServerState) -> None:
    """Stop what :func:`build_server_state` started: the batcher (if any), then the worker thread."""
    state.stop()
