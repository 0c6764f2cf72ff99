"""What must agree across the project: dependencies against imports, and the one list of families."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

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
        "import bcg_diffusion, pipelines\n"
        "assert not any(m == 'cuda' or m.startswith('cuda.') for m in sys.modules), "
        "sorted(m for m in sys.modules if m.startswith('cuda'))\n"
        "print(len(bcg_diffusion.__all__))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
