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
