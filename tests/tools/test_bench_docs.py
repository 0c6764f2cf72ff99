"""CPU tests that keep the benchmark page honest.

docs/benchmarks.md names only result files that exist in bench_results/, and names them in full;
bench_results/README.md indexes every result file (and no file that is not there); every results
section names its files or says it is not measured yet; the page stays short.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "benchmarks.md"
RESULTS = ROOT / "bench_results"
INDEX = RESULTS / "README.md"
MAX_PAGE_LINES = 270  # 260 until the speed stack's section (issue 47)

# A result file's stem, e.g. bench_step_2026-11-29_171859_gpu0, optionally followed by `.json` or `.{json,md}`.
RESULT_NAME = re.compile(
    r"(?P<stem>(?:bench_(?:step|shapes|stack|offload)|cache_dit_bench|capture_failures|failed_capture_probe|soak|step_bench|capture_profile|capture_check_cost|pipeline_zoo_probe|zoo_probe|zoo_bench|compile_cache|serve_load|first_step_probe|batching|planting|batch_position|compile_order|shared_transformer)_\d{4}-\d{2}-\d{2}_\d{6}(?:_[a-z]+\d*)?)"
    r"(?:\.\{(?P<exts>[a-z]+(?:,[a-z]+)*)\}|\.(?P<ext>jsonl|json|md|png))?"
)
# A short form such as `_180341` or `_0903*`, which names no file that a test can check.
SHORT_NAME = re.compile(r"`_\d{4,6}")


def named_files(text: str) -> dict[str, set[str]]:
    """Each result stem named in ``text`` -> the extensions named with it (empty: the stem alone)."""
    names: dict[str, set[str]] = {}
    for match in RESULT_NAME.finditer(text):
        exts = names.setdefault(match["stem"], set())
        if match["exts"]:
            exts.update(match["exts"].split(","))
        elif match["ext"]:
            exts.add(match["ext"])
    return names


def result_files() -> set[str]:
    """The result files in bench_results/ (everything but the index)."""
    return {p.name for p in RESULTS.iterdir() if p.is_file() and p.name != INDEX.name}


def test_named_files_parses_every_form():
    text = ("`bench_step_2026-11-29_172832` and `bench_step_2026-11-29_171859_gpu0.{json,md}` and "
            "bench_shapes_2026-11-29_164028.json, not `bench_step_<date>_<time>.json`")
    assert named_files(text) == {
        "bench_step_2026-11-29_172832": set(),
        "bench_step_2026-11-29_171859_gpu0": {"json", "md"},
        "bench_shapes_2026-11-29_164028": {"json"},
    }
    assert SHORT_NAME.search("in `_180341` (warm caches)")
    assert not SHORT_NAME.search("`bench_step_2026-11-29_180341`")


def test_page_names_only_result_files_that_exist():
    names = named_files(PAGE.read_text())
    assert names, "docs/benchmarks.md names no result file"
    files = result_files()
    stems = {name.rsplit(".", 1)[0] for name in files}
    missing = sorted(stem for stem in names if stem not in stems)
    assert not missing, f"docs/benchmarks.md names result files that bench_results/ lacks: {missing}"
    missing_ext = sorted(f"{stem}.{ext}" for stem, exts in names.items() for ext in exts
                         if f"{stem}.{ext}" not in files)
    assert not missing_ext, f"docs/benchmarks.md names files that bench_results/ lacks: {missing_ext}"


def test_page_names_result_files_in_full():
    shorts = sorted({m.group(0) for m in SHORT_NAME.finditer(PAGE.read_text())})
    assert not shorts, f"docs/benchmarks.md abbreviates result file names (write them in full): {shorts}"


def test_index_lists_every_result_file_and_only_those():
    listed = {f"{stem}.{ext}" for stem, exts in named_files(INDEX.read_text()).items() for ext in exts}
    files = result_files()
    assert files, "bench_results/ holds no result file"
    unlisted = sorted(files - listed)
    assert not unlisted, f"bench_results/README.md does not list (as STEM.{{json,md,...}}): {unlisted}"
    absent = sorted(listed - files)
    assert not absent, f"bench_results/README.md lists files that are not in bench_results/: {absent}"


def test_every_results_section_names_its_files_or_says_not_measured():
    text = PAGE.read_text()
    assert "\n## Results\n" in text, "docs/benchmarks.md has no '## Results' section"
    results = text.split("\n## Results\n", 1)[1].split("\n## ", 1)[0]
    sections = re.split(r"\n### ", results)[1:]
    assert len(sections) >= 6, f"expected one section per question, found {len(sections)}"
    for section in sections:
        title = section.splitlines()[0]
        assert named_files(section) or re.search(r"not measured", section, re.I), (
            f"results section '{title}' names no result file and does not say it is not measured")


def test_page_stays_short():
    lines = len(PAGE.read_text().splitlines())
    assert lines < MAX_PAGE_LINES, f"docs/benchmarks.md has {lines} lines; keep it under {MAX_PAGE_LINES}"
