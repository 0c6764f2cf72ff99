"""Where a capture failed, read from the exception's frames, and what could run eagerly instead.

The innermost frame of model code (not torch, torchao, bcg-diffusion or the standard library)
names the function that did host work under capture. Depending on what that function is, the
capture retries with a smaller eager part (see :func:`locate`):

- the ``forward`` of a submodule: that module becomes an eager break (a second instance of the
  same class failing makes the whole class eager);
- another method of a module of the model (``patchify``, ``rope.prepare_video_coords``): that
  method, on that instance, becomes an eager break;
- a module-level function called by name (``compute_text_seq_len_from_mask``): the name in the
  caller's module becomes an eager break;
- code inline in the transformer's own ``forward``: the key switches to module mode (the forward
  runs eagerly and each child call replays its own graph, see :mod:`.module_mode`).
"""

from __future__ import annotations

import inspect
import os
import sysconfig
import types
from dataclasses import dataclass

import torch

_LIBRARY_PARTS = (
    f"{os.sep}torch{os.sep}",
    f"{os.sep}torchao{os.sep}",
    f"{os.sep}bcg_diffusion{os.sep}",
    f"{os.sep}triton{os.sep}",
    f"{os.sep}diffusers{os.sep}hooks{os.sep}",
)
_STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"])
_CALL_FRAMES = ("_call_impl", "_wrapped_call_impl")


@dataclass(frozen=True)
class FailureSite:
    """What failed: ``kind`` is ``"module"`` (``path``: a submodule whose forward failed),
    ``"method"`` (``path`` of the module, ``name`` of the method), ``"function"`` (``name`` in
    the Python module ``module_name``), ``"root"`` (the transformer's own forward) or
    ``"builtin"`` (inside a torch.nn module such as Linear: not narrowed)."""

    kind: str
    path: str = ""
    name: str = ""
    module_name: str = ""
    owner_class: str = ""

    def describe(self) -> str:
        if self.kind in ("module", "builtin"):
            return f"{self.path} ({self.owner_class})"
        if self.kind == "method":
            return f"{self.path + '.' if self.path else ''}{self.name}() ({self.owner_class})"
        if self.kind == "function":
            return f"{self.module_name}.{self.name}()"
        return f"{self.owner_class}.forward"


def _is_model_frame(frame: types.FrameType) -> bool:
    filename = frame.f_code.co_filename
    if any(part in filename for part in _LIBRARY_PARTS):
        return False
    real = os.path.realpath(filename)
    return not (real.startswith(_STDLIB) and "site-packages" not in real) and not filename.startswith("<")


def _frames(exc: BaseException) -> list[types.FrameType]:
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def _is_compiled(module: torch.nn.Module) -> bool:
    return getattr(module, "_compiled_call_impl", None) is not None or hasattr(module, "_orig_mod")


def locate(exc: BaseException, root: torch.nn.Module) -> FailureSite | None:
    """The site of a capture failure in ``root``'s code, or ``None`` when no model frame names one
    (the failure surfaced in library code only, e.g. at the end of the capture)."""
    paths = {id(m): name for name, m in root.named_modules()}
    frames = _frames(exc)
    for position in range(len(frames) - 1, -1, -1):
        frame = frames[position]
        owner = frame.f_locals.get("self")
        if isinstance(owner, torch.nn.Module) and type(owner).__module__.startswith("torch.nn."):
            # Inside torch's own Linear, Conv, norm...: every instance would fail alike (quantized
            # weights whose kernels sync, ...), so no smaller eager part helps.
            return FailureSite("builtin", path=paths.get(id(owner), ""), owner_class=type(owner).__name__)
        if not _is_model_frame(frame):
            if isinstance(owner, torch.nn.Module) and id(owner) in paths and frame.f_code.co_name in _CALL_FRAMES:
                # torch's call of a module of the model, reached before any method of it: the code
                # that failed (a closure set as its forward, a hook) belongs to that module's call
                path = paths[id(owner)]
                if not _is_compiled(owner):
                    kind = "root" if path == "" else "module"
                    return FailureSite(kind, path=path, owner_class=type(owner).__name__)
            continue
        code = frame.f_code
        owner = frame.f_locals.get("self")
        if isinstance(owner, torch.nn.Module) and id(owner) in paths:
            path = paths[id(owner)]
            if _is_compiled(owner):
                continue  # compiled code cannot be split here: look further out
            if code.co_name == "forward":
                if path == "":
                    return FailureSite("root", owner_class=type(owner).__name__)
                return FailureSite("module", path=path, owner_class=type(owner).__name__)
            method = getattr(type(owner), code.co_name, None)
            if getattr(_unwrapped(method), "__code__", None) is code:  # also under @torch.no_grad() and the like
                return FailureSite("method", path=path, name=code.co_name, owner_class=type(owner).__name__)
            continue
        caller = _caller(frames, position)
        if caller is not None:
            function = caller.f_globals.get(code.co_name)
            if getattr(function, "__code__", None) is code:
                return FailureSite("function", name=code.co_name, module_name=caller.f_globals.get("__name__", ""))
    return None


def _unwrapped(function):
    """``function`` without the decorators that keep ``__wrapped__`` (``functools.wraps``)."""
    try:
        return inspect.unwrap(function) if callable(function) else function
    except ValueError:  # a __wrapped__ cycle
        return function


def _caller(frames: list[types.FrameType], position: int) -> types.FrameType | None:
    return frames[position - 1] if position > 0 else None


def instances_of(root: torch.nn.Module, class_name: str) -> list[str]:
    """Qualified names of the submodules of ``root`` of class ``class_name``."""
    return [name for name, m in root.named_modules() if name and type(m).__name__ == class_name]

