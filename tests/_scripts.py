"""The one loader of the tools and of other files by path, for the tests.

The tools are package modules (``bcg_diffusion.cli``, ``serving``, ``benchmarks``); ``scripts/*.py``
are thin launchers of them. :func:`load_script` maps a script's name to its module.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
MODULES = {
    "generate": "bcg_diffusion.cli.generate",
    "serve": "bcg_diffusion.serving.serve_command",
    "load": "bcg_diffusion.serving.load.command",
    "make_loras": "bcg_diffusion.serving.adapters.lora_maker",
    "bench_step": "bcg_diffusion.benchmarks.step.bench_step",
    "bench_shapes": "bcg_diffusion.benchmarks.shapes.bench_shapes",
    "bench_cache_dit": "bcg_diffusion.benchmarks.cache_dit.cache_dit_bench",
    "bench_stack": "bcg_diffusion.benchmarks.stack.stack_bench",
    "bench_offload": "bcg_diffusion.benchmarks.offload.bench_offload",
    "zoo_bench": "bcg_diffusion.benchmarks.zoo.zoo_bench",
    "zoo_probe": "bcg_diffusion.benchmarks.zoo.zoo_probe",
    "pipeline_zoo_probe": "bcg_diffusion.benchmarks.zoo.pipeline_probe",
    "capture_profile": "bcg_diffusion.benchmarks.profile.capture_profile",
    "compile_cache_check": "bcg_diffusion.benchmarks.profile.compile_cache_check",
    "smoke_full_pipelines": "bcg_diffusion.checks.smoke_full_pipelines",
}


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
    """The package module behind ``scripts/<name>.py``."""
    return importlib.import_module(MODULES[name])
