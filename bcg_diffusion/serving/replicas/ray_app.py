"""``bcg-serve``'s application as replicas on Ray Serve: one pipeline per replica, Ray's HTTP proxy in front.

Each replica runs the single server's FastAPI application (:func:`~..http.app.create_app`: the same routes, checks,
API key, limits, error format, ``/stats``) around a pipeline it built and warmed in its constructor, so a replica
whose build or warm-up fails never takes traffic (Ray reports the deployment as failed). Ray's health check calls
:meth:`ImageServerReplica.check_health` (the pipeline's worker thread must live); a replica that fails it, or whose
process dies, is replaced by Ray while the others answer.

Two ways in:

- ``bcg-serve --replicas N ...`` (:mod:`.ray_run`) starts a local Ray instance and this application;
- :func:`build_app` is an application builder for a ``serve run`` / ``serve deploy`` config on any Ray cluster::

      applications:
        - name: bcg-images
          route_prefix: /
          import_path: bcg_diffusion.serving.replicas.ray_app:build_app
          args: {server_args: "--model pixart --size full --bcg --warmup 512x512", replicas: 2}

This module and :mod:`.ray_run` are the only ones that import Ray (the ``ray`` extra).
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any, Callable, Mapping

import ray
from ray import serve

from bcg_diffusion.toolkit.options import quiet_known_messages

from .. import command_line
from ..http.app import create_app
from ..http.listen import is_loopback
from ..state import ServerState
from .options import ReplicaOptions, ReplicaOptionsError, replica_options_from_mapping
from .state import (
    ServerOptionsError,
    build_server_state,
    check_server_args,
    parse_server_args,
    stop_server_state,
)

logger = logging.getLogger(__name__)

__all__ = ["APP_NAME", "DEPLOYMENT_NAME", "ImageServerReplica", "build_app", "image_server_app", "on_cuda"]

APP_NAME = "bcg-images"
DEPLOYMENT_NAME = "ImageServer"
#: Seconds Ray waits for a stopping replica's requests (then it ends the replica).
GRACEFUL_SHUTDOWN_S = 5.0
HEALTH_CHECK_PERIOD_S = 5.0
#: Seconds a health check may take; a replica busy in a long pipeline call still answers it (its event loop is free).
HEALTH_CHECK_TIMEOUT_S = 30.0


@serve.ingress()
class ImageServerReplica:
    """One replica: builds, speeds up and warms the pipeline of ``server_options`` (``vars()`` of ``bcg-serve``'s
    parsed options, the API key resolved) before Ray routes any request to it."""

    def __init__(self, server_options: dict[str, Any]):
        quiet_known_messages()
        command_line.configure_logging(server_options.get("log_level", "info"))
        self._undo_loopback = bind_replica_grpc_to_loopback()
        replica = {"pid": os.getpid(), "id": _replica_id()}
        self._state: ServerState = build_server_state(argparse.Namespace(**server_options), replica)
        logger.info("replica %s ready (pid %d)", replica["id"], os.getpid())

    def __serve_build_asgi_app__(self):
        return create_app(self._state)

    def check_health(self) -> None:
        """Ray's periodic health check: raises (and Ray replaces this replica) once the worker thread (or the
        batcher's) is gone."""
        if not self._state.alive:
            raise RuntimeError("the pipeline's worker thread (or the request batcher) has stopped")

    def __del__(self):
        state = getattr(self, "_state", None)
        if state is not None:
            stop_server_state(state)
        undo = getattr(self, "_undo_loopback", None)
        if undo is not None:
            undo()


def bind_replica_grpc_to_loopback() -> Callable[[], None] | None:
    """On a node whose address is loopback (``bcg-serve --replicas`` with a loopback ``--host``), bind the replica's
    inter-deployment gRPC server to 127.0.0.1: Ray Serve 2.60 binds it to every interface (``[::]:0``, in
    ``ray.serve._private.replica``), while everything that calls it runs on this machine. Patches that module's
    ``add_port_to_grpc_server`` in this replica process; returns the undo (``None`` where nothing was patched: a
    node of a cluster, or a Ray without that function, which is logged)."""
    if not is_loopback(ray.util.get_node_ip_address()):
        return None
    from ray.serve._private import replica as serve_replica

    original = getattr(serve_replica, "add_port_to_grpc_server", None)
    if original is None:
        logger.warning("this Ray Serve has no replica.add_port_to_grpc_server: the replica's gRPC port keeps Ray's "
                       "address")
        return None

    def add_port(grpc_server, address: str):
        if address.startswith("[::]:"):
            address = "127.0.0.1:" + address[len("[::]:"):]
        return original(grpc_server, address)

    serve_replica.add_port_to_grpc_server = add_port
    return lambda: setattr(serve_replica, "add_port_to_grpc_server", original)


def _replica_id() -> str | None:
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # noqa: BLE001 - outside Ray Serve (a test constructing the class directly)
        return None


def on_cuda(args: argparse.Namespace) -> bool:
    """Whether the server's ``--device`` means CUDA: ``cuda``, or unset on a machine where torch sees CUDA (the
    default GPU count of a replica; a CPU-only head of a GPU cluster sets ``gpus_per_replica`` instead)."""
    if args.device is not None:
        return args.device.startswith("cuda")
    import torch

    return torch.cuda.is_available()


def image_server_app(args: argparse.Namespace, options: ReplicaOptions):
    """The Ray Serve application of checked server options ``args`` (``api_key`` resolved) and ``options``."""
    deployment = serve.deployment(
        ImageServerReplica, name=DEPLOYMENT_NAME,
        graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_S, graceful_shutdown_wait_loop_s=1.0,
        health_check_period_s=HEALTH_CHECK_PERIOD_S, health_check_timeout_s=HEALTH_CHECK_TIMEOUT_S)
    deployment = deployment.options(**options.deployment_options(on_cuda(args), args.max_queue))
    return deployment.bind(vars(args))


def build_app(config: Mapping[str, Any]):
    """Application builder for ``serve run`` / ``serve deploy``: ``config["server_args"]`` is ``bcg-serve``'s
    options (a string or a list; ``--host``/``--port`` belong to Ray's proxy, ``--replicas`` to the config), the
    other keys are :class:`~.options.ReplicaOptions` fields. ``ValueError`` saying what was wrong."""
    config = dict(config)
    server_args = config.pop("server_args", "")
    try:
        args = parse_server_args(server_args)
        defaults = command_line.build_parser()
        for flag in ("host", "port", "replicas", "max_replicas", "target_ongoing_requests", "gpus_per_replica"):
            if getattr(args, flag) != defaults.get_default(flag):
                raise ServerOptionsError(f"--{flag.replace('_', '-')} does not belong in server_args: the proxy's "
                                         "address is Ray's (http_options), the replica counts are keys of args")
        options = check_server_args(args)
    except ServerOptionsError as exc:
        raise ValueError(f"server_args {server_args!r}: {exc}") from None
    try:
        replica_options = replica_options_from_mapping(config)
    except ReplicaOptionsError as exc:
        raise ValueError(f"build_app args: {exc}") from None
    args.api_key = options.api_key
    return image_server_app(args, replica_options)

