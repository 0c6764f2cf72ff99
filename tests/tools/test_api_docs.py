"""docs/api.md lists every public name of bcg_diffusion and bcg_diffusion.core, and nothing else."""

import re
from pathlib import Path

import bcg_diffusion
import bcg_diffusion.core

PAGE = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def _section(text: str, title: str) -> str:
    start = text.index(f"## `{title}`")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def _listed(section: str) -> set[str]:
    names = set()
    for cell in re.findall(r"^\| ([^|]+) \|", section, flags=re.M):
        names.update(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)", cell))
    names.update(re.findall(r"^`(__version__)`", section, flags=re.M))
    return names - {"name"}


def test_every_public_name_is_documented_and_nothing_else():
    text = PAGE.read_text()
    for module, title in ((bcg_diffusion, "bcg_diffusion"), (bcg_diffusion.core, "bcg_diffusion.core")):
        listed = _listed(_section(text, title))
        public = set(module.__all__)
        assert public <= listed, f"docs/api.md does not list {sorted(public - listed)} of {title}"
        extra = {n for n in listed - public if not hasattr(module, n)}
        assert not extra, f"docs/api.md lists names {title} does not have: {sorted(extra)}"
