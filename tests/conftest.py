"""Shared test set-up: the ``gpu`` marker skips with a reason where no CUDA device is present."""

import pytest
import torch

from bcg_diffusion.core.handles import live_handles


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; run `pytest -m gpu` on a machine with a GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_leftover_patches():
    """A failed test must not leave process-wide patches behind for the next one (attention breaks
    would change every later eager call): every handle still live after a test is removed."""
    yield
    for handle in live_handles():
        handle.remove()


@pytest.fixture
def fake_torchao(monkeypatch):
    """torchao's four configs (keeping their keyword arguments) and a ``quantize_`` that records
    ``(module, config class name, config.set_inductor_config)`` instead of quantizing; yields that list.
    Patches the installed torchao where there is one (libraries look it up by its spec), else stands in
    for the package."""
    import sys
    import types

    def init(config, **kwargs):
        config.__dict__.update(kwargs)

    calls = []
    try:
        import torchao.quantization as quantization
    except ImportError:
        quantization = types.ModuleType("torchao.quantization")
        package = types.ModuleType("torchao")
        package.quantization = quantization
        monkeypatch.setitem(sys.modules, "torchao", package)
        monkeypatch.setitem(sys.modules, "torchao.quantization", quantization)
    for name in ("Float8DynamicActivationFloat8WeightConfig", "Float8WeightOnlyConfig", "Int8WeightOnlyConfig",
                 "Int8DynamicActivationInt8WeightConfig"):
        monkeypatch.setattr(quantization, name, type(name, (), {"__init__": init}), raising=False)
    monkeypatch.setattr(quantization, "quantize_", lambda module, config: calls.append(
        (module, type(config).__name__, getattr(config, "set_inductor_config", True))), raising=False)
    yield calls
