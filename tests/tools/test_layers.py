"""The layer rules of the tree, read from the imports with ``ast`` (nothing is imported, so this runs in a second).

- ``bcg_diffusion/core/`` imports only itself, the standard library, torch and cuda-bindings;
- ``bcg_diffusion/integration/`` imports nothing of the API modules (:data:`API_MODULES`);
- the library (everything of ``bcg_diffusion`` but the tool packages) imports neither the tools nor ``bcg_pipelines``;
- the tools (:data:`TOOL_PACKAGES`, ``scripts/``) and ``pipelines/`` use of the library only public names: the
  ``__all__`` of a public module (:data:`PUBLIC_MODULES`), imported or read as an attribute
  (``bcg_diffusion.X``); ``pipelines/`` imports no tool;
- nothing imports ``pipelines`` (the folder installs as ``bcg_pipelines``), nothing writes ``sys.path``;
- nothing but the Ray Serve modules (:data:`RAY_MODULES`, the ``ray`` extra) imports ``ray``;
- nothing but the tests names a test-only switch (:data:`TEST_SWITCH`): the tests install what they need
  (the sabotage is a watcher of the runner events that ``tests/conftest.py`` installs);
- every package folder is listed in pyproject.toml, every console command and ``scripts/*.py`` launcher calls
  the ``main`` of a tool module.

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
TOOL_PACKAGES = ("bcg_diffusion.benchmarks", "bcg_diffusion.checks", "bcg_diffusion.cli", "bcg_diffusion.serving")
PUBLIC_MODULES = ("bcg_diffusion", "bcg_diffusion.core")
#: The user API, which the integration sits below (config, errors, families and stats are shared by both).
API_MODULES = ("bcg_diffusion", "bcg_diffusion.accelerate", "bcg_diffusion.compile_cache", "bcg_diffusion.step_caches",
               "bcg_diffusion.warmup")
CORE_MAY_IMPORT = ("torch", "cuda")
#: The only modules that import Ray (the optional ``ray`` extra): the single server runs without it.
RAY_MODULES = ("bcg_diffusion.serving.ray_app", "bcg_diffusion.serving.ray_run")
#: The prefix of the test suite's switches (``..._SABOTAGE``), spelt so that this file does not match itself.
TEST_SWITCH = "BCG_DIFFUSION_" + "TEST_"
#: ``sys.path`` writes, spelt so that this file does not match itself.
SYS_PATH_WRITE = re.compile("sys" + r"\.path\s*(\.(insert|append|extend)\s*\(|\+?=[^=])|site\.addsitedir\(")


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


def public_names(root: Path) -> dict[str, set[str]]:
    """``__all__`` of each public module, read from its source."""
    names = {}
    for module in PUBLIC_MODULES:
        path = root / Path(*module.split(".")) / "__init__.py"
        names[module] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
                names[module] = set(ast.literal_eval(node.value))
    return names


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


def check_source(source: Source, text: str, public: dict[str, set[str]], modules: set[str]) -> list[str]:
    """The rules broken by one file, as ``path:line: what``; ``modules``: every module of the tree."""
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


def layer_violations(root: Path = ROOT) -> list[str]:
    """Every rule of this module broken under ``root``, as ``path:line: what``."""
    public = public_names(root)
    tree = sources(root)
    modules = {s.module for s in tree}
    out = []
    for source in tree:
        out += check_source(source, (root / source.path).read_text(), public, modules)
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
    return out + packaging_problems(root)


# -- the tree keeps the rules ------------------------------------------------------------------------------
def test_the_tree_keeps_the_layer_rules():
    assert layer_violations() == []


def test_the_checker_reads_the_whole_tree():
    modules = {s.module for s in sources(ROOT)}
    assert {"bcg_diffusion.core.capture", "bcg_diffusion.integration.runner", "bcg_diffusion.cli.generate",
            "bcg_diffusion.serving.server", "bcg_diffusion.benchmarks.bench_step", "bcg_pipelines.registry",
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
            'packages = ["bcg_diffusion", "bcg_diffusion.cli", "bcg_diffusion.core", "bcg_diffusion.integration", '
            '"bcg_pipelines"]\n'),
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
        "pipelines/__init__.py": "from bcg_diffusion import accelerate_pipeline\n",
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
    ("bcg_diffusion/serving/__init__.py", "", "package bcg_diffusion.serving is not in [tool.setuptools] packages"),
    ("bcg_diffusion/cli/generate.py", "from ray import serve\n\ndef main():\n    pass\n", "only bcg_diffusion.serving"
     ".ray_app, bcg_diffusion.serving.ray_run import Ray"),
    ("bcg_diffusion/accelerate.py", "import ray\n", "only bcg_diffusion.serving.ray_app"),
])
def test_the_checker_reports_a_broken_rule(tmp_path, name, text, needle):
    violations = layer_violations(_tree(tmp_path, {name: text}))
    assert any(needle in v for v in violations), violations
