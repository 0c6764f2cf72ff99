"""Where the planting harness plants: the sites of one model, found by a survey of an eager call, and
how a plant is put there and taken out again.

Site kinds (:data:`SITE_KINDS`):

- ``module_instance``: a module's ``forward`` replaced on the instance (a TeaCache-style patch);
- ``module_class``: a diffusers class's ``forward`` reassigned (every instance, twin included);
- ``free_function``: a Python function that a forward (or a processor) calls by its global name,
  replaced in that Python module (a helper in the model file, a kernel wrapper);
- ``torch_function``: a ``torch.nn.functional`` function replaced process-wide (``F.gelu``);
- ``processor_instance``: an attention module's processor wrapped by a processor of another class;
- ``processor_class``: a diffusers processor class's ``__call__`` reassigned;
- ``hook``: a diffusers ``ModelHook`` registered on a module.

The plant runs after the site's own code and changes the first floating-point tensor of its output
(:func:`map_first_float`). The survey keeps only sites that one eager call reaches with a finite,
non-empty floating-point output. Every install returns its undo; module sites are planted in both
the accelerated model and its twin (same paths), process-wide sites once.
"""

from __future__ import annotations

import inspect
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from bcg_diffusion.core import is_recording_segment

from .planting_kinds import Kind, PlantState

SITE_KINDS = (
    "module_instance", "module_class", "free_function", "torch_function", "processor_instance", "processor_class", "hook",
)
#: Sites whose Python the library sees as not the class's own: it runs them eagerly on every call.
OPAQUE_SITES = frozenset({"module_instance", "module_class", "processor_instance", "processor_class", "hook"})
#: torch functions planted process-wide, where a model calls them.
TORCH_FUNCTIONS = ("gelu", "silu", "layer_norm", "rms_norm", "group_norm", "linear", "softmax", "pad",
                   "scaled_dot_product_attention")
#: Functions the library itself replaces (attention breaks): planted through processors instead.
_LIBRARY_PATCHED = frozenset({"dispatch_attention_fn", "scaled_dot_product_attention"})
HOOK_NAME = "planted_check"  # not "bcg_...": the library ignores hooks of that prefix as its own
_MISSING = object()


@dataclass(frozen=True)
class Site:
    """One place to plant: ``kind`` (of :data:`SITE_KINDS`), ``target`` (a module path, a function's
    ``module.name``, a class's qualified name) and ``path`` (the module the site belongs to, or ``""``)."""

    kind: str
    target: str
    path: str = ""

    def label(self) -> str:
        where = f" at {self.path or '<root>'}" if self.kind in ("module_class", "processor_class") else ""
        return f"{self.kind}:{self.target}{where}"


@dataclass
class Survey:
    """The sites one eager call of a model reaches (see the module docstring)."""

    sites: dict[str, list[Site]] = field(default_factory=dict)

    def of(self, kind: str) -> list[Site]:
        return self.sites.get(kind, [])


