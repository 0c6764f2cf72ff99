"""Where a capture failed, read from the exception's frames, as the units that could run eagerly instead.

A failure is attributed to *modules on the stack*, never to a function name: the frames of the
traceback whose ``self`` is a module of the model (torch's call of the module or the module's own
code) give the chain of modules that were running when the host work happened. Free functions
(a helper in the model file, a third-party kernel wrapper, a process-wide patch of a torch function,
a ``functools.partial``, a lambda) belong to the innermost module that called them. From the
innermost outward, :func:`locate` lists the units the capture may retry with as eager breaks:

- a method other than ``forward`` of a module of the model, defined in model code, when the failure
  happened under it (``patchify``, ``rope.prepare_video_coords``, a MoE block's ``moe_infer``, also
  under a decorator such as ``@torch.no_grad()``): that method on that instance;
- the module itself (its ``forward`` wrapped as an eager break), torch's own modules included (a
  ``GELU`` whose ``F.gelu`` was replaced process-wide by a function that reads a value);
- the transformer itself (code inline in its ``forward``): module mode (see :mod:`.module_mode`).

Compiled modules cannot be split: they are passed over. The narrowing (``entries``) takes the first
unit that is not eager yet; a unit already eager that failed again (its call bypassed the wrapper)
hands over to the next one out.
"""

from __future__ import annotations

import inspect
import os
import types
from dataclasses import dataclass, field

import torch

_LIBRARY_PARTS = (
    f"{os.sep}torch{os.sep}",
    f"{os.sep}torchao{os.sep}",
    f"{os.sep}bcg_diffusion{os.sep}",
    f"{os.sep}triton{os.sep}",
    f"{os.sep}diffusers{os.sep}hooks{os.sep}",
)


@dataclass(frozen=True)
class FailureSite:
    """One unit that was running when a capture failed: ``kind`` is ``"module"`` (the submodule at
    ``path``), ``"method"`` (method ``name`` of the submodule at ``path``; ``""`` is the transformer)
    or ``"root"`` (the transformer's own ``forward``). ``owner_type`` is the module's class: units of
    the same class are found by identity, never by name (``torch.nn.GELU`` is not diffusers' ``GELU``)."""

    kind: str
    path: str = ""
    name: str = ""
    owner_class: str = ""
    owner_type: type | None = field(default=None, compare=False, repr=False)

    def describe(self) -> str:
        if self.kind == "module":
            return f"{self.path} ({self.owner_class})"
        if self.kind == "method":
            return f"{self.path + '.' if self.path else ''}{self.name}() ({self.owner_class})"
        return f"{self.owner_class}.forward"


def _is_library_code(code: types.CodeType) -> bool:
    return any(part in code.co_filename for part in _LIBRARY_PARTS) or code.co_filename.startswith("<")


def _frames(exc: BaseException) -> list[types.FrameType]:
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def _is_compiled(module: torch.nn.Module) -> bool:
    return getattr(module, "_compiled_call_impl", None) is not None or hasattr(module, "_orig_mod")


def _method_of(module: torch.nn.Module, code: types.CodeType) -> str | None:
    """The name of the method of ``module``'s class (model code, not ``forward``, not a dunder) whose
    code ``code`` is, or ``None``."""
    name = code.co_name
    if name == "forward" or name.startswith("__") or _is_library_code(code):
        return None
    try:
        method = inspect.getattr_static(type(module), name)
    except AttributeError:
        return None
    if isinstance(method, (staticmethod, classmethod)):
        return None
    return name if getattr(_unwrapped(method), "__code__", None) is code else None


def locate(exc: BaseException, root: torch.nn.Module) -> list[FailureSite]:
    """The units of ``root`` that were running where ``exc`` was raised, innermost first (empty when
    no frame of the traceback belongs to a module of ``root``)."""
    paths = {id(m): name for name, m in root.named_modules()}
    sites: list[FailureSite] = []
    for frame in reversed(_frames(exc)):
        owner = frame.f_locals.get("self")
        if not isinstance(owner, torch.nn.Module) or id(owner) not in paths or _is_compiled(owner):
            continue
        path = paths[id(owner)]
        cls = type(owner)
        method = _method_of(owner, frame.f_code)
        if method is not None:
            site = FailureSite("method", path=path, name=method, owner_class=cls.__name__, owner_type=cls)
        else:
            site = FailureSite("root" if path == "" else "module", path=path, owner_class=cls.__name__, owner_type=cls)
        if site not in sites:
            sites.append(site)
    return sites


def _unwrapped(function):
    """``function`` without the decorators that keep ``__wrapped__`` (``functools.wraps``)."""
    try:
        return inspect.unwrap(function) if callable(function) else function
    except ValueError:  # a __wrapped__ cycle
        return function


def instances_of(root: torch.nn.Module, cls: type) -> list[str]:
    """Qualified names of the submodules of ``root`` whose class is exactly ``cls``."""
    return [name for name, m in root.named_modules() if name and type(m) is cls]
