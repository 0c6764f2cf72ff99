"""What must agree across the project: dependencies against imports, and the one list of families."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_HIDE_CUDA_BINDINGS = """
import importlib.abc, sys

class NoCudaBindings(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "cuda" or name.startswith("cuda."):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)", name=name)
        return None

sys.meta_path.insert(0, NoCudaBindings())
"""


def test_bcg_diffusion_imports_without_cuda_bindings():
    """cuda-bindings is a Linux/Windows dependency: a CPU-only user imports the library without it."""
    code = _HIDE_CUDA_BINDINGS + (
        "import bcg_diffusion, bcg_pipelines\n"
        "assert not any(m == 'cuda' or m.startswith('cuda.') for m in sys.modules), "
        "sorted(m for m in sys.modules if m.startswith('cuda'))\n"
        "print(len(bcg_diffusion.__all__))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def _readme_families() -> list[str]:
    """The backticked names of README.md's "Supported families" paragraph, in order."""
    text = (ROOT / "README.md").read_text()
    start = text.index("Families with per-family builders")
    paragraph = text[start:text.index("\n\n", start)]
    return [name for name in re.findall(r"`([a-z0-9]+)`", paragraph) if name != "pipelines"]


def test_one_list_of_families():
    """bcg_pipelines.families.FAMILIES is the list; the registry (names, order, transformer classes), the spec
    modules and the README's list agree with it. The library lists no family: only classes it knows something
    particular about, each a diffusers model class with a non-empty entry."""
    import diffusers

    from bcg_diffusion import KNOWN_TRANSFORMERS
    from bcg_diffusion.families import TransformerInfo

    import bcg_pipelines as pipelines
    from bcg_pipelines.families import FAMILIES

    library = list(FAMILIES)
    assert pipelines.list_families() == library
    for name, class_name in FAMILIES.items():
        assert pipelines.get_family(name).transformer_class_name == class_name
    for class_name, info in KNOWN_TRANSFORMERS.items():
        assert info != TransformerInfo(), f"{class_name}: an entry without knowledge (the generic path gives it)"
        assert issubclass(getattr(diffusers, class_name), diffusers.ModelMixin), class_name
    assert _readme_families() == library
    modules = sorted(p.stem for p in (ROOT / "pipelines" / "family_specs").glob("*.py") if not p.stem.startswith("_"))
    assert modules == sorted(library), "a family module that is not in FAMILIES, or one missing"
