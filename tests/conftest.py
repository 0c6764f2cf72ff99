"""Shared test set-up: the ``gpu`` marker skips with a reason where no CUDA device is present."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; run `pytest -m gpu` on a machine with a GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_leftover_attention_patches():
    """A failed test must not leave attention patches behind for the next one (they would change every
    later eager call)."""
    yield
    from bcg_diffusion import attention_breaks

    for key in list(attention_breaks._patches):
        attention_breaks._patches[key].refcount = 1
        attention_breaks._release(key)
