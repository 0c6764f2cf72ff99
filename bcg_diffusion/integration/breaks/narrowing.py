"""Narrowing: after a failed capture, the part of the model that was running where it failed becomes an eager
break of its own, so that the retry captures the rest.

The failure is attributed to the modules that were running (:func:`~..failures.locate`, from the frames of its
traceback), innermost first. The first of them that is not eager yet becomes an eager break
(:class:`~.eager_modules.EagerModules`): a submodule, or one method of it; a second failing instance of a class
makes every instance of the class eager. A failure in the transformer's own forward cannot be cut out: it
switches the key to module mode (:data:`MODULE_MODE`, :mod:`..module_mode`). :func:`narrow_safely` is what a
failed capture calls (:mod:`..entries`); it never raises.
"""

from __future__ import annotations

import logging
from typing import Protocol

import torch

from .. import failures
from ...config import BCGConfig
from .eager_modules import EagerModules

logger = logging.getLogger("bcg_diffusion")

#: What :func:`narrow` returns when the failure is in the transformer's own forward.
MODULE_MODE = "module mode"


class NarrowingScope(Protocol):
    """What narrowing reads of a capture (its :class:`~..entries.CaptureContext`): the captured ``module``, the
    ``transformer`` it belongs to, the transformer's eager parts and the ``config`` (``max_narrowing``)."""

    module: torch.nn.Module
    eager_modules: EagerModules
    config: BCGConfig

    @property
    def transformer(self) -> torch.nn.Module: ...


def narrow_safely(ctx: NarrowingScope, exc: BaseException, narrowed: list[str]) -> tuple[str | None, str]:
    """:func:`narrow` on the units where ``exc`` was raised, and where that was (" in ..." or "").
    Whatever goes wrong while narrowing ends it (``None``: the key runs eagerly): handling a failed
    capture never raises into the caller's call."""
    where = ""
    try:
        sites = failures.locate(exc, ctx.transformer)
        if sites:
            where = f" in {sites[0].describe()}"
        return narrow(ctx, sites, narrowed), where
    except Exception as problem:  # noqa: BLE001 - a capture failure must never become the caller's error
        logger.warning("bcg: narrowing after a failed capture of %s did not work (%s: %s); the key runs eagerly",
                       type(ctx.module).__name__, type(problem).__name__, problem, exc_info=True)
        return None, where


def narrow(ctx: NarrowingScope, sites: list[failures.FailureSite], narrowed: list[str]) -> str | None:
    """Make the innermost unit of ``sites`` (see :func:`failures.locate`) that is not eager yet an eager
    break; returns its label, :data:`MODULE_MODE` when the failure is in the transformer's own forward,
    or ``None`` when nothing smaller than the captured module can run eagerly (or the narrowing limit
    is reached)."""
    if len(narrowed) >= ctx.config.max_narrowing:
        return None
    eager = ctx.eager_modules
    root = ctx.transformer
    captured_path = next((n for n, m in root.named_modules() if m is ctx.module), "")
    for site in sites:
        if site.kind == "root" or (site.kind == "module" and site.path == captured_path):
            return MODULE_MODE if ctx.module is root else None
        if site.kind == "module" and site.path not in eager.names:
            return _make_module_eager(eager, root, site)
        if site.kind == "method" and f"{site.path + '.' if site.path else ''}{site.name}()" not in eager.names:
            return _make_method_eager(eager, root, site)
    return None


def _make_module_eager(eager: EagerModules, root: torch.nn.Module, site: failures.FailureSite) -> str:
    """The module at ``site.path`` runs as an eager break; when another module of its class (by
    identity) already does, every module of the class does."""
    if not eager.module_paths(site.owner_type):
        eager.add(root, site.path)
        return site.path
    paths = [p for p in failures.instances_of(root, site.owner_type) if p not in eager.names]
    for path in paths:
        eager.add(root, path)
    return f"every {site.owner_class} ({len(eager.module_paths(site.owner_type))} modules)"


def _make_method_eager(eager: EagerModules, root: torch.nn.Module, site: failures.FailureSite) -> str:
    """Method ``site.name`` of the module at ``site.path`` runs as an eager break; when it already
    does in another module of the class (by identity: every MoE block, say), in every module of it."""
    if not eager.method_paths(site.owner_type, site.name):
        return eager.add_method(root, site.path, site.name)
    instances = failures.instances_of(root, site.owner_type) if site.path else []
    for path in [p for p in instances if f"{p}.{site.name}()" not in eager.names] or [site.path]:
        eager.add_method(root, path, site.name)
    return f"{site.name}() of every {site.owner_class} ({len(eager.method_paths(site.owner_type, site.name))} modules)"
