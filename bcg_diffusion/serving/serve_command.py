"""The ``bcg-serve`` command: its options (:mod:`.command_line`), then one process (:mod:`.server`), or with
``--replicas`` the same application as replicas on a local Ray Serve instance (:mod:`.replicas.ray_run`, the only path
that imports Ray).

Kept apart from :mod:`.server` so that the server's modules never import the replica modules, which build
their replicas from the server's own steps (no import circle).
"""

from __future__ import annotations

import sys

from bcg_diffusion.toolkit.options import Failure, quiet_known_messages

from . import command_line, server
from .replicas.options import ReplicaOptionsError, replica_options_from_args
from .serve_defaults import missing_serve_extra

__all__ = ["MISSING_SERVE_EXTRA", "build_parser", "main", "start_replicas"]

#: Set when the serve extra is missing (what to install); the parser still answers --help without it.
MISSING_SERVE_EXTRA: str | None = missing_serve_extra()


def build_parser():
    """The command's argument parser (the server's: ``--replicas`` and its options are among them)."""
    return command_line.build_parser()


def start_replicas(args, parser, replicas) -> int:
    """``--replicas N``: the same application as replicas on a local Ray Serve instance (:mod:`.replicas.ray_run`)."""
    from .replicas.ray_run import missing_ray, run_replicas

    if missing_ray():
        parser.error(missing_ray())
    return run_replicas(args, parser, replicas, server.announce)


def main(argv: list[str] | None = None) -> int:
    """Parse, check, serve; the exit status (2 for a bad argument, with one line saying what to change)."""
    quiet_known_messages()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if MISSING_SERVE_EXTRA:
            parser.error(MISSING_SERVE_EXTRA)
        command_line.configure_logging(args.log_level)
        try:
            replicas = replica_options_from_args(args)
        except ReplicaOptionsError as exc:
            parser.error(str(exc))
        if replicas is not None:  # Ray Serve replicas: Ray is imported there only
            return start_replicas(args, parser, replicas)
        return server.start(args, parser)
    except SystemExit as exc:  # --help (0) or a bad argument (2)
        return int(exc.code or 0)
    except Failure as failure:
        print(failure, file=sys.stderr)
        return failure.code


if __name__ == "__main__":
    sys.exit(main())
