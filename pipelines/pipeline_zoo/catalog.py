"""Which diffusers pipeline classes run a transformer: derived from the installed diffusers, not listed by hand.

A class counts when any of its components is named ``transformer...`` (``transformer``, ``transformer_2``), read
from its ``__init__`` signature, its ``_optional_components`` and its ``model_cpu_offload_seq``. So a class that a
newer diffusers exports shows up here, and the zoo's tests report it as missing rather than skipping it.

diffusers exports a placeholder (a ``DummyObject``) for a class whose optional backend is not installed; its
components are then read from its source file with ``ast`` (nothing is imported).
"""

from __future__ import annotations

import ast
import functools
import inspect
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PipelineClass", "transformer_pipelines"]


@dataclass(frozen=True)
class PipelineClass:
    """One exported pipeline class that runs a transformer.

    ``components``: the component names (``__init__`` parameters, optional components, offload sequence);
    ``module``: the diffusers module that defines it (``diffusers.pipelines.<folder>.<file>``), or ``""`` for a
    placeholder whose source was not found; ``missing_backends``: for a placeholder, the packages diffusers
    says it needs (empty for an importable class).
    """

    name: str
    components: tuple[str, ...]
    module: str
    missing_backends: tuple[str, ...] = ()

    @property
    def folder(self) -> str:
        """The ``diffusers.pipelines`` sub-package (``flux``, ``wan``, ...): the family group of the class."""
        parts = self.module.split(".")
        return parts[2] if len(parts) > 3 and parts[1] == "pipelines" else ""

    @property
    def importable(self) -> bool:
        return not self.missing_backends


def _runs_a_transformer(components: set[str]) -> bool:
    return any(name.startswith("transformer") for name in components)


def _components_of(cls: type) -> set[str]:
    names = set(list(inspect.signature(cls.__init__).parameters)[1:])
    names |= set(getattr(cls, "_optional_components", None) or ())
    names |= set(filter(None, (getattr(cls, "model_cpu_offload_seq", None) or "").split("->")))
    return names


def _source_components(name: str) -> tuple[set[str], str]:
    """(components, module) of a placeholder class, from the diffusers source file that defines it."""
    import diffusers

    root = Path(diffusers.__file__).parent
    needle = f"class {name}("
    for path in sorted((root / "pipelines").rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if needle not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.name == name:
                module = ".".join(("diffusers", *path.relative_to(root).with_suffix("").parts))
                return _class_node_components(node), module
    return set(), ""


def _class_node_components(node: ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            names |= {arg.arg for arg in [*item.args.args[1:], *item.args.kwonlyargs]}
        elif isinstance(item, (ast.Assign, ast.AnnAssign)):
            targets = item.targets if isinstance(item, ast.Assign) else [item.target]
            keys = {t.id for t in targets if isinstance(t, ast.Name)}
            if "_optional_components" in keys and isinstance(item.value, (ast.List, ast.Tuple)):
                names |= {e.value for e in item.value.elts if isinstance(e, ast.Constant)}
            if "model_cpu_offload_seq" in keys and isinstance(item.value, ast.Constant):
                names |= set(filter(None, str(item.value.value).split("->")))
    return names


@functools.lru_cache(maxsize=1)
def transformer_pipelines() -> dict[str, PipelineClass]:
    """Every ``diffusers.<Name>Pipeline`` class whose components include a transformer, by name (sorted)."""
    import diffusers
    from diffusers.utils import DummyObject

    found: dict[str, PipelineClass] = {}
    for name in sorted(n for n in dir(diffusers) if n.endswith("Pipeline")):
        cls = getattr(diffusers, name)
        if not inspect.isclass(cls):
            continue
        if isinstance(cls, DummyObject):
            components, module = _source_components(name)
            backends = tuple(b for b in cls._backends if b not in ("torch", "transformers"))
        else:
            components, module, backends = _components_of(cls), cls.__module__, ()
        if _runs_a_transformer(components):
            found[name] = PipelineClass(name, tuple(sorted(components)), module, backends)
    return found
