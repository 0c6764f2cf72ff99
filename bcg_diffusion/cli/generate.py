"""The ``bcg-generate`` command (``python scripts/generate.py``, ``python -m bcg_diffusion.cli.generate``):
where it starts.

:func:`main` parses the arguments (:mod:`.args`) before torch, diffusers or ``bcg_pipelines`` are imported, so
``--help`` and a mistyped option answer at once, then hands over to :func:`bcg_diffusion.cli.run.run_command`.
"""

from __future__ import annotations

import sys

from bcg_diffusion.toolkit.options import quiet_known_messages

from .args import build_parser, dash_value_problem, keep_nvlink_multicast_off

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """The command: parse (``--help`` and option typos answer before torch is imported), then run
    (:func:`bcg_diffusion.cli.run.run_command`). Returns the exit code."""
    keep_nvlink_multicast_off()
    quiet_known_messages()
    parser = build_parser()
    try:
        problem = dash_value_problem(sys.argv[1:] if argv is None else list(argv))
        if problem:
            parser.error(problem)
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a bad argument (2)
        return int(exc.code or 0)
    from . import run  # torch, diffusers and the pipelines: only once there is something to run

    return run.run_command(args, parser)


if __name__ == "__main__":
    sys.exit(main())
