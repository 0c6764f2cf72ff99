"""One truth per fact in README.md and docs/ (issue 39, point 9): every cross-reference resolves, and the figures the
pages quote equal the committed results they cite.

Cross-references: relative links and their anchors (GitHub's heading slugs), section titles cited in quotes after a
page (``docs/accelerate.md "cache-dit"``), repository paths named in code spans, and every ``NAME.md`` a page names.
Figures: the result tables of docs/benchmarks.md, docs/serving.md and the derived ranges under them are rebuilt from
``bench_results/`` and compared cell by cell; README.md quotes no measurement (it links to the page that owns it).
:func:`test_counts` prints the counts (``-s``): references checked and dangling, figures checked and contradicting.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench_results"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), RESULTS / "README.md"]
#: Top-level entries of the repository a path in a code span may start with.
REPO_DIRS = ("bcg_diffusion/", "pipelines/", "scripts/", "tests/", "docs/", "bench_results/", ".ci/")


# -- reading pages -------------------------------------------------------------------------------------------------
def prose(page: Path) -> str:
    """The page without its fenced code blocks (their content is checked by test_docs_snippets)."""
    return re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)


def slug(title: str) -> str:
    """GitHub's anchor of a heading: lower case, code marks and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", title.replace("`", "").strip().lower())
    return text.replace(" ", "-")


@cache
def headings(page: Path) -> list[str]:
    return [m[1].strip() for m in re.finditer(r"^#{1,6} (.+)$", prose(page), flags=re.M)]


@cache
def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for title in headings(page):
        base = slug(title)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def table(page: Path, heading: str) -> list[list[str]]:
    """The rows (cells, stripped) of the first table under ``heading`` (a heading's text)."""
    text = prose(page)
    start = re.search(rf"^#+ {re.escape(heading)}$", text, flags=re.M)
    assert start, f"{page.name}: no heading {heading!r}"
    rows = []
    for line in text[start.end():].splitlines():
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    return [r for r in rows[2:]]  # without the header and the |---| line


# -- cross-references -------------------------------------------------------------------------------------------------
def references(page: Path) -> list[tuple[str, str | None]]:
    """``(what, problem or None)`` for every cross-reference of a page."""
    text, found = prose(page), []
    for target in re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # a URL: nothing here reaches the network
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        problem = None
        if not dest.exists():
            problem = f"link to {path}: no such file"
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            problem = f"link to {target}: no heading with that anchor in {dest.name}"
        found.append((f"link {target}", problem))
    for name, title in re.findall(r"([\w./-]+\.md)\)?,? \"([^\"]+)\"", text):
        dest = next((p for p in (page.parent / name, ROOT / name) if p.exists()), None)
        titles = [h.replace("`", "") for h in headings(dest)] if dest else []
        problem = None if any(t == title or t.startswith(title + " (") for t in titles) else \
            f"{name} \"{title}\": no such section"
        found.append((f"section {name} \"{title}\"", problem))
    for span in re.findall(r"`([^`\s]+)`", text):
        span = span.rstrip(".,:;)")
        if not span.startswith(REPO_DIRS) or re.search(r"[<>*{}$\[]|\.\.\.", span):
            continue
        path = span.split("::")[0]
        found.append((f"path {path}", None if (ROOT / path).exists() else f"`{path}`: no such file or folder"))
    for name in sorted(set(re.findall(r"(?<![\w/.-])([A-Za-z][\w-]*\.md)\b", text))):
        exists = any((folder / name).exists() for folder in (page.parent, ROOT, ROOT / "docs", RESULTS))
        found.append((f"page {name}", None if exists else f"{name}: no such page in the repository"))
    return found


def dangling() -> list[str]:
    return [f"{page.relative_to(ROOT)}: {problem}" for page in PAGES for _, problem in references(page) if problem]


def test_every_cross_reference_resolves():
    assert not dangling(), "\n".join(dangling())


