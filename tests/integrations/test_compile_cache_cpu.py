"""bcg_diffusion.use_compile_cache: folder per environment, warm restarts, foreign artifacts ignored."""

import json
import os
import subprocess
import sys

import pytest
import torch

import bcg_diffusion
from bcg_diffusion import compile_cache


@pytest.fixture(autouse=True)
def _restore_inductor_folder(monkeypatch, tmp_path):
    # use_compile_cache sets TORCHINDUCTOR_CACHE_DIR for the process: put it back after each test
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "default_inductor"))


_COMPILE_AND_SAVE = (
    "import sys, torch, bcg_diffusion\n"
    "c = bcg_diffusion.use_compile_cache(sys.argv[1])\n"
    "f = torch.compile(lambda x: torch.cos(x) + 3, dynamic=False)\n"
    "assert torch.allclose(f(torch.ones(4)), torch.cos(torch.ones(4)) + 3)\n"
    "c.save(); print(c.status.split(':')[0])\n"
)


def test_cold_then_warm_here_and_in_a_second_process(tmp_path):
    """A cold folder compiles and saves; this process and a fresh interpreter with the same folder then
    find the artifacts. One compilation in all (Inductor's C++ build is the cost of this file): the
    first process is this one, the second a real one."""
    cache = bcg_diffusion.use_compile_cache(tmp_path / "cc")
    assert cache.status.startswith("cold:") and not cache.loaded
    tag = compile_cache.environment_tag(compile_cache.environment())
    assert cache.folder == (tmp_path / "cc" / tag).resolve()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(cache.folder)
    compiled = torch.compile(lambda x: torch.cos(x) + 3, dynamic=False)  # the function the second process compiles
    assert torch.allclose(compiled(torch.ones(4)), torch.cos(torch.ones(4)) + 3)
    path = cache.save()
    assert path is not None and path.stat().st_size > 0
    again = bcg_diffusion.use_compile_cache(tmp_path / "cc")
    assert again.status.startswith("warm:") and again.loaded
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "default_inductor"))
    second = subprocess.run([sys.executable, "-c", _COMPILE_AND_SAVE, str(tmp_path / "cc")], capture_output=True,
                            text=True, timeout=300, env=env)
    assert second.returncode == 0, second.stderr[-2000:]
    assert second.stdout.split()[-1] == "warm"


def test_artifacts_of_another_environment_are_ignored_with_the_reason(tmp_path):
    root = tmp_path / "cc"
    foreign = root / "torch-2.9.0-triton-3.4.0-cuda-12.8-NVIDIA-A100-sm80"
    foreign.mkdir(parents=True)
    (foreign / compile_cache.MANIFEST).write_text(json.dumps({"torch": "2.9.0"}))
    (foreign / compile_cache.ARTIFACTS).write_bytes(b"not for this process")
    cache = bcg_diffusion.use_compile_cache(root)
    assert cache.status.startswith("cold:")
    assert "ignored artifacts made for another environment" in cache.status
    assert foreign.name in cache.status and "never loaded" in cache.status
    assert (foreign / compile_cache.ARTIFACTS).read_bytes() == b"not for this process"  # left alone


def test_a_copied_folder_whose_manifest_disagrees_is_never_loaded(tmp_path):
    root = tmp_path / "cc"
    tag = compile_cache.environment_tag(compile_cache.environment())
    folder = root / tag
    folder.mkdir(parents=True)
    env = dict(compile_cache.environment(), gpu="NVIDIA B200 sm100")
    (folder / compile_cache.MANIFEST).write_text(json.dumps(env))
    (folder / compile_cache.ARTIFACTS).write_bytes(b"stale")
    cache = bcg_diffusion.use_compile_cache(root)
    assert not cache.loaded and cache.status.startswith("cold:")
    assert "written for gpu 'NVIDIA B200 sm100'" in cache.status and f"{tag}.stale" in cache.status
    assert not (folder / compile_cache.ARTIFACTS).exists()


def test_a_file_is_not_a_cache_folder(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(ValueError, match="is not a folder"):
        bcg_diffusion.use_compile_cache(path)


def test_a_damaged_artifact_file_recompiles_with_a_warning(tmp_path, caplog):
    tag = compile_cache.environment_tag(compile_cache.environment())
    folder = tmp_path / "cc" / tag
    folder.mkdir(parents=True)
    (folder / compile_cache.ARTIFACTS).write_bytes(b"garbage")
    with caplog.at_level("WARNING", logger="bcg_diffusion"):
        cache = bcg_diffusion.use_compile_cache(tmp_path / "cc")
    assert not cache.loaded
    assert "could not be loaded" in caplog.text