def map_first_float(value: Any, fn: Callable[[torch.Tensor], torch.Tensor], depth: int = 0) -> tuple[Any, bool]:
    """``value`` with ``fn`` applied to its first non-empty floating-point tensor (tensors, tuples,
    named tuples, lists, dicts and diffusers output objects, 4 levels deep), and whether one was found."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.numel():
            return fn(value), True
        return value, False
    if depth >= 4:
        return value, False
    if isinstance(value, (tuple, list)):
        items = list(value)
        for i, item in enumerate(items):
            new, done = map_first_float(item, fn, depth + 1)
            if done:
                items[i] = new
                if hasattr(value, "_fields"):
                    return type(value)(*items), True
                return type(value)(items), True
        return value, False
    if isinstance(value, dict):
        for key, item in list(value.items()):
            new, done = map_first_float(item, fn, depth + 1)
            if done:
                if type(value) is dict:
                    return {**value, key: new}, True
                value[key] = new  # diffusers' output objects: a fresh object per call
                return value, True
    return value, False


def plantable(value: Any) -> bool:
    """Whether ``value`` has a first floating-point tensor, all finite (a plant there is meaningful)."""
    found: list[torch.Tensor] = []
    map_first_float(value, lambda t: found.append(t) or t)
    return bool(found) and bool(torch.isfinite(found[0]).all())


class Plant:
    """One kind of work at one site: :meth:`apply` runs it on a site's output and notes where it ran
    (``paths``: ``id(module) -> path`` of the modules of both models)."""

    def __init__(self, kind: Kind, state: PlantState, paths: dict[int, str]) -> None:
        self.kind, self.state, self.paths = kind, state, paths

    def apply(self, out: Any) -> Any:
        self.state.fired += 1
        self.state.fired_in_capture += is_recording_segment()
        self.state.places.add(self._place())
        new, _ = map_first_float(out, lambda t: self.kind.work(t, self.state))
        return new

    def _place(self) -> str:
        """The path of the innermost module of the model on the stack (``"?"`` when none is)."""
        frame = sys._getframe(2)
        while frame is not None:
            owner = frame.f_locals.get("self")
            if isinstance(owner, torch.nn.Module) and id(owner) in self.paths:
                return self.paths[id(owner)]
            frame = frame.f_back
        return "?"


class PlantedProcessor:
    """An attention processor of another class around the original one (a user's processor).

    Use :func:`planted_processor`: diffusers' ``Attention.forward`` passes a processor only the keyword
    arguments its ``__call__`` names, so the wrapper's ``__call__`` must name those of the processor it wraps."""

    def __init__(self, inner: Any, plant: Plant) -> None:
        self.inner, self.plant = inner, plant

    def __call__(self, attn: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        return self.plant.apply(self.inner(attn, *args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "plant"):
            raise AttributeError(name)
        return getattr(self.inner, name)


def planted_processor(inner: Any, plant: Plant) -> PlantedProcessor:
    """A :class:`PlantedProcessor` around ``inner`` whose ``__call__`` has ``inner``'s signature."""

    def __call__(self: PlantedProcessor, attn: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        return self.plant.apply(self.inner(attn, *args, **kwargs))

    try:
        __call__.__signature__ = inspect.signature(type(inner).__call__)  # type: ignore[attr-defined]
    except (TypeError, ValueError):  # no signature to copy: keep the generic one
        return PlantedProcessor(inner, plant)
    return type("PlantedProcessor", (PlantedProcessor,), {"__call__": __call__})(inner, plant)


def _planted_hook_class() -> type:
    from diffusers.hooks import ModelHook

    class PlantedHook(ModelHook):
        """A diffusers hook whose ``post_forward`` runs the plant on the module's output."""

        def __init__(self, plant: Plant) -> None:
            super().__init__()
            self.plant = plant

        def post_forward(self, module: torch.nn.Module, output: Any) -> Any:
            return self.plant.apply(output)

    return PlantedHook


# -- the survey -------------------------------------------------------------------------------------
def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _functions_of(cls: type) -> list[types.FunctionType]:
    found = []
    for klass in cls.__mro__:
        if not klass.__module__.startswith("diffusers."):
            continue
        for attr in vars(klass).values():
            fn = attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr
            fn = inspect.unwrap(fn) if callable(fn) else fn
            if isinstance(fn, types.FunctionType):
                found.append(fn)
    return found


def free_function_candidates(model: torch.nn.Module) -> list[tuple[str, str]]:
    """``(python module, name)`` of the Python functions that the code of the model's diffusers classes
    and processors reads by a global name (torch's own functions and the library's patch points left out)."""
    classes = {type(m) for m in model.modules()}
    classes |= {type(m.processor) for m in model.modules() if getattr(m, "processor", None) is not None}
    found = set()
    for cls in classes:
        for fn in _functions_of(cls):
            where = fn.__globals__.get("__name__", "")
            for name in _code_names(fn.__code__):
                target = fn.__globals__.get(name)
                if (isinstance(target, types.FunctionType) and name not in _LIBRARY_PATCHED
                        and not getattr(target, "__module__", "").startswith("torch")
                        and getattr(target, "__bcg_original__", None) is None and where in sys.modules):
                    found.add((where, name))
    return sorted(found)


def survey(model: torch.nn.Module, call: Callable[[], Any]) -> Survey:
    """The sites of ``model`` that one eager ``call()`` reaches with a plantable output."""
    paths = {id(m): p for p, m in model.named_modules()}
    reached: dict[str, bool] = {}
    handles = []

    def on_module(module, args, output):  # noqa: ARG001 - torch's hook signature
        path = paths.get(id(module))
        if path is not None and not reached.get(f"m:{path}"):
            reached[f"m:{path}"] = plantable(output)

    for module in model.modules():
        handles.append(module.register_forward_hook(on_module))
    functions = free_function_candidates(model)
    patched: list[tuple[Any, str, Any]] = []

    def recorder(key: str, original: Callable) -> Callable:
        def record(*args, **kwargs):
            out = original(*args, **kwargs)
            if not reached.get(key):
                reached[key] = plantable(out)
            return out
        return record

    for where, name in functions:
        owner = sys.modules[where]
        patched.append((owner, name, getattr(owner, name)))
        setattr(owner, name, recorder(f"f:{where}.{name}", getattr(owner, name)))
    for name in TORCH_FUNCTIONS:
        original = getattr(torch.nn.functional, name, None)
        if original is not None:
            patched.append((torch.nn.functional, name, original))
            setattr(torch.nn.functional, name, recorder(f"t:{name}", original))
    try:
        with torch.no_grad():
            call()
    finally:
        for handle in handles:
            handle.remove()
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)
    result = Survey()
    modules = [p for p, _ in model.named_modules() if reached.get(f"m:{p}")]
    result.sites["module_instance"] = [Site("module_instance", p, p) for p in modules]
    seen_classes: dict[type, str] = {}
    for p in modules:
        cls = type(model.get_submodule(p))
        if cls.__module__.startswith("diffusers.") and cls not in seen_classes:
            seen_classes[cls] = p
    result.sites["module_class"] = [
        Site("module_class", f"{c.__module__}.{c.__qualname__}", p) for c, p in seen_classes.items()]
    result.sites["free_function"] = [
        Site("free_function", f"{w}.{n}") for w, n in functions if reached.get(f"f:{w}.{n}")]
    result.sites["torch_function"] = [
        Site("torch_function", f"torch.nn.functional.{n}") for n in TORCH_FUNCTIONS if reached.get(f"t:{n}")]
    attention = [p for p in modules if _diffusers_processor(model.get_submodule(p)) is not None]
    result.sites["processor_instance"] = [Site("processor_instance", p, p) for p in attention]
    processor_classes: dict[type, str] = {}
    for p in attention:
        processor_classes.setdefault(type(model.get_submodule(p).processor), p)
    result.sites["processor_class"] = [
        Site("processor_class", f"{c.__module__}.{c.__qualname__}", p) for c, p in processor_classes.items()]
    result.sites["hook"] = [Site("hook", p, p) for p in modules]
    return result


def _diffusers_processor(module: torch.nn.Module) -> Any:
    processor = getattr(module, "processor", None)
    if processor is None or not type(processor).__module__.startswith("diffusers."):
        return None
    return processor


# -- installing and undoing ---------------------------------------------------------------------------
def _restore_attr(owner: Any, name: str, previous: Any) -> None:
    if previous is _MISSING:
        if name in vars(owner):
            delattr(owner, name)
    else:
        setattr(owner, name, previous)


def _instance_forward(module: torch.nn.Module, plant: Plant) -> Callable[[], None]:
    previous = module.__dict__.get("forward", _MISSING)
    original = module.forward

    def planted_forward(*args: Any, **kwargs: Any) -> Any:
        return plant.apply(original(*args, **kwargs))

    module.forward = planted_forward
    return lambda: _restore_attr(module, "forward", previous)


def _class_attr(cls: type, name: str, plant: Plant) -> Callable[[], None]:
    previous = cls.__dict__.get(name, _MISSING)
    original = getattr(cls, name)

    def planted_method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return plant.apply(original(self, *args, **kwargs))

    try:  # callers that read the signature (diffusers' Attention of a processor's __call__) see the original's
        planted_method.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        pass
    setattr(cls, name, planted_method)
    return lambda: _restore_attr(cls, name, previous)


def _function(owner: Any, name: str, plant: Plant) -> Callable[[], None]:
    original = getattr(owner, name)

    def planted_function(*args: Any, **kwargs: Any) -> Any:
        return plant.apply(original(*args, **kwargs))

    setattr(owner, name, planted_function)
    return lambda: setattr(owner, name, original)


def _processor(module: torch.nn.Module, plant: Plant) -> Callable[[], None]:
    original = module.processor
    _set_processor(module, planted_processor(original, plant))
    return lambda: _set_processor(module, original)


def _set_processor(module: torch.nn.Module, processor: Any) -> None:
    if hasattr(module, "set_processor"):
        module.set_processor(processor)
    else:
        module.processor = processor


def _hook(module: torch.nn.Module, plant: Plant) -> Callable[[], None]:
    from diffusers.hooks import HookRegistry

    had_registry = "_diffusers_hook" in module.__dict__
    previous = module.__dict__.get("forward", _MISSING)
    registry = HookRegistry.check_if_exists_or_initialize(module)
    registry.register_hook(_planted_hook_class()(plant), HOOK_NAME)

    def undo() -> None:
        registry.remove_hook(HOOK_NAME, recurse=False)
        _restore_attr(module, "forward", previous)  # diffusers leaves the bound class forward on the instance
        if not had_registry and not registry.hooks:
            del module.__dict__["_diffusers_hook"]

    return undo


def install(site: Site, plant: Plant, models: tuple[torch.nn.Module, ...]) -> Callable[[], None]:
    """Put ``plant`` at ``site`` in ``models`` (module sites: in each, at the same path; class and
    process-wide sites: once); returns the undo, which puts everything back exactly."""
    undos: list[Callable[[], None]] = []
    first = models[0]
    if site.kind == "module_instance":
        undos += [_instance_forward(m.get_submodule(site.path) if site.path else m, plant) for m in models]
    elif site.kind == "module_class":
        undos.append(_class_attr(type(first.get_submodule(site.path) if site.path else first), "forward", plant))
    elif site.kind in ("free_function", "torch_function"):
        where, _, name = site.target.rpartition(".")
        undos.append(_function(sys.modules[where], name, plant))
    elif site.kind == "processor_instance":
        undos += [_processor(m.get_submodule(site.path), plant) for m in models]
    elif site.kind == "processor_class":
        undos.append(_class_attr(type(first.get_submodule(site.path).processor), "__call__", plant))
    elif site.kind == "hook":
        undos += [_hook(m.get_submodule(site.path) if site.path else m, plant) for m in models]
    else:
        raise ValueError(f"unknown site kind {site.kind!r}; the kinds are {', '.join(SITE_KINDS)}")

    def undo() -> None:
        for step in reversed(undos):
            step()

    return undo


def train_mode(site: Site, models: tuple[torch.nn.Module, ...]) -> Callable[[], None]:
    """Put the module of ``site`` (module, processor and hook sites) in train mode in each model, itself
    only (dropout plants run "in train mode" there); returns the undo."""
    if site.kind in ("free_function", "torch_function"):
        return lambda: None
    modules = [m.get_submodule(site.path) if site.path else m for m in models]
    before = [m.training for m in modules]
    for m in modules:
        m.training = True

    def undo() -> None:
        for m, was in zip(modules, before):
            m.training = was

    return undo
