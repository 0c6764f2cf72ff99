"""How many replicas of the server Ray Serve runs, and on what: a documented dataclass, validated, with no Ray.

The same options reach Ray from two places: ``bcg-serve --replicas N ...`` (its flags are
:func:`~..command_line.add_replica_options`; :func:`replica_options_from_args` reads them) and the ``args`` of a ``serve run`` / ``serve deploy`` config that imports
``bcg_diffusion.serving.replicas.ray_app:build_app`` (:func:`replica_options_from_mapping`, whose values may be strings, as
``serve run ... key=value`` passes them). Bad values raise :class:`ReplicaOptionsError` saying what to change.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from ..command_line import REPLICA_FLAGS
from ..serve_defaults import DEFAULT_TARGET_ONGOING_REQUESTS

__all__ = ["ReplicaOptions", "ReplicaOptionsError", "placement_problem", "replica_options_from_args",
           "replica_options_from_mapping"]



class ReplicaOptionsError(ValueError):
    """Replica options that Ray cannot run; the message says which and what to give instead."""


@dataclass(frozen=True)
class ReplicaOptions:
    """Replicas of the image server on Ray Serve; every replica holds one pipeline.

    - ``replicas``: how many run (fixed), or the fewest with ``max_replicas`` (>= 1: a replica warms up
      before it takes traffic, so none is started on a request);
    - ``max_replicas``: ``None`` for a fixed count; else Ray's autoscaler keeps between ``replicas`` and
      ``max_replicas``, aiming at ``target_ongoing_requests`` requests waiting or running per replica;
    - ``gpus_per_replica``: Ray's ``num_gpus`` of a replica (Ray gives each replica its own GPU and sets its
      ``CUDA_VISIBLE_DEVICES``); ``None``: 1 where the server runs on CUDA, else 0;
    - ``cpus_per_replica``: Ray's ``num_cpus`` of a replica (Ray's default, 1);
    - ``max_ongoing_requests``: requests Ray hands one replica at once; ``None``: the server's ``--max-queue``
      (the replica queues them itself, in arrival order, and answers 503 above it, as the single server).
    """

    replicas: int = 1
    max_replicas: int | None = None
    target_ongoing_requests: float = DEFAULT_TARGET_ONGOING_REQUESTS
    gpus_per_replica: float | None = None
    cpus_per_replica: float = 1.0
    max_ongoing_requests: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas < 1:
            raise ReplicaOptionsError(f"replicas must be a whole number >= 1 (got {self.replicas!r})")
        if self.max_replicas is not None:
            if isinstance(self.max_replicas, bool) or not isinstance(self.max_replicas, int):
                raise ReplicaOptionsError(f"max_replicas must be a whole number (got {self.max_replicas!r})")
            if self.max_replicas < self.replicas:
                raise ReplicaOptionsError(f"max_replicas {self.max_replicas} is below replicas {self.replicas}: "
                                          "autoscaling runs between replicas (the fewest) and max_replicas")
        _check_positive("target_ongoing_requests", self.target_ongoing_requests)
        if self.gpus_per_replica is not None:
            _check_positive("gpus_per_replica", self.gpus_per_replica, zero=True)
        _check_positive("cpus_per_replica", self.cpus_per_replica, zero=True)
        if self.max_ongoing_requests is not None and (not isinstance(self.max_ongoing_requests, int)
                                                      or self.max_ongoing_requests < 1):
            raise ReplicaOptionsError(f"max_ongoing_requests must be a whole number >= 1 "
                                      f"(got {self.max_ongoing_requests!r})")

    @property
    def autoscaling(self) -> bool:
        return self.max_replicas is not None

    @property
    def most_replicas(self) -> int:
        return self.max_replicas if self.max_replicas is not None else self.replicas

    def deployment_options(self, on_cuda: bool, max_queue: int) -> dict[str, Any]:
        """The keyword arguments of Ray's ``Deployment.options`` for these options; ``on_cuda``: whether the
        server's ``--device`` is CUDA (the default GPU count), ``max_queue``: the server's ``--max-queue``."""
        gpus = self.gpus_per_replica if self.gpus_per_replica is not None else (1 if on_cuda else 0)
        options: dict[str, Any] = {
            "ray_actor_options": {"num_cpus": self.cpus_per_replica, "num_gpus": gpus},
            "max_ongoing_requests": self.max_ongoing_requests or max_queue,
        }
        if self.autoscaling:
            options["autoscaling_config"] = {"min_replicas": self.replicas, "max_replicas": self.max_replicas,
                                             "initial_replicas": self.replicas,
                                             "target_ongoing_requests": self.target_ongoing_requests}
        else:
            options["num_replicas"] = self.replicas
        return options


def placement_problem(options: ReplicaOptions, on_cuda: bool, gpus_here: int) -> str | None:
    """Why a local Ray instance on this machine cannot place ``options.replicas`` replicas, each reserving the GPUs
    ``deployment_options`` gives it, on the ``gpus_here`` GPUs the machine has; ``None`` when it can. Ray would wait
    for such replicas for ever (a replica reserves a fraction of one GPU, or whole GPUs)."""
    gpus = options.deployment_options(on_cuda, 1)["ray_actor_options"]["num_gpus"]
    if not gpus:
        return None
    per_gpu = math.floor(1 / gpus + 1e-9) if gpus <= 1 else 0  # replicas sharing one GPU
    placeable = gpus_here * per_gpu if gpus <= 1 else gpus_here // math.ceil(gpus)
    if options.replicas <= placeable:
        return None
    device = "--device cuda, or no --device where torch sees CUDA" if on_cuda else "--gpus-per-replica"
    return (f"--replicas {options.replicas} with {gpus:g} GPU(s) each ({device}) cannot be placed: this machine has "
            f"{gpus_here} GPU(s) that torch sees, and Ray would wait for more for ever; give --device cpu and "
            "--gpus-per-replica 0 on a machine without a GPU, or fewer replicas")


def _check_positive(name: str, value: Any, zero: bool = False) -> None:
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and (value >= 0 if zero else value > 0))
    if not ok:
        raise ReplicaOptionsError(f"{name} must be a number {'>= 0' if zero else '> 0'} (got {value!r})")


def replica_options_from_args(args: argparse.Namespace) -> ReplicaOptions | None:
    """The options of ``--replicas`` and its companions; ``None`` without ``--replicas`` (one process, no Ray).
    :class:`ReplicaOptionsError`, in the flags' names, for bad ones or a companion without ``--replicas``."""
    values = {flag: getattr(args, flag[2:].replace("-", "_")) for flag in REPLICA_FLAGS}
    if values["--replicas"] is None:
        given = [flag for flag, value in values.items() if value is not None]
        if given:
            raise ReplicaOptionsError(f"{', '.join(given)} needs --replicas N (the replicas run on Ray Serve)")
        return None
    target = values["--target-ongoing-requests"]
    try:
        return ReplicaOptions(replicas=args.replicas, max_replicas=args.max_replicas,
                              target_ongoing_requests=DEFAULT_TARGET_ONGOING_REQUESTS if target is None else target,
                              gpus_per_replica=args.gpus_per_replica)
    except ReplicaOptionsError as exc:
        message = str(exc)
        for flag in sorted(REPLICA_FLAGS, key=len, reverse=True):  # field names as flags, longest first
            message = re.sub(rf"(?<![-\w]){flag[2:].replace('-', '_')}\b", flag, message)
        raise ReplicaOptionsError(message) from None


_TYPE_WORDS = {int: "whole number", float: "number"}
_FIELD_TYPES = {"replicas": int, "max_replicas": int, "target_ongoing_requests": float, "gpus_per_replica": float,
                "cpus_per_replica": float, "max_ongoing_requests": int}


def replica_options_from_mapping(values: Mapping[str, Any]) -> ReplicaOptions:
    """:class:`ReplicaOptions` from a config's ``args`` (unknown keys and unreadable values raise
    :class:`ReplicaOptionsError`); strings are read as numbers."""
    known = {f.name for f in dataclasses.fields(ReplicaOptions)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ReplicaOptionsError(f"unknown replica option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    converted = {}
    for name, value in values.items():
        if value is None or isinstance(value, (int, float)) and not isinstance(value, bool):
            converted[name] = value
            continue
        try:
            converted[name] = _FIELD_TYPES[name](str(value).strip())
        except ValueError:
            raise ReplicaOptionsError(f"{name}: {value!r} is not a {_TYPE_WORDS[_FIELD_TYPES[name]]}") from None
    if converted.get("target_ongoing_requests") is not None:
        converted["target_ongoing_requests"] = float(converted["target_ongoing_requests"])
    return ReplicaOptions(**converted)
