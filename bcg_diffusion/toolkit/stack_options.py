"""The speed stack on the command line, one parser for ``bcg-generate`` and ``bcg-serve`` (and its Ray replicas):
``--quant``, ``--cache``, ``--compile``, ``--compile-cache`` and ``--attention-backend``.

:func:`add_stack_options` adds the options to a parser (nothing heavy imported: the parsers are built before
torch); ``--quant`` and ``--cache`` are read while parsing (an unknown name exits 2 with argparse's message, the same
in every command). :func:`read_stack` checks the rest once torch may be imported, ``parser.error`` (exit code 2)
naming what to change, and returns the :class:`StackOptions` value that the commands hand on. :mod:`.stack`
applies it to a built pipeline.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cache_spec import CACHE_HELP, CacheSpec
from .quant_option import QUANT_HELP, QUANT_NAMES

__all__ = ["STACK_OPTIONS", "StackOptions", "add_stack_options", "cache_argument", "read_stack"]

#: The options of the stack, as both commands spell them.
STACK_OPTIONS = ("--quant", "--cache", "--compile", "--compile-cache", "--attention-backend")


def cache_argument(text: str) -> CacheSpec:
    """``--cache TEXT`` read while parsing (``argparse``'s ``type``): a :class:`CacheSpec`, or the reason it is none."""
    try:
        return CacheSpec.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_stack_options(group: argparse._ActionsContainer) -> None:
    """Add the stack's options to ``group`` (a parser or an argument group)."""
    group.add_argument("--quant", choices=QUANT_NAMES, default=None,
                       help=f"torchao quantization of the transformer, right after the build: {QUANT_HELP} (needs "
                       "torchao: pip install -e \".[quant]\")")
    group.add_argument("--cache", type=cache_argument, default=None, metavar="SPEC",
                       help=f"a step cache: {CACHE_HELP}")
    group.add_argument("--compile", action="store_true",
                       help="regional torch.compile of the transformer's repeated blocks (combines with --bcg)")
    group.add_argument("--compile-cache", type=Path, default=None, metavar="DIR",
                       help="with --compile: keep torch's compile artifacts in DIR (bcg_diffusion.use_compile_cache) so "
                       "that a later process loads them instead of compiling again")
    group.add_argument("--attention-backend", default=None, metavar="NAME",
                       help="diffusers attention backend, e.g. native, flash, _native_cudnn (set_attention_backend)")


@dataclass(frozen=True)
class StackOptions:
    """The speed stack asked for, checked: ``quant`` (a :data:`~.quant_option.QUANT_NAMES` name), ``cache`` (a
    step cache), ``compile`` (regional compile), ``compile_cache`` (its artifacts' folder) and ``attention_backend``
    (a diffusers backend name, lower case). ``None`` / ``False``: that layer is off."""

    quant: str | None = None
    cache: CacheSpec | None = None
    compile: bool = False
    compile_cache: Path | None = None
    attention_backend: str | None = None

    @property
    def layers(self) -> tuple[str, ...]:
        """The layers that are on, in the order they are applied: ``("fp8", "compile", "cache dbcache:0.1")``."""
        layers = []
        if self.quant:
            layers.append(self.quant)
        if self.attention_backend:
            layers.append(f"attention {self.attention_backend}")
        if self.cache is not None:
            layers.append(f"cache {self.cache.text}")
        if self.compile:
            layers.append("compile")
        return tuple(layers)

    def describe(self) -> str:
        """One line: ``fp8 + cache dbcache:0.1 + compile``, or ``none`` for the model as built."""
        return " + ".join(self.layers) or "none"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (``/stats``, result files)."""
        return {"quant": self.quant, "cache": None if self.cache is None else self.cache.text, "compile": self.compile,
                "compile_cache": None if self.compile_cache is None else str(self.compile_cache),
                "attention_backend": self.attention_backend, "layers": list(self.layers), "text": self.describe()}


def read_stack(args: argparse.Namespace, parser: argparse.ArgumentParser, *, family: str | None = None,
               device: Any = None) -> StackOptions:
    """The stack of ``args`` (parsed by a parser with :func:`add_stack_options`), checked: ``parser.error`` for a
    compile cache without ``--compile`` or that is a file, a step cache that cannot run on ``family`` (``None``: not
    known yet, checked once the model is loaded), a quantization without torchao or that ``device`` (a
    ``torch.device``; ``None``: not chosen here) cannot run, an attention backend diffusers lacks or cannot run."""
    if args.compile_cache is not None:
        if not args.compile:
            parser.error("--compile-cache keeps torch.compile's artifacts, and nothing compiles without --compile; "
                         "add --compile or leave --compile-cache out")
        if args.compile_cache.exists() and not args.compile_cache.is_dir():
            parser.error(f"--compile-cache {str(args.compile_cache)!r} is a file; give a folder (it is created if "
                         "missing)")
    if args.cache is not None and family is not None:
        _check_cache(args.cache, family, parser)
    if args.quant is not None:
        _check_quant(args.quant, device, parser)
    backend = _checked_backend(args.attention_backend, parser)
    return StackOptions(quant=args.quant, cache=args.cache, compile=bool(args.compile),
                        compile_cache=args.compile_cache, attention_backend=backend)


def _check_cache(spec: CacheSpec, family: str, parser: argparse.ArgumentParser) -> None:
    from .cache_option import check_cache

    try:
        check_cache(spec, family)
    except ValueError as exc:
        parser.error(f"--cache: {exc}")


def _check_quant(name: str, device: Any, parser: argparse.ArgumentParser) -> None:
    from .quant_option import device_problem, torchao_problem

    problem = torchao_problem() or (device_problem(name, device) if device is not None else None)
    if problem:
        parser.error(f"--quant {name}: {problem}")


def _checked_backend(name: str | None, parser: argparse.ArgumentParser) -> str | None:
    """``--attention-backend`` in lower case, after diffusers' own checks (its names; its requirement check, e.g.
    ``flash`` without the flash-attn package)."""
    if name is None:
        return None
    from .speedups import attention_backend_names, attention_backend_problem  # diffusers

    lowered = name.lower()
    if lowered not in attention_backend_names():
        parser.error(f"--attention-backend {name!r} is not a diffusers backend; choose one of: "
                     f"{', '.join(attention_backend_names())}")
    problem = attention_backend_problem(lowered)
    if problem:
        parser.error(f"--attention-backend {name}: {problem}")
    return lowered
