"""The one loader of the scripts under ``scripts/`` (and of other files by path) for the tests.

A script is not a package module: it is loaded from its file under a private name, registered in
``sys.modules`` before it runs (dataclasses and pickling look their module up while it executes),
and ``scripts/`` is put on ``sys.path`` so that its own imports (``serving``, ``bench``) resolve.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"


def scripts_on_path() -> None:
    """``scripts/`` first on ``sys.path`` (once), for ``import serving``, ``import bench`` and the like."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))


def load_file(path: Path, name: str) -> ModuleType:
    """The module in ``path``, executed under ``name`` and registered in ``sys.modules``."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as the module ``_bcg_script_<name>`` (a fresh copy each call)."""
    scripts_on_path()
    return load_file(SCRIPTS / f"{name}.py", f"_bcg_script_{name}")
