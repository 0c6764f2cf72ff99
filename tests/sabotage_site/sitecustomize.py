"""Sabotage in the Python processes a sabotaged test session starts (servers, torchrun workers).

``tests/conftest.py`` puts this folder on their ``PYTHONPATH`` when ``BCG_DIFFUSION_TEST_SABOTAGE``
is set. Nothing is imported at start-up: once the library's runner events
(``bcg_diffusion.integration.events``) are imported, ``tests/_sabotage.py`` is loaded from its file
and installs the session's sabotage, as the conftest does in the test session (docs/testing.md).
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

_EVENTS = "bcg_diffusion.integration.events"
_SABOTAGE_FILE = Path(__file__).resolve().parents[1] / "_sabotage.py"


def _install_sabotage() -> None:
    spec = importlib.util.spec_from_file_location("_sabotage", _SABOTAGE_FILE)
    sabotage = importlib.util.module_from_spec(spec)
    sys.modules["_sabotage"] = sabotage
    spec.loader.exec_module(sabotage)
    mode = sabotage.mode_from_environment()
    if mode is not None:
        sabotage.install_for_session(mode)


class _AfterEvents(importlib.abc.MetaPathFinder):
    """Finds the events module as usual, and installs the sabotage right after it has run."""

    def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201 - the finder protocol
        if name != _EVENTS:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):  # noqa: ANN001, ANN202
            run(module)
            if "_sabotage" not in sys.modules:  # a test session's conftest imports it and installs it itself
                _install_sabotage()

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("BCG_DIFFUSION_TEST_SABOTAGE", "").strip():
    sys.meta_path.insert(0, _AfterEvents())
