"""A ``--cache SPEC`` value read once into a :class:`CacheSpec` (``fbc:0.2``, ``taylorseer:3``, ``dbcache``,
``cache-dit:FILE.yaml``). Imports nothing heavy: the parsers read :data:`CACHE_HELP` before torch is imported.

The commands parse the text once, where it enters (:meth:`CacheSpec.parse`), and hand the value object on;
the functions that take a spec also take its text (:func:`as_spec`) for callers from Python.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path

from .numbers import whole_number

__all__ = ["CACHE_DIT_FILE", "CACHE_DIT_NAMES", "CACHE_HELP", "CACHE_NAMES", "WHOLE_VALUE_CACHES", "CacheSpec",
           "as_spec"]

#: diffusers' step caches (their recipes: :mod:`.cache_recipes`).
CACHE_NAMES = ("fbc", "taylorseer", "magcache", "pab", "fastercache")
#: cache-dit's caches (the cache-dit extra): on the whole pipeline, through cache_dit.enable_cache.
CACHE_DIT_NAMES = ("dbcache", "dbcache-taylorseer", "dbprune")
CACHE_DIT_FILE = "cache-dit"
#: The caches whose value counts steps or blocks (an interval, a skip range): a whole number, never rounded.
WHOLE_VALUE_CACHES = ("taylorseer", "pab", "fastercache")
CACHE_HELP = (
    "fbc[:THRESHOLD] (FirstBlockCache, default 0.5), taylorseer[:INTERVAL] (TaylorSeer, default 2), "
    "magcache[:THRESHOLD] (MagCache, default 0.06), pab[:RANGE] (PyramidAttentionBroadcast, default 2), "
    "fastercache[:RANGE] (FasterCache, default 2); cache-dit (pip install 'bcg-diffusion[cache-dit]'): "
    "dbcache[:THRESHOLD], dbcache-taylorseer[:THRESHOLD], dbprune[:THRESHOLD] (cache-dit's DBCache, DBCache with "
    "the TaylorSeer calibrator, DBPrune; residual-difference threshold, default cache-dit's 0.08), "
    "cache-dit:FILE.yaml (any cache-dit settings, read by cache_dit.load_configs)"
)


@dataclass(frozen=True)
class CacheSpec:
    """One step cache as asked for: ``name`` (of :data:`CACHE_NAMES`, :data:`CACHE_DIT_NAMES` or
    :data:`CACHE_DIT_FILE`), ``value`` (the number after ``:``, the settings file of ``cache-dit:FILE``, or
    ``None`` for the cache's default) and ``text`` as the user wrote it (for messages and reports)."""

    name: str
    value: float | int | str | None
    text: str

    @classmethod
    def parse(cls, text: str) -> CacheSpec:
        """``"fbc:0.2"`` -> ``CacheSpec("fbc", 0.2, "fbc:0.2")``; ``ValueError`` naming the accepted forms (and
        what to install for cache-dit's)."""
        name, _, value = text.partition(":")
        name = name.strip().lower()
        if name in CACHE_DIT_NAMES + (CACHE_DIT_FILE,):
            if importlib.util.find_spec("cache_dit") is None:
                raise ValueError(f"cache {text!r} is cache-dit's, which is not installed: "
                                 "pip install 'bcg-diffusion[cache-dit]'")
            if name == CACHE_DIT_FILE:
                if not value.strip():
                    raise ValueError(f"cache {text!r}: give the settings file, e.g. cache-dit:cache.yaml")
                if not Path(value.strip()).is_file():
                    raise ValueError(f"cache {text!r}: no file {value.strip()!r}")
                return cls(name, value.strip(), text)
        elif name not in CACHE_NAMES:
            raise ValueError(f"unknown cache {text!r}; use one of: {CACHE_HELP}")
        if not value:
            return cls(name, None, text)
        return cls(name, _read_value(name, value, text), text)

    @property
    def is_cache_dit(self) -> bool:
        """Whether this is one of cache-dit's caches (on the whole pipeline) rather than a diffusers one."""
        return self.name in CACHE_DIT_NAMES + (CACHE_DIT_FILE,)

    def __str__(self) -> str:
        return self.text


def _read_value(name: str, value: str, text: str) -> float | int:
    """The number after ``:``: finite and positive, and whole for :data:`WHOLE_VALUE_CACHES`; ``ValueError``
    naming the spec otherwise."""
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"cache {text!r}: the value after ':' must be a number ({CACHE_HELP})") from None
    if not math.isfinite(number):
        raise ValueError(f"cache {text!r}: the value after ':' must be a finite number")
    if number <= 0:
        raise ValueError(f"cache {text!r}: the value after ':' must be positive")
    if name in WHOLE_VALUE_CACHES:
        return whole_number(number, f"cache {text!r}: the value after ':' (a count of steps or blocks)")
    return number


def as_spec(spec: CacheSpec | str) -> CacheSpec:
    """``spec`` itself, or its text parsed (:meth:`CacheSpec.parse`)."""
    return spec if isinstance(spec, CacheSpec) else CacheSpec.parse(spec)
