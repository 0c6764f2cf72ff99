"""Comma-separated names as the commands read them (``--families pixart,flux``, ``--scenarios s256-c8``): one
argparse type for every such option, so each refuses alike. Imports nothing heavy."""

from __future__ import annotations

import argparse
from typing import Callable, Sequence

__all__ = ["name_list"]


def name_list(allowed: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    """The argparse ``type`` of an option that takes some of ``allowed``, comma-separated: the names in the order
    given, blanks and repeats dropped. An empty list or a name not in ``allowed`` is a usage error (argparse's
    ``argument --name: ...`` line, exit code 2) that lists what may be given."""
    choices = tuple(allowed)

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
        unknown = [n for n in names if n not in choices]
        if not names or unknown:
            what = f"unknown {', '.join(map(repr, unknown))}" if unknown else "no name given"
            raise argparse.ArgumentTypeError(f"{what}; give one or more of {','.join(choices)}, comma-separated")
        return names

    return parse
