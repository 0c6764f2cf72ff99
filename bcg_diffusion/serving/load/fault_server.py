"""``bcg-serve`` with fault rules installed, for the soak and the tests:
``python -m bcg_diffusion.serving.load.fault_server --fault KIND:PROMPT [--fault ...] -- [bcg-serve options]``.

Each ``--fault`` is a rule of :class:`~.fault_rules.PromptFaults`, installed in this process through the seam of
:mod:`..faults` before the server starts; ``bcg-serve`` itself has no such option. ``--replicas`` is refused (Ray runs
the pipelines in processes of its own, which the rules would not reach).
"""

from __future__ import annotations

import argparse
import sys

from .. import serve_command
from ..faults import install_fault_hook
from .fault_rules import FAULT_KINDS, PromptFaults

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Install the ``--fault`` rules, then run ``bcg-serve`` with the options after ``--``; its exit status (2 for a
    malformed rule or ``--replicas``)."""
    words = list(sys.argv[1:] if argv is None else argv)
    rules, serve_words = (words[:words.index("--")], words[words.index("--") + 1:]) if "--" in words else (words, [])
    parser = argparse.ArgumentParser(prog="fault_server", description=__doc__.splitlines()[0])
    parser.add_argument("--fault", action="append", default=[], metavar="KIND:PROMPT",
                        help="a request with exactly PROMPT fails or stalls inside the pipeline; KIND: "
                        f"{', '.join(FAULT_KINDS)}")
    try:
        faults = PromptFaults.from_texts(parser.parse_args(rules).fault)
        if any(w == "--replicas" or w.startswith("--replicas=") for w in serve_words):
            parser.error("--replicas: the fault rules reach this process only, not Ray's replicas")
    except ValueError as exc:
        parser.print_usage(sys.stderr)
        print(f"fault_server: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:
        return int(exc.code or 0)
    install_fault_hook(faults)
    return serve_command.main(serve_words)


if __name__ == "__main__":
    sys.exit(main())
