"""Fault rules in the processes a test starts where no launcher reaches: Ray Serve's replicas, which build their
servers in processes of Ray's own (test-only).

``tests/_faults.py`` puts this folder on the ``PYTHONPATH`` of such a server and sets ``BCG_DIFFUSION_TEST_FAULTS``
to its rules (``KIND:PROMPT``, comma-separated). Nothing is imported at start-up: once the server's fault seam
(``bcg_diffusion.serving.faults``) is imported, the rules are installed through it, as
``bcg_diffusion.serving.load.fault_server`` installs them in a single server. A ``sitecustomize`` further along the path
(``tests/sabotage_site``'s, in a sabotaged session) runs too.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

_SEAM = "bcg_diffusion.serving.faults"
_RULES = "BCG_DIFFUSION_TEST_FAULTS"
_HERE = Path(__file__).resolve().parent


class _AfterSeam(importlib.abc.MetaPathFinder):
    """Finds the fault seam as usual, and installs the rules right after it has run."""

    def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201 - the finder protocol
        if name != _SEAM:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):  # noqa: ANN001, ANN202
            run(module)
            from bcg_diffusion.serving.load.fault_rules import PromptFaults

            module.install_fault_hook(PromptFaults.from_texts(os.environ[_RULES].split(",")))

        spec.loader.exec_module = exec_module
        return spec


def _run_the_next_sitecustomize() -> None:
    for entry in sys.path:
        candidate = Path(entry or ".").resolve() / "sitecustomize.py"
        if candidate.is_file() and candidate.parent != _HERE:
            spec = importlib.util.spec_from_file_location("_next_sitecustomize", candidate)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


if os.environ.get(_RULES, "").strip():
    sys.meta_path.insert(0, _AfterSeam())
_run_the_next_sitecustomize()
