"""The server's LoRA options (``--lora NAME=PATH``, ``--lora-rank``, ``--lora-gpu-slots``), checked once with the
command line into the adapters' plan (:class:`AdapterPlan`) and the catalog of served model ids; nothing heavy is
imported (the parser's ``--help`` stays light). The start-up loads the plan's adapters with
:func:`.bank.attach_adapters`."""

from __future__ import annotations

import argparse
import logging
import re
from dataclasses import dataclass

from ..catalog import ModelCatalog

logger = logging.getLogger(__name__)

__all__ = ["ADAPTER_NAME_PATTERN", "AdapterPlan", "AdapterSpec", "add_lora_options", "parse_lora_option",
           "served_models"]

#: An adapter's name (what a request's ``model`` field says): letters, digits and ``._-:/``, at most 128.
ADAPTER_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")


def add_lora_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("adapters (LoRA)")
    g.add_argument("--lora", action="append", default=[], metavar="NAME=PATH",
                   help="serve a LoRA adapter (diffusers/peft safetensors, as load_lora_weights reads them) to requests "
                   "whose model field is NAME; repeatable. GET /v1/models lists the base model and every adapter")
    g.add_argument("--lora-rank", type=int, default=None, metavar="R",
                   help="hot-swap rank: every adapter is padded to it, so switching adapters never recaptures a graph "
                   "(default: the largest rank among the adapters; an adapter above it stops the server)")
    g.add_argument("--lora-gpu-slots", type=int, default=None, metavar="K",
                   help="adapters kept on the GPU; the others wait on the CPU and are copied in when a request asks "
                   "for them, least recently used out first (default: all)")


@dataclass(frozen=True)
class AdapterSpec:
    """``--lora NAME=PATH``: the name requests use and the LoRA file (or a folder holding
    ``pytorch_lora_weights.safetensors``)."""

    name: str
    path: str


def parse_lora_option(text: str) -> AdapterSpec:
    """``"NAME=PATH"`` -> :class:`AdapterSpec`; ``ValueError`` saying what is expected."""
    name, sep, path = text.partition("=")
    if not sep or not path:
        raise ValueError(f"--lora {text!r}: expected NAME=PATH (a name for requests' model field, then the LoRA "
                         "safetensors file or its folder), e.g. --lora anime=/loras/anime.safetensors")
    if not ADAPTER_NAME_PATTERN.fullmatch(name):
        raise ValueError(f"--lora {text!r}: the name {name!r} must start with a letter or digit and hold only "
                         "letters, digits and ._:/- (at most 128 characters)")
    return AdapterSpec(name, path)


@dataclass(frozen=True)
class AdapterPlan:
    """The LoRA adapters served (``--lora``), their hot-swap rank and device slots (``None``: the defaults)."""

    specs: tuple[AdapterSpec, ...] = ()
    rank: int | None = None
    gpu_slots: int | None = None


def served_models(args, parser: argparse.ArgumentParser) -> tuple[AdapterPlan, ModelCatalog]:
    """The adapters of ``--lora`` (with ``--lora-rank`` and ``--lora-gpu-slots``) and the served model ids: the base
    model's (``--served-model-name``, else ``--model``) and the adapters'. ``parser.error`` (exit 2) for a malformed
    ``--lora``, a name given twice or equal to the base model's, or ``--lora-rank`` / ``--lora-gpu-slots`` out of
    range or without ``--lora``."""
    specs = []
    for text in args.lora:
        try:
            specs.append(parse_lora_option(text))
        except ValueError as exc:
            parser.error(str(exc))
    for name in ("lora_rank", "lora_gpu_slots"):
        value = getattr(args, name)
        flag = f"--{name.replace('_', '-')}"
        if value is not None and value < 1:
            parser.error(f"{flag} must be >= 1 (got {value})")
        if value is not None and not specs:
            parser.error(f"{flag} applies to adapters: give them with --lora NAME=PATH")
    try:
        catalog = ModelCatalog(args.served_model_name or args.model, tuple(spec.name for spec in specs))
    except ValueError as exc:
        parser.error(str(exc))
    return AdapterPlan(tuple(specs), args.lora_rank, args.lora_gpu_slots), catalog
