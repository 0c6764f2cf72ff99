"""The layer rules of the tree, read from the imports with ``ast`` (nothing is imported, so this runs in a second).

- ``bcg_diffusion/core/`` imports only itself, the standard library, torch and cuda-bindings;
- ``bcg_diffusion/integration/`` imports nothing of the API modules (:data:`API_MODULES`);
- the library (everything of ``bcg_diffusion`` but the tool packages) imports neither the tools nor ``bcg_pipelines``;
- the kit (``bcg_diffusion.toolkit``) sits below the commands (:data:`COMMAND_PACKAGES`): it imports none of them,
  and no command imports another command's modules (each job of ``benchmarks/`` is a command of its own; the
  modules at its top are their shared parts, which import no job);
- ``bcg_pipelines`` imports nothing of ``bcg_diffusion`` (it owns the family names: the two packages do not import
  each other);
- no import circles: no modules that import each other in a loop (imports inside functions count);
- the tools (:data:`TOOL_PACKAGES`, ``scripts/``) and ``pipelines/`` use of the library only public names: the
  ``__all__`` of a public module (:data:`PUBLIC_MODULES`), imported or read as an attribute
  (``bcg_diffusion.X``); ``pipelines/`` imports no tool;
- nothing imports ``pipelines`` (the folder installs as ``bcg_pipelines``), nothing writes ``sys.path``;
- nothing but the Ray Serve modules (:data:`RAY_MODULES`, the ``ray`` extra) imports ``ray``;
- nothing but the tests names a test-only switch (:data:`TEST_SWITCH`): the tests install what they need
  (the sabotage is a watcher of the runner events that ``tests/conftest.py`` installs);
- every package folder is listed in pyproject.toml, every console command and ``scripts/*.py`` launcher calls
  the ``main`` of a tool module;
- sizes (:data:`SIZE_LIMITED`): no function over :data:`MAX_FUNCTION_LINES` lines and no class over
  :data:`MAX_CLASS_ATTRIBUTES` attributes in ``integration/`` and ``serving/`` (none exempt).

:func:`layer_violations` is the checker; the tests at the end run it on small trees with one broken rule each.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = "bcg_diffusion"
FIXTURES = "bcg_pipelines"  # the folder pipelines/, as it installs
KIT = "bcg_diffusion.toolkit"
COMMAND_PACKAGES = ("bcg_diffusion.benchmarks", "bcg_diffusion.checks", "bcg_diffusion.cli", "bcg_diffusion.serving")
#: Commands whose sub-packages are commands of their own (each benchmark job); a sub-package of another command
#: (``bcg_diffusion.serving.batching``) is a part of that command.
JOB_PACKAGES = ("bcg_diffusion.benchmarks",)
TOOL_PACKAGES = (*COMMAND_PACKAGES, KIT)
PUBLIC_MODULES = ("bcg_diffusion", "bcg_diffusion.core")
#: The user API, which the integration sits below (config, errors, families and stats are shared by both).
API_MODULES = ("bcg_diffusion", "bcg_diffusion.accelerate", "bcg_diffusion.compile_cache", "bcg_diffusion.step_caches",
               "bcg_diffusion.warmup", "bcg_diffusion.weight_streaming")
CORE_MAY_IMPORT = ("torch", "cuda")
#: The only modules that import Ray (the optional ``ray`` extra): the single server runs without it.
RAY_MODULES = ("bcg_diffusion.serving.replicas.ray_app", "bcg_diffusion.serving.replicas.ray_run")
#: The prefix of the test suite's switches (``..._SABOTAGE``), spelt so that this file does not match itself.
TEST_SWITCH = "BCG_DIFFUSION_" + "TEST_"
#: ``sys.path`` writes, spelt so that this file does not match itself.
SYS_PATH_WRITE = re.compile("sys" + r"\.path\s*(\.(insert|append|extend)\s*\(|\+?=[^=])|site\.addsitedir\(")


#: The packages whose functions and classes are kept small (paths under the root).
SIZE_LIMITED = ("bcg_diffusion/integration", "bcg_diffusion/serving")
MAX_FUNCTION_LINES = 40  # from the ``def`` line to the last line of its body, nested functions included
MAX_CLASS_ATTRIBUTES = 15  # annotated class-level names (dataclass fields) and ``self.X`` assigned in its methods
@dataclass(frozen=True)
class Source:
    path: Path  # relative to the root
    module: str  # dotted name as installed ("scripts.generate" for a launcher)
    is_package: bool  # an __init__.py


def sources(root: Path) -> list[Source]:
    """The Python files of the library, the fixtures and the scripts under ``root``."""
    found = []
    for folder, installed in (("bcg_diffusion", LIBRARY), ("pipelines", FIXTURES), ("scripts", "scripts")):
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            found.append(Source(path.relative_to(root), ".".join([installed, *parts]), is_package))
    return found


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def kind_of(module: str) -> str:
    """``core``, ``integration``, ``library`` (the rest of it), ``tools``, ``fixtures`` or ``other``."""
    if any(within(module, t) for t in TOOL_PACKAGES) or within(module, "scripts"):
        return "tools"
    if within(module, "bcg_diffusion.core"):
        return "core"
    if within(module, "bcg_diffusion.integration"):
        return "integration"
    if within(module, LIBRARY):
        return "library"
    if within(module, FIXTURES):
        return "fixtures"
    return "other"


def command_of(module: str, packages: set[str]) -> str | None:
    """The command a module belongs to: a package of :data:`COMMAND_PACKAGES`, or a job of ``benchmarks/`` (its
    sub-package); ``bcg_diffusion.benchmarks`` itself for the parts its jobs share; ``None`` outside them."""
    for command in COMMAND_PACKAGES:
        if within(module, command):
            job = ".".join(module.split(".")[:3])
            return job if command in JOB_PACKAGES and job != command and job in packages else command
    return None


def command_problem(source_module: str, target: str, packages: set[str]) -> str | None:
    """Why ``source_module`` may not import ``target`` by the kit's rules (``None`` where it may)."""
    if within(source_module, KIT) and command_of(target, packages):
        return f"the kit imports {target}, a command's module: the kit sits below the commands"
    mine, theirs = command_of(source_module, packages), command_of(target, packages)
    if mine is None or theirs is None or mine == theirs:
        return None
    if within(mine, theirs):  # a benchmark job uses the parts the jobs share
        return None
    return f"{mine} imports {target}, a module of the command {theirs}: share it through {KIT}"


