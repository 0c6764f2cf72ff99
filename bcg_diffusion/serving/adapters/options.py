"""The server's LoRA options (``--lora NAME=PATH``, ``--lora-rank``, ``--lora-gpu-slots``), checked once with the
command line into the adapters' plan and the catalog of served model ids, and the adapters loaded at start-up (:class:`.bank.AdapterBank`). Any adapter that cannot be served
stops the server before it listens, with a message naming the adapter (exit code 2)."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bcg_diffusion.toolkit.options import Failure

from ..catalog import ModelCatalog

if TYPE_CHECKING:  # torch: imported where adapters are read and loaded, not by the parser (--help)
    from .bank import AdapterBank, AdapterSpec

logger = logging.getLogger(__name__)

__all__ = ["AdapterPlan", "add_lora_options", "attach_adapters", "served_models"]


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
    from .bank import parse_lora_option

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


def attach_adapters(pipe, adapters, catalog: ModelCatalog, prog: str) -> AdapterBank | None:
    """Load the adapters of ``adapters`` (an :class:`AdapterPlan`: the specs, ``--lora-rank``, ``--lora-gpu-slots``) into ``pipe``'s transformer (before BCG or compile touch it), in the order of ``catalog``;
    ``None`` without any. :class:`~bcg_diffusion.toolkit.options.Failure` (exit code 2) naming the adapter that cannot
    be served."""
    if not adapters.specs:
        return None
    from .bank import AdapterBank, AdapterError

    try:
        bank = AdapterBank(pipe, adapters.specs, catalog, target_rank=adapters.rank, gpu_slots=adapters.gpu_slots)
        bank.load()
    except AdapterError as exc:
        raise Failure(2, f"{prog}: error: {exc}") from exc
    return bank
