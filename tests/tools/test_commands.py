"""The console commands of pyproject.toml as installed (``pip install -e .``): each answers ``--help`` from
outside the checkout, and the commands whose extra is missing still answer ``--help`` and say how to install it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def test_the_four_commands_are_declared():
    assert {"bcg-generate", "bcg-serve", "bcg-load", "bcg-bench"} <= set(COMMANDS)


def test_every_installed_command_answers_help(tmp_path):
    """All at once (each imports torch and diffusers: seconds), from a folder outside the checkout."""
    bin_dir = Path(sys.executable).parent  # the virtual environment's scripts folder
    executables = {command: shutil.which(command, path=str(bin_dir)) for command in sorted(COMMANDS)}
    missing = [command for command, path in executables.items() if path is None]
    assert not missing, (f"{', '.join(missing)} not installed in {bin_dir}: install this checkout with "
                         "pip install -e . (pyproject.toml [project.scripts])")
    running = {command: subprocess.Popen([path, "--help"], cwd=tmp_path, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True)
               for command, path in executables.items()}
    for command, process in running.items():
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, f"{command} --help: exit {process.returncode}\n{err[-3000:]}"
        assert out.startswith("usage: "), f"{command} --help: {out[:500]}"


def test_serve_and_load_answer_help_without_the_serve_extra(tmp_path):
    """Without fastapi, uvicorn, pydantic or httpx the two commands still parse their options, and a real run
    exits 2 naming the extra."""
    code = textwrap.dedent("""
        import importlib.abc, sys

        class NoServeExtra(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("fastapi", "uvicorn", "starlette", "pydantic", "httpx"):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None

        sys.meta_path.insert(0, NoServeExtra())
        from bcg_diffusion.serving import serve_command
        from bcg_diffusion.serving.load import command as load_test

        assert not {"fastapi", "httpx", "uvicorn"} & set(sys.modules)
        for main in (load_test.main, serve_command.main):
            try:
                assert main(["--help"]) == 0
            except SystemExit as exc:
                assert exc.code == 0
        assert load_test.main(["--url", "http://127.0.0.1:1"]) == 2
        assert serve_command.main([]) == 2
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr.count('pip install -e ".[serve]"') == 2, out.stderr[-3000:]
