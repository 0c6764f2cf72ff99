"""Shared test set-up.

- The ``gpu`` marker skips with a reason where no CUDA device is present (the only skip for missing
  hardware besides tests that need two GPUs).
- ``BCG_DIFFUSION_TEST_SABOTAGE`` (docs/testing.md) breaks every replay of the session on purpose: the
  sabotage of ``tests/_sabotage.py`` is installed here, and, through ``tests/sabotage_site`` on their
  ``PYTHONPATH``, in the processes the tests start. ``survives_sabotage(*modes, reason=...)`` marks a GPU
  test that is expected to pass under those modes, with why; the marker is copied into the test's
  ``user_properties``, and ``--sabotage-results PATH`` writes every outcome with it for
  ``tests/sabotage_report.py``.
- Attention patches are released after every test, in one place (:func:`release_attention_patches`).
- ``--cpu-times PATH`` records what each test costs (``tests/_cpu_times.py``).
- Fixtures: ``pretend_cuda`` (the library believes CUDA is there), ``hide_cuda`` (it sees none), ``fake_torchao``,
  ``no_build`` (building or loading a pipeline fails the test).
"""

import json
import os
from pathlib import Path

# Inductor picks some kernel configurations by timing them on the GPU, so two compilations of one
# block can differ in their last bits; the compile tests compare compiled runs bitwise. Set before
# torch is imported (Inductor reads it once); subprocesses (servers, torchrun workers) inherit it.
os.environ.setdefault("TORCHINDUCTOR_DETERMINISTIC", "1")
# One CPU thread per process: the tests run tiny models, where a second thread buys nothing, and OpenMP's
# waiting threads spin: with two pytest workers (or a server the test started) on two cores, two threads per
# process made the CPU tests take four times the CPU time (docs/testing.md). Set before torch is imported (the
# OpenMP runtime reads it once); the processes the tests start inherit it. An explicit value wins.
for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ["OMP_NUM_THREADS"].isdigit():  # also where torch was imported before this file
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
if not torch.cuda.is_available():
    # Without CUDA, Inductor compiles C++ only: a pool of compile workers (fresh processes that import
    # torch) costs more than it saves on the tests' tiny graphs. Set before Inductor's config is imported
    # (bcg_diffusion imports it, below); the processes the tests start inherit it.
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import _sabotage  # noqa: E402
from _cpu_times import CpuTimes  # noqa: E402
from bcg_diffusion.core.handles import live_handles  # noqa: E402

SABOTAGE_PROPERTY = "survives_sabotage"
_results_path = None  # --sabotage-results: where this process appends test outcomes (None: nowhere)


def pytest_addoption(parser):
    parser.addoption(
        "--sabotage-results", default=None, metavar="PATH",
        help="append one JSON line per test phase (node id, phase, outcome, survives_sabotage) to PATH; "
             "written by the main process, also under xdist (tests/sabotage_report.py reads it)",
    )
    parser.addoption(
        "--cpu-times", default=None, metavar="PATH",
        help="append one JSON line per test (wall time, CPU time here and in the processes it started) to PATH; "
             "python tests/_cpu_times.py PATH sums them per file (docs/testing.md)",
    )


def pytest_configure(config):
    global _results_path
    if config.getoption("--cpu-times"):
        config.pluginmanager.register(CpuTimes(config.getoption("--cpu-times")), "bcg_cpu_times")
    if config.getoption("--sabotage-results") and not hasattr(config, "workerinput"):  # not in an xdist worker
        _results_path = config.getoption("--sabotage-results")
    try:
        mode = _sabotage.mode_from_environment()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if mode is not None:
        _sabotage.install_for_session(mode)
        site = str(Path(__file__).resolve().parent / "sabotage_site")  # started processes sabotage themselves
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH")) if p)


def pytest_runtest_logreport(report):
    if _results_path is None:
        return
    survives = dict(report.user_properties).get(SABOTAGE_PROPERTY)
    line = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
            "duration": round(report.duration, 3), "survives": json.loads(survives) if survives else {},
            "message": str(report.longrepr).splitlines()[-1][:300] if report.failed and report.longrepr else None}
    with open(_results_path, "a") as f:  # one line per phase, flushed: a run stopped midway keeps what finished
        f.write(json.dumps(line) + "\n")


def pytest_collection_modifyitems(config, items):
    for item in items:
        marks = list(item.iter_markers("survives_sabotage"))
        if marks:
            survives = {}
            for mark in reversed(marks):  # the closest mark (the test's own) wins over the module's
                for mode in mark.args:
                    survives[mode] = mark.kwargs["reason"]
            item.user_properties.append((SABOTAGE_PROPERTY, json.dumps(survives, sort_keys=True)))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; run `pytest -m gpu` on a machine with a GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def release_attention_patches():
    """Undo every attention patch still installed (a failed test must not leave patches behind for
    the next one: they would change every later eager call)."""
    for handle in live_handles():
        handle.remove()


@pytest.fixture(autouse=True)
def _no_leftover_attention_patches():
    yield
    release_attention_patches()


@pytest.fixture
def pretend_cuda(monkeypatch):
    """The library believes a CUDA device is there (``torch.cuda.is_available()`` is True) and the
    ``BCG_DIFFUSION`` switch is unset; attention patches are released after the test."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("BCG_DIFFUSION", raising=False)
    yield
    release_attention_patches()


@pytest.fixture
def hide_cuda(monkeypatch):
    """The code under test sees no CUDA device (``torch.cuda.is_available()`` is False; subprocesses
    get ``CUDA_VISIBLE_DEVICES=""``): tests of the no-CUDA paths run on a GPU machine too, instead of
    skipping there."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture
def fake_torchao(monkeypatch):
    """torchao's four configs (keeping their keyword arguments) and a ``quantize_`` that records
    ``(module, config class name, config.set_inductor_config)`` instead of quantizing; yields that list.
    Patches the installed torchao (a test dependency; libraries look it up by its spec)."""
    import torchao.quantization as quantization

    def init(config, **kwargs):
        config.__dict__.update(kwargs)

    calls = []
    for name in ("Float8DynamicActivationFloat8WeightConfig", "Float8WeightOnlyConfig", "Int8WeightOnlyConfig",
                 "Int8DynamicActivationInt8WeightConfig"):
        monkeypatch.setattr(quantization, name, type(name, (), {"__init__": init}))
    monkeypatch.setattr(quantization, "quantize_", lambda module, config: calls.append(
        (module, type(config).__name__, getattr(config, "set_inductor_config", True))))
    yield calls


@pytest.fixture
def no_build(monkeypatch):
    """Building or loading a pipeline fails the test: the checks must come before any work."""
    import bcg_pipelines as pipelines

    def refuse(*args, **kwargs):
        raise AssertionError("a pipeline was built")

    monkeypatch.setattr(pipelines, "build_pipeline", refuse)
    monkeypatch.setattr(pipelines, "load_pipeline", refuse)