def test_the_reference_reader_finds_what_dangles(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n\n## Some section (`x`)\n")
    page.write_text('# Page\n\nSee [x](other.md#some-section-x), [y](other.md#nope), [z](missing.md), the '
                    'DESIGN.md section 6, other.md "Some section", other.md "No section", `docs/no_such.md` and '
                    '`tests/tools/test_docs_facts.py`.\n\n```text\n[w](ignored.md)\n```\n')
    problems = [p for _, p in references(page) if p]
    assert problems == ["link to other.md#nope: no heading with that anchor in other.md",
                        "link to missing.md: no such file", 'other.md "No section": no such section',
                        "`docs/no_such.md`: no such file or folder", "DESIGN.md: no such page in the repository",
                        "missing.md: no such page in the repository"], problems
    assert slug("Sizes: what the transformer ran, and resolution binning") == \
        "sizes-what-the-transformer-ran-and-resolution-binning"
    assert slug("Step caches (`--cache`)") == "step-caches---cache"


# -- figures against the results they cite ------------------------------------------------------------------------------
@cache
def result(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


def cases(name: str) -> dict[str, dict]:
    return {c["case"]: c for c in result(name)["cases"]}


def f(value, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def speedup(name: str, case: str, mode: str = "bcg") -> str:
    c = cases(name).get(case)
    return "-" if c is None else f(c["modes"][mode]["speedup_vs_eager"], 2)


#: docs/benchmarks.md, "BCG against the whole-step graph and eager": row label -> case of the runs it cites.
MAIN_TABLE = {
    "PixArt-Sigma 512 px (batch 2, CFG)": "pixart:full:512x512:b1", "PixArt-Sigma 1024 px": "pixart:full:1024x1024:b1",
    "SD3.5-medium 512 px (batch 2)": "sd3:full:512x512:b1", "SD3.5-medium 1024 px": "sd3:full:1024x1024:b1",
    "Sana 1.6B 512 px": "sana:full:512x512:b1", "Sana 1.6B 1024 px batch 4": "sana:full:1024x1024:b4",
    "Qwen-Image 512 px": "qwenimage:full:512x512:b1", "Qwen-Image 1024 px": "qwenimage:full:1024x1024:b1",
    "Flux.1-dev 512 px": "flux:full:512x512:b1", "Flux.1-dev 1024 px": "flux:full:1024x1024:b1",
    "Wan 2.1, 2x30x52 latents": "wan:full:240x416:f5:b1", "Wan 2.1, 21x60x104 latents": "wan:full:480x832:f81:b1",
}
MAIN_RUN, RUN_A, RUN_B = "bench_step_2026-11-29_172832", "bench_step_2026-11-29_095549", "bench_step_2026-11-29_162627"
LAUNCH_BOUND = ("512x512", "240x416")


def main_table_row(case: str) -> list[str]:
    c = cases(MAIN_RUN)[case]
    m, prof = c["modes"], c["modes"]["eager"]["profile"]
    return [f(prof["kernels"], 0), f(prof["gpu_busy_ms"], 1), f(m["whole_graph"]["median_ms"], 2),
            f(m["bcg"]["median_ms"], 2), f(c["ratios"]["bcg/whole_graph"], 2), f(c["ratios"]["bcg_break/whole_graph"], 2),
            " / ".join(speedup(run, case) for run in (RUN_A, RUN_B, MAIN_RUN))]


#: docs/benchmarks.md, "Quantized: ...": row label -> case of ``FP8_RUN``.
FP8_TABLE = {"Flux.1-dev 512 px": "flux:full:512x512:b1@fp8", "Flux.1-dev 1024 px": "flux:full:1024x1024:b1@fp8",
             "PixArt-Sigma 512 px": "pixart:full:512x512:b1@fp8", "Wan 2.1, 2x30x52 latents": "wan:full:240x416:f5:b1@fp8"}
FP8_RUN = "bench_step_2026-11-29_180837"


def fp8_table_row(case: str) -> list[str]:
    c = cases(FP8_RUN)[case]
    m = c["modes"]
    ms = [f(m[k]["median_ms"], 2) for k in ("eager", "bcg", "whole_graph")]
    compiled = [f(m[k]["median_ms"], 2) for k in ("compile", "compile_bcg", "reduce_overhead")]
    return [f(m["eager"]["profile"]["kernels"], 0), *ms, f(c["ratios"]["bcg/whole_graph"], 2), *compiled,
            f(c["ratios"]["compile_bcg/reduce_overhead"], 2),
            f"{f(m['compile_bcg']['setup_s'], 1)} / {f(m['reduce_overhead']['setup_s'], 1)}"]


#: docs/benchmarks.md, "New transformers at full size": row label start -> case; brackets: the other process.
ZOO_TABLE = {"LTX-2 19B": "ltx2", "HunyuanVideo 1.5 8.3B": "hunyuanvideo15", "HiDream-I1 17B": "hidream"}
ZOO_RUN = "zoo_bench_2026-12-01_143531"
ZOO_OTHER = {"ltx2": "zoo_bench_2026-12-01_142104", "hunyuanvideo15": "zoo_bench_2026-12-01_142104",
             "hidream": "zoo_bench_2026-12-01_142313"}


def zoo_row(case: str) -> list[str]:
    def row(name):
        return next(r for r in result(name)["results"] if r["case"] == case)

    r, o = row(ZOO_RUN), row(ZOO_OTHER[case])
    whole = r["whole_graph"].get("median_ms")
    return [f"{f(r['eager']['median_ms'], 1)} ({f(o['eager']['median_ms'], 1)})",
            f"{f(r['eager']['busy_fraction'], 2)} ({f(r['eager']['limit_speedup'], 2)}x)",
            f"{f(r['bcg']['median_ms'], 1)} ({f(o['bcg']['median_ms'], 1)})",
            f"{f(r['speedup']['bcg'], 2)} ({f(o['speedup']['bcg'], 2)})",
            f"{f(whole, 1)} ms" if whole is not None else "not capturable",
            r["bcg"]["segments"], r["bcg"]["breaks"]]


def serving_rows(family: str) -> list[list[str]]:
    run = result(f"serve_load_2026-12-01_142500_{family}")
    out = []
    for server in run["servers"]:
        lat, pipe = server["latency_s"], server["pipeline_s"]
        p50, p99 = f(lat["p50"], 3), f(lat["p99"], 3)
        if server["label"] == "bcg":
            ratios = run["latency_ratio"]["ratios"]
            p50, p99 = f"{p50} (**{f(ratios['p50'], 2)}x**)", f"{p99} (**{f(ratios['p99'], 2)}x**)"
        out.append([server["label"], f"{server['ok']}/{server['requests']}", p50, f(lat["p95"], 3), p99,
                    f(pipe["p50"], 3), f(server["throughput_rps"], 2)])
    return out


#: docs/serving.md, "Batching measured on the H200": the run it cites, and its family labels.
BATCHING_RUN = "batching_2026-12-02_153747"
BATCHING_FAMILIES = {"pixart": "PixArt-Sigma", "flux": "Flux.1-dev"}


def batching_rows() -> list[list[str]]:
    out = []
    for family in result(BATCHING_RUN)["results"]:
        for role, s in family["summaries"].items():
            b = s["batching"]
            out.append([BATCHING_FAMILIES[family["family"]], role, f"{s['ok']}/{s['requests']}",
                        f(s["throughput_rps"], 2), f(s["latency_s"]["p50"], 3), f(s["latency_s"]["p99"], 3),
                        "-" if b is None else str(b["batches"]),
                        "-" if b is None else ", ".join(f"{k}: {v}" for k, v in b["requests_per_batch"].items())])
    return out


def compare(where: str, quoted: list[str], expected: list[str]) -> list[str]:
    return [f"{where}, cell {i + 1}: the page says {q!r}, the results give {e!r}"
            for i, (q, e) in enumerate(zip(quoted, expected)) if q.replace("**", "") != e.replace("**", "")]


def figure_checks() -> tuple[int, list[str]]:
    """``(figures compared, contradictions)`` over the result tables and the ranges derived from them."""
    bench, serving = ROOT / "docs" / "benchmarks.md", ROOT / "docs" / "serving.md"
    count, problems = 0, []

    def check(where, quoted, expected):
        nonlocal count
        count += sum(len(re.findall(r"\d+(?:[.,]\d+)*", e)) for e in expected)
        problems.extend(compare(where, quoted, expected))

    rows = {r[0]: r for r in table(bench, "BCG against the whole-step graph and eager")}
    assert set(rows) == set(MAIN_TABLE), sorted(set(rows) ^ set(MAIN_TABLE))
    for label, case in MAIN_TABLE.items():
        check(f"benchmarks.md main table, {label}", rows[label][1:], main_table_row(case))
    rows = {r[0]: r for r in table(bench, "Quantized: torchao float8 (dynamic activations, float8 weights)")}
    for label, case in FP8_TABLE.items():
        check(f"benchmarks.md fp8 table, {label}", rows[label][1:], fp8_table_row(case))
    rows = table(bench, "New transformers at full size (per call)")
    for start, case in ZOO_TABLE.items():
        row = next(r for r in rows if r[0].startswith(start))
        quoted = [*row[1:6], *row[6].split(" / ")[1:]]  # keys / segments / breaks: the last two
        check(f"benchmarks.md zoo table, {start}", quoted, zoo_row(case))
    rows = table(serving, "Measured")
    for family, first in (("pixart", 0), ("flux", 2)):
        for row, expected in zip(rows[first:first + 2], serving_rows(family)):
            check(f"serving.md load table, {family} {row[1]}", [row[1], *row[2:8]], expected)
    rows, expected = table(serving, "Batching measured on the H200"), batching_rows()
    assert len(rows) == len(expected), (rows, expected)
    for row, want in zip(rows, expected):
        check(f"serving.md batching table, {row[0]} {row[1]}", row, want)
    # the ranges stated under the main table
    text = " ".join(prose(bench).split())
    launch, compute = [], []
    for case in MAIN_TABLE.values():
        values = [float(v) for v in main_table_row(case)[-1].split(" / ") if v != "-"]
        (launch if any(s in case for s in LAUNCH_BOUND) else compute).extend(values)
    stated = (f"**Speed-up over eager per step**: {min(launch):.1f}-{max(launch):.1f}x on the launch-bound shapes, by "
              f"model and host; {min(compute):.2f}-{max(compute):.2f}x on the compute-bound ones.")
    count += 4
    if stated not in text:
        problems.append(f"benchmarks.md: the speed-up ranges do not read {stated!r}")
    return count, problems


def test_figures_equal_the_results_they_cite():
    _, problems = figure_checks()
    assert not problems, "\n".join(problems)


#: A measurement as the README would quote it: a speed-up, a time or a percentage.
MEASUREMENT = re.compile(r"\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?(?:x\b| ?ms\b| s\b| ?%)")


def test_the_readme_quotes_no_measurement_and_links_to_the_pages_that_own_them():
    found = MEASUREMENT.findall(prose(ROOT / "README.md"))
    assert not found, f"README.md quotes {found}: state it on the page that owns it and link there"
    readme = prose(ROOT / "README.md")
    for target in ("docs/benchmarks.md#results", "docs/serving.md#measured", "docs/multi-gpu.md#what-was-verified-where",
                   "docs/accelerate.md#verified-transformer-classes", "docs/accelerate.md#what-a-capture-costs"):
        assert f"]({target})" in readme, target


def test_the_cache_context_claim_matches_diffusers():
    import inspect

    import bcg_pipelines as pipelines

    text = " ".join(prose(ROOT / "docs" / "accelerate.md").split())
    match = re.search(r"which the pipelines of ([a-z0-9, ]+?) open", text)
    assert match, "docs/accelerate.md names the pipelines that open a cache_context"
    stated = set(re.split(r", | and ", match[1]))
    opening = {name for name in pipelines.list_families()
               if "cache_context(" in inspect.getsource(pipelines.get_family(name).pipeline_class.__call__)}
    assert stated == opening, (sorted(stated), sorted(opening))


def test_counts(capsys):
    refs = sum(len(references(page)) for page in PAGES)
    figures, contradictions = figure_checks()
    with capsys.disabled():
        print(f"\ndocs facts: {refs} cross-references checked, {len(dangling())} dangling; {figures} figures "
              f"checked, {len(contradictions)} contradicting")
    assert refs > 100 and figures > 150