def public_names(root: Path) -> dict[str, set[str]]:
    """``__all__`` of each public module, read from its source: a literal list, or made from a dict or list
    literal of the module (``__all__ = sorted(_EXPORTS)``)."""
    names = {}
    for module in PUBLIC_MODULES:
        path = root / Path(*module.split(".")) / "__init__.py"
        literals, names[module] = {}, set()
        for node in ast.parse(path.read_text()).body:
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0] if isinstance(node, ast.Assign) else None
            if not isinstance(target, ast.Name) or node.value is None:
                continue
            if target.id == "__all__":
                names[module] = _names_of(node.value, literals)
            else:
                try:
                    literals[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    pass
    return names


def _names_of(value: ast.expr, literals: dict) -> set[str]:
    """The names an ``__all__`` expression lists: a literal, or ``sorted(X)`` / ``list(X)`` of a literal ``X``."""
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) in ("sorted", "list") and len(value.args) == 1 \
            and isinstance(value.args[0], ast.Name):
        return set(literals[value.args[0].id])
    return set(ast.literal_eval(value))


def absolute(source: Source, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    package = source.module if source.is_package else source.module.rpartition(".")[0]
    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(source: Source, tree: ast.AST) -> list[tuple[int, str, str | None]]:
    """``(line, module, name)`` per imported name: ``name`` is ``None`` for ``import module``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = absolute(source, node)
            found += [(node.lineno, module, alias.name) for alias in node.names]
    return found


def library_use_problem(module: str, name: str | None, public: dict[str, set[str]], modules: set[str]) -> str | None:
    """Why ``import module`` (``name`` None) or ``from module import name`` uses the library's private parts."""
    target = module if name is None else f"{module}.{name}"
    if not within(target, LIBRARY) or any(within(target, t) for t in TOOL_PACKAGES) or target in PUBLIC_MODULES:
        return None
    if name is None or module not in PUBLIC_MODULES:
        return f"{module} is not a public module (public: {', '.join(PUBLIC_MODULES)})"
    if target in modules:
        return f"{target} is not a public module (public: {', '.join(PUBLIC_MODULES)})"
    return None if name in public[module] else f"{name} is not in {module}.__all__"


def attribute_problems(tree: ast.AST, bound: dict[str, str], public: dict[str, set[str]]) -> list[tuple[int, str]]:
    """``bcg_diffusion.X`` (and ``core.X``) read through a name bound to a public module: X must be public."""
    problems = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or isinstance(getattr(node, "_parent_attr", None), ast.Attribute):
            continue
        chain, value = [], node
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if not isinstance(value, ast.Name) or value.id not in bound:
            continue
        module = bound[value.id]
        for attr in reversed(chain):
            if f"{module}.{attr}" in PUBLIC_MODULES or any(f"{module}.{attr}" == t for t in TOOL_PACKAGES):
                module = f"{module}.{attr}"
                continue
            if attr not in public[module]:
                problems.append((node.lineno, f"{module}.{attr} is not in {module}.__all__"))
            break
    return problems


def _mark_parents(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            if isinstance(node, ast.Attribute) and child is node.value:
                child._parent_attr = node  # type: ignore[attr-defined]


def check_source(source: Source, text: str, public: dict[str, set[str]], modules: set[str],
                 packages: set[str] = frozenset()) -> list[str]:
    """The rules broken by one file, as ``path:line: what``; ``modules``: every module of the tree, ``packages``
    the packages among them."""
    tree = ast.parse(text)
    _mark_parents(tree)
    kind = kind_of(source.module)
    out = []

    def say(line: int, what: str) -> None:
        out.append(f"{source.path}:{line}: {what}")

    bound = {}
    for line, module, name in imports(source, tree):
        top = module.split(".")[0]
        target = module if name is None else f"{module}.{name}"
        imported = target if target in modules else module  # the module this import runs
        if top == "pipelines":
            say(line, f"imports {module}: the folder pipelines/ installs as {FIXTURES}")
        if top == "ray" and source.module not in RAY_MODULES:
            say(line, f"imports {module}: only {', '.join(RAY_MODULES)} import Ray (the optional ray extra)")
        if kind == "core" and not (within(module, "bcg_diffusion.core") or top in CORE_MAY_IMPORT
                                   or top in sys.stdlib_module_names or top == "__future__"):
            say(line, f"core imports {module} (only itself, the standard library, torch and cuda-bindings)")
        if kind == "integration" and imported in API_MODULES:
            say(line, f"integration imports {target}, which is the API above it")
        if kind in ("core", "integration", "library") and (any(within(target, t) for t in TOOL_PACKAGES)
                                                           or top == FIXTURES):
            say(line, f"the library imports {target}, a tool or the fixture package")
        if kind == "fixtures" and any(within(target, t) for t in TOOL_PACKAGES):
            say(line, f"{FIXTURES} imports {target}: the fixture package knows nothing of the tools")
        elif kind == "fixtures" and top == LIBRARY:
            say(line, f"{FIXTURES} imports {target}: it owns the family names and imports nothing of {LIBRARY}")
        problem = command_problem(source.module, imported, packages)
        if problem:
            say(line, problem)
        if kind in ("tools", "fixtures"):
            problem = library_use_problem(module, name, public, modules)
            if problem:
                say(line, f"uses the library's private parts: {problem}")
    if kind in ("tools", "fixtures"):
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in PUBLIC_MODULES:
                        local = alias.asname or alias.name.split(".")[0]
                        bound[local] = alias.name if alias.asname else alias.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and absolute(source, node) == LIBRARY:
                for alias in node.names:
                    if f"{LIBRARY}.{alias.name}" in PUBLIC_MODULES:
                        bound[alias.asname or alias.name] = f"{LIBRARY}.{alias.name}"
        out += [f"{source.path}:{line}: uses the library's private parts: {what}"
                for line, what in attribute_problems(tree, bound, public)]
    for number, line in enumerate(text.splitlines(), 1):
        if SYS_PATH_WRITE.search(line):
            say(number, "writes sys.path")
        if TEST_SWITCH in line:
            say(number, f"reads a test-only switch ({TEST_SWITCH}...): the tests install what they need")
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the tree it imports (anywhere in the file: an import inside a function counts)."""
    tree = sources(root)
    modules = {s.module for s in tree}
    graph: dict[str, set[str]] = {}
    for source in tree:
        targets = set()
        for _, module, name in imports(source, ast.parse((root / source.path).read_text())):
            module = FIXTURES + module[len("pipelines"):] if within(module, "pipelines") else module
            target = f"{module}.{name}" if name and f"{module}.{name}" in modules else module
            if target in modules and target != source.module:
                targets.add(target)
        graph[source.module] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: each strongly connected set of two modules or more, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def packaging_problems(root: Path) -> list[str]:
    """pyproject.toml against the tree: every package listed; console commands and launchers call a ``main``."""
    project = tomllib.loads((root / "pyproject.toml").read_text())
    setuptools = project["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    folders = {src.module for src in sources(root) if src.is_package}
    out = [f"pyproject.toml: package {m} is not in [tool.setuptools] packages" for m in sorted(folders - listed)]
    out += [f"pyproject.toml: package {m} is listed but has no folder" for m in sorted(listed - folders)]
    if setuptools.get("package-dir", {}).get(FIXTURES) != "pipelines":
        out.append(f"pyproject.toml: package-dir does not install pipelines/ as {FIXTURES}")
    mains = {src.module: src.path for src in sources(root)}
    targets = dict(project["project"].get("scripts", {}))
    for path in sorted((root / "scripts").glob("*.py")):
        statements = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))]
        called = [n.module for n in statements if isinstance(n, ast.ImportFrom) and [a.name for a in n.names] == ["main"]]
        others = [n for n in statements if not (isinstance(n, ast.Import) and [a.name for a in n.names] == ["sys"])
                  and not (isinstance(n, ast.ImportFrom) and n.module in called)]
        if len(called) != 1 or others or len(path.read_text().splitlines()) > 12:
            out.append(f"{path.relative_to(root)}: not a thin launcher (import sys, import one tool's main, call it)")
            continue
        targets[f"scripts/{path.name}"] = f"{called[0]}:main"
    for command, target in targets.items():
        module, _, function = target.partition(":")
        path = mains.get(module)
        if path is None or kind_of(module) != "tools":
            out.append(f"{command} -> {target}: no such tool module")
            continue
        defined = {n.name for n in ast.parse((root / path).read_text()).body if isinstance(n, ast.FunctionDef)}
        if function not in defined:
            out.append(f"{command} -> {target}: {module} defines no {function}()")
    return out


def _attributes(cls: ast.ClassDef) -> set[str]:
    """What :data:`MAX_CLASS_ATTRIBUTES` counts of a class: its annotated class-level names (not ``ClassVar``) and
    the ``self.X`` its methods assign."""
    names = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
             and "ClassVar" not in ast.unparse(n.annotation)}
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        names.update(t.attr for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                     and t.value.id == "self")
    return names


def oversized(tree: ast.AST) -> list[tuple[str, int, str]]:
    """``(qualified name, line, what)`` of every function over :data:`MAX_FUNCTION_LINES` lines and class over
    :data:`MAX_CLASS_ATTRIBUTES` attributes in a module's tree."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if isinstance(child, ast.ClassDef) and len(_attributes(child)) > MAX_CLASS_ATTRIBUTES:
                    found.append((name, child.lineno, f"class {name} has {len(_attributes(child))} attributes "
                                                      f"(at most {MAX_CLASS_ATTRIBUTES})"))
                lines = child.end_lineno - child.lineno + 1
                if not isinstance(child, ast.ClassDef) and lines > MAX_FUNCTION_LINES:
                    found.append((name, child.lineno, f"function {name} has {lines} lines (at most {MAX_FUNCTION_LINES})"))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def size_offences(root: Path) -> list[tuple[str, str]]:
    """``(path:qualified name, path:line: what)`` of every oversized function and class in :data:`SIZE_LIMITED`."""
    out = []
    for package in SIZE_LIMITED:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            for name, line, what in oversized(ast.parse(path.read_text())):
                out.append((f"{relative}:{name}", f"{relative}:{line}: {what}"))
    return out


def size_violations(root: Path) -> list[str]:
    """The oversized functions and classes of :data:`SIZE_LIMITED` (none is exempt)."""
    return [f"{what}: split it" for _key, what in size_offences(root)]


def layer_violations(root: Path = ROOT) -> list[str]:
    """Every rule of this module broken under ``root``, as ``path:line: what``."""
    public = public_names(root)
    tree = sources(root)
    modules = {s.module for s in tree}
    packages = {s.module for s in tree if s.is_package}
    out = []
    for source in tree:
        out += check_source(source, (root / source.path).read_text(), public, modules, packages)
    out += [f"import circle: {' -> '.join(circle)}" for circle in circles(import_graph(root))]
    for path in sorted((root / "tests").rglob("*.py")) if (root / "tests").is_dir() else ():
        text = path.read_text()
        for number, line in enumerate(text.splitlines(), 1):
            if SYS_PATH_WRITE.search(line):
                out.append(f"{path.relative_to(root)}:{number}: writes sys.path")
        for node in ast.walk(ast.parse(text)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n.split(".")[0] == "pipelines" for n in names):
                out.append(f"{path.relative_to(root)}:{node.lineno}: imports pipelines: it installs as {FIXTURES}")
    return out + packaging_problems(root) + size_violations(root)


# -- the tree keeps the rules ------------------------------------------------------------------------------
def test_the_tree_keeps_the_layer_rules():
    assert layer_violations() == []


def test_the_checker_reads_the_whole_tree():
    modules = {s.module for s in sources(ROOT)}
    assert {"bcg_diffusion.core.capture", "bcg_diffusion.integration.runner", "bcg_diffusion.cli.generate",
            "bcg_diffusion.serving.server", "bcg_diffusion.benchmarks.step.bench_step", "bcg_diffusion.toolkit.options",
            "bcg_pipelines.registry",
            "bcg_pipelines.family_specs.flux", "scripts.generate"} <= modules
    assert public_names(ROOT)["bcg_diffusion"] >= {"accelerate_pipeline", "count_cache_passes", "install_attention_breaks"}
    assert "walk" in public_names(ROOT)["bcg_diffusion.core"]


# -- the checker finds a broken rule (a small tree per rule) ------------------------------------------------
def _tree(root: Path, files: dict[str, str]) -> Path:
    """A minimal project: the public modules, pyproject.toml, a launcher; then ``files`` on top."""
    base = {
        "pyproject.toml": (
            '[project]\nname = "x"\n[project.scripts]\nbcg-generate = "bcg_diffusion.cli.generate:main"\n'
            '[tool.setuptools]\npackage-dir = { "bcg_pipelines" = "pipelines" }\n'
            'packages = ["bcg_diffusion", "bcg_diffusion.benchmarks", "bcg_diffusion.benchmarks.shapes", '
            '"bcg_diffusion.benchmarks.step", "bcg_diffusion.cli", "bcg_diffusion.core", "bcg_diffusion.integration", '
            '"bcg_diffusion.serving", "bcg_diffusion.toolkit", "bcg_pipelines"]\n'),
        "bcg_diffusion/__init__.py": '__all__ = ["accelerate_pipeline"]\nfrom .accelerate import accelerate_pipeline\n',
        "bcg_diffusion/accelerate.py": "from .integration import runner\n\ndef accelerate_pipeline(pipe):\n    pass\n",
        "bcg_diffusion/config.py": "",
        "bcg_diffusion/core/__init__.py": '__all__ = ["walk"]\nfrom .tree import walk\n',
        "bcg_diffusion/core/tree.py": "import torch\n\ndef walk(x):\n    return x\n\ndef _private(x):\n    return x\n",
        "bcg_diffusion/integration/__init__.py": "",
        "bcg_diffusion/integration/runner.py": "from ..config import *\nfrom ..core.tree import walk\n",
        "bcg_diffusion/cli/__init__.py": "",
        "bcg_diffusion/cli/generate.py": ("import bcg_diffusion\nimport bcg_pipelines as pipelines\n"
                                          "from bcg_diffusion.core import walk\n\n"
                                          "def main():\n    bcg_diffusion.accelerate_pipeline(pipelines)\n"),
        "bcg_diffusion/toolkit/__init__.py": "",
        "bcg_diffusion/toolkit/options.py": "import bcg_diffusion\n",
        "bcg_diffusion/serving/__init__.py": "",
        "bcg_diffusion/serving/server.py": "from bcg_diffusion.toolkit.options import bcg_diffusion\n",
        "bcg_diffusion/benchmarks/__init__.py": "",
        "bcg_diffusion/benchmarks/timing.py": "",
        "bcg_diffusion/benchmarks/step/__init__.py": "",
        "bcg_diffusion/benchmarks/step/bench_step.py": "from ..timing import *\nfrom .cases import *\n",
        "bcg_diffusion/benchmarks/step/cases.py": "",
        "bcg_diffusion/benchmarks/shapes/__init__.py": "",
        "bcg_diffusion/benchmarks/shapes/scenario.py": "from ..timing import *\n",
        "pipelines/__init__.py": "from .registry import *\n",
        "pipelines/registry.py": "",
        "scripts/generate.py": ("import sys\n\nfrom bcg_diffusion.cli.generate import main\n\n"
                                'if __name__ == "__main__":\n    sys.exit(main())\n'),
    }
    for name, text in {**base, **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_clean_small_tree_has_no_violations(tmp_path):
    assert layer_violations(_tree(tmp_path, {})) == []


def test_public_names_are_read_from_the_one_list_the_package_makes_its_all_from(tmp_path):
    init = ('_EXPORTS: dict[str, str | None] = {"accelerate_pipeline": ".accelerate", "__version__": None}\n'
            "__all__ = sorted(_EXPORTS)\n")
    root = _tree(tmp_path, {"bcg_diffusion/__init__.py": init})
    assert public_names(root)["bcg_diffusion"] == {"accelerate_pipeline", "__version__"}
    assert layer_violations(root) == []
    (root / "bcg_diffusion/cli/generate.py").write_text("from bcg_diffusion import get_stats\n\ndef main():\n    pass\n")
    assert any("get_stats is not in bcg_diffusion.__all__" in v for v in layer_violations(root))


_LONG_BODY = "    x = 0\n" * MAX_FUNCTION_LINES


@pytest.mark.parametrize("package", SIZE_LIMITED)
@pytest.mark.parametrize("text, needle", [
    (f"def handle():\n{_LONG_BODY}", f"function handle has {MAX_FUNCTION_LINES + 1} lines"),
    (f"def outer():\n    def inner():\n    {_LONG_BODY.replace(chr(10), chr(10) + '    ')}\n    return inner\n",
     "function outer.inner has"),
    ("class Plan:\n" + "".join(f"    f{i}: int = 0\n" for i in range(MAX_CLASS_ATTRIBUTES + 1)),
     f"class Plan has {MAX_CLASS_ATTRIBUTES + 1} attributes"),
    ("class Bank:\n    def __init__(self):\n" + "".join(f"        self.a{i} = {i}\n" for i in range(MAX_CLASS_ATTRIBUTES + 1)),
     f"class Bank has {MAX_CLASS_ATTRIBUTES + 1} attributes"),
])
def test_the_checker_reports_a_new_oversized_function_or_class(tmp_path, package, text, needle):
    violations = layer_violations(_tree(tmp_path, {f"{package}/planted.py": text}))
    assert any(needle in v and f"{package}/planted.py" in v for v in violations), violations


def test_the_size_limits_are_reached_not_passed(tmp_path):
    text = ("def handle():\n" + "    x = 0\n" * (MAX_FUNCTION_LINES - 1) + "class Plan:\n"
            + "".join(f"    f{i}: int = 0\n" for i in range(MAX_CLASS_ATTRIBUTES)))
    assert layer_violations(_tree(tmp_path, {"bcg_diffusion/serving/planted.py": text})) == []


def test_circles_are_the_loops_of_the_import_graph():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("name, text, needle", [
    ("bcg_diffusion/cli/generate.py", "from bcg_diffusion.core.tree import _private\n\ndef main():\n    pass\n",
     "bcg_diffusion.core.tree is not a public module"),
    ("bcg_diffusion/cli/generate.py", "from bcg_diffusion.core import _private\n\ndef main():\n    pass\n",
     "_private is not in bcg_diffusion.core.__all__"),
    ("bcg_diffusion/cli/generate.py", "from bcg_diffusion import config\n\ndef main():\n    pass\n",
     "bcg_diffusion.config is not a public module"),
    ("bcg_diffusion/cli/generate.py", "import bcg_diffusion\n\ndef main():\n    bcg_diffusion.accelerate.x()\n",
     "bcg_diffusion.accelerate is not in bcg_diffusion.__all__"),
    ("bcg_diffusion/cli/generate.py", "from bcg_diffusion import core\n\ndef main():\n    core.tree.walk(1)\n",
     "bcg_diffusion.core.tree is not in bcg_diffusion.core.__all__"),
    ("scripts/tool.py", "from bcg_diffusion.integration import runner\n", "bcg_diffusion.integration is not a public"),
    ("pipelines/x.py", "from bcg_diffusion.step_caches import count\n", "bcg_diffusion.step_caches is not a public"),
    ("pipelines/x.py", "from bcg_diffusion import accelerate_pipeline\n", "imports nothing of bcg_diffusion"),
    ("pipelines/x.py", "from bcg_diffusion.cli import generate\n", "knows nothing of the tools"),
    ("bcg_diffusion/core/tree.py", "from ..accelerate import accelerate_pipeline\n",
     "core imports bcg_diffusion.accelerate"),
    ("bcg_diffusion/core/tree.py", "import diffusers\n", "core imports diffusers"),
    ("bcg_diffusion/integration/runner.py", "from ..accelerate import accelerate_pipeline\n",
     "integration imports bcg_diffusion.accelerate.accelerate_pipeline"),
    ("bcg_diffusion/integration/runner.py", "from .. import warmup\n", "integration imports bcg_diffusion.warmup"),
    ("bcg_diffusion/integration/runner.py", "import bcg_diffusion\n", "integration imports bcg_diffusion,"),
    ("bcg_diffusion/integration/entries.py", "import os\nSABOTAGE = os.environ.get('BCG_DIFFUSION_" "TEST_SABOTAGE')\n",
     "reads a test-only switch"),
    ("bcg_diffusion/accelerate.py", "from .cli import generate\n", "the library imports bcg_diffusion.cli.generate"),
    ("bcg_diffusion/cli/generate.py", "import pipelines\n\ndef main():\n    pass\n", "installs as bcg_pipelines"),
    ("bcg_diffusion/cli/generate.py", "import sys\nsys" ".path.insert(0, '.')\n\ndef main():\n    pass\n",
     "writes sys.path"),
    ("tests/test_x.py", "import sys\nsys" ".path.append('scripts')\n", "writes sys.path"),
    ("scripts/generate.py", "import sys\nimport os\nfrom bcg_diffusion.cli.generate import main\n"
     + "\n" * 10 + "main()\n", "not a thin launcher"),
    ("bcg_diffusion/cli/generate.py", "from ray import serve\n\ndef main():\n    pass\n", "only bcg_diffusion.serving"
     ".replicas.ray_app, bcg_diffusion.serving.replicas.ray_run import Ray"),
    ("bcg_diffusion/accelerate.py", "import ray\n", "only bcg_diffusion.serving.replicas.ray_app"),
    ("bcg_diffusion/checks/__init__.py", "", "package bcg_diffusion.checks is not in [tool.setuptools] packages"),
    # the kit below the commands; no command imports another's modules; the library imports no tool; no circles
    ("bcg_diffusion/toolkit/options.py", "from bcg_diffusion.cli.generate import main\n",
     "the kit imports bcg_diffusion.cli.generate, a command's module"),
    ("bcg_diffusion/toolkit/options.py", "from bcg_diffusion.benchmarks import timing\n",
     "the kit imports bcg_diffusion.benchmarks.timing, a command's module"),
    ("bcg_diffusion/serving/server.py", "from bcg_diffusion.cli.generate import main\n",
     "bcg_diffusion.serving imports bcg_diffusion.cli.generate, a module of the command bcg_diffusion.cli"),
    ("bcg_diffusion/cli/generate.py", "from bcg_diffusion.serving import server\n\ndef main():\n    pass\n",
     "bcg_diffusion.cli imports bcg_diffusion.serving.server, a module of the command bcg_diffusion.serving"),
    ("bcg_diffusion/benchmarks/shapes/scenario.py", "from ..step.cases import *\n",
     "bcg_diffusion.benchmarks.shapes imports bcg_diffusion.benchmarks.step.cases, a module of the command "
     "bcg_diffusion.benchmarks.step"),
    ("bcg_diffusion/benchmarks/timing.py", "from .step import cases\n",
     "bcg_diffusion.benchmarks imports bcg_diffusion.benchmarks.step.cases"),
    ("bcg_diffusion/accelerate.py", "from .toolkit import options\n", "the library imports bcg_diffusion.toolkit"),
    ("bcg_diffusion/accelerate.py", "import bcg_pipelines\n", "the library imports bcg_pipelines"),
    ("bcg_diffusion/benchmarks/step/cases.py", "def f():\n    from . import bench_step\n",
     "import circle: bcg_diffusion.benchmarks.step.bench_step -> bcg_diffusion.benchmarks.step.cases"),
])
def test_the_checker_reports_a_broken_rule(tmp_path, name, text, needle):
    violations = layer_violations(_tree(tmp_path, {name: text}))
    assert any(needle in v for v in violations), violations


#: The step scheduler's core: no HTTP, and nothing of the server around it (the server calls it, not the reverse).
STEP_CORE = "bcg_diffusion.serving.batching.stepping"
HTTP_MODULES = ("fastapi", "starlette", "uvicorn", "httpx", "pydantic")


def step_core_problems(root: Path = ROOT) -> list[str]:
    """Imports of the step scheduler's core (:data:`STEP_CORE`) that reach HTTP or the server's other modules."""
    problems = []
    for source in sources(root):
        if not within(source.module, STEP_CORE):
            continue
        for line, module, _name in imports(source, ast.parse((root / source.path).read_text())):
            server_part = within(module, "bcg_diffusion.serving") and not within(module, STEP_CORE)
            if server_part or any(within(module, m) for m in HTTP_MODULES):
                problems.append(f"{source.path}:{line}: imports {module}")
    return problems


def test_the_step_scheduler_core_needs_no_http_nor_the_server():
    assert step_core_problems() == []
