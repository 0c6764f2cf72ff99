"""What ``generate.py`` and ``serve.py`` share on their command lines: the model options, reading ``--model``
and ``--device``, and :class:`Failure`."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import bcg_pipelines as pipelines


class Failure(Exception):
    """A run that stops with ``message`` on stderr and exit code ``code``."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def add_model_options(p: argparse.ArgumentParser, default_model: str, *, which: str = "",
                      list_models: bool = False) -> argparse._ArgumentGroup:
    """The ``model`` group: ``--model``, ``--size``, ``--yes``, ``--device``, ``--dtype`` (and ``--list-models``);
    ``which`` narrows the families ``--model`` takes (e.g. "; image families only")."""
    g = p.add_argument_group("model")
    g.add_argument("--model", default=default_model,
                   help="a family of the pipelines registry (random weights"
                   + ("; --list-models shows them" if list_models else "")
                   + f"), or a local pipeline folder / hub id (org/name) for real weights (default: {default_model})"
                   + which)
    g.add_argument("--size", choices=pipelines.SIZES, default="tiny",
                   help="tiny: a few-layer model for CPUs and tests; full: the published architecture (default: tiny)")
    g.add_argument("--yes", action="store_true", help="build --size full even without CUDA (needs tens of GiB)")
    if list_models:
        g.add_argument("--list-models", action="store_true", help="list the families and exit")
    g.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    g.add_argument("--dtype", choices=pipelines.DTYPE_NAMES, default=None, help="default: bf16 on CUDA, fp32 on CPU")
    return g


def family_or_checkpoint(model: str, parser: argparse.ArgumentParser):
    """The family spec of ``model``, or ``None`` for a local folder or hub id (``parser.error`` otherwise)."""
    if model in pipelines.list_families():
        return pipelines.get_family(model)
    if Path(model).expanduser().exists() or "/" in model or "\\" in model:
        return None
    parser.error(f"--model: unknown family {model!r}; known families: {', '.join(pipelines.list_families())} "
                 "(or give a local pipeline folder or a hub id such as org/name)")


def choose_device(args, parser: argparse.ArgumentParser) -> torch.device:
    """``--device`` as a ``torch.device``; a name torch cannot read, or CUDA asked where torch sees none, is a
    usage error (exit code 2)."""
    try:
        device = pipelines.resolve_device(args.device)
    except RuntimeError as exc:
        parser.error(f"--device {args.device!r}: {exc}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device} asks for CUDA, but torch sees no CUDA device")
    return device
