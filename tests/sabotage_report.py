"""Run the GPU tests against deliberately broken acceleration and report which tests notice.

For each mode (``normal``: the switch unset; then every ``BCG_DIFFUSION_TEST_SABOTAGE`` mode:
``fallback``, ``skip_segment``, ``stale_inputs``) this runs ``python -m pytest -m gpu`` on the tests
with the switch set, all modes at once by default (one GPU holds the four sessions of tiny models),
and writes a report (JSON and Markdown): per mode how many tests failed, and every *survivor* (a
test that passed under sabotage) with why it survives, taken from its ``survives_sabotage``
marker. A survivor without such a marker is UNEXPECTED: it claims a replay that it does not check.

    python tests/sabotage_report.py --out-dir DIR         # all four runs; report and logs in DIR
    python tests/sabotage_report.py --modes fallback -- -k accelerate   # one mode, some tests

Exit status: 0 when the normal run passed and no mode has an unexpected survivor; 1 otherwise; 2 for
bad arguments. Needs pytest-xdist and pytest-timeout (the ``test`` extra). See docs/testing.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from _sabotage import ENV_SABOTAGE, MODES

ROOT = Path(__file__).resolve().parents[1]

ALL_MODES = ("normal", *MODES)


@dataclass
class ModeRun:
    """One pytest session under one mode: its command, exit code, wall time and test outcomes."""

    mode: str
    command: list[str]
    results_path: Path
    log_path: Path
    returncode: int | None = None
    seconds: float = 0.0
    stopped: bool = False  # killed at the wall-clock limit
    outcomes: dict[str, dict] = field(default_factory=dict)


def outcomes_from_lines(lines: list[str]) -> dict[str, dict]:
    """Per test node id: ``outcome`` (passed, failed, skipped), ``survives`` (mode -> reason) and the
    first failure ``message``, from the ``--sabotage-results`` lines of one session."""
    tests: dict[str, dict] = {}
    for raw in lines:
        if not raw.strip():
            continue
        line = json.loads(raw)
        test = tests.setdefault(line["nodeid"], {"outcome": "passed", "survives": {}, "message": None, "seconds": 0.0})
        test["survives"] = line["survives"] or test["survives"]
        test["seconds"] += line["duration"]
        if line["outcome"] == "failed" and test["outcome"] != "failed":
            test["outcome"], test["message"] = "failed", f"{line['when']}: {line['message']}"
        elif line["outcome"] == "skipped" and test["outcome"] == "passed":
            test["outcome"] = "skipped"
    return tests


def summarize(mode: str, outcomes: dict[str, dict]) -> dict:
    """Counts, and for a sabotage mode its survivors: expected (with the marker's reason) or not."""
    counts = {k: sum(1 for t in outcomes.values() if t["outcome"] == k) for k in ("passed", "failed", "skipped")}
    summary = {"mode": mode, "tests": len(outcomes), **counts}
    if mode == "normal":
        summary["failures"] = {n: t["message"] for n, t in sorted(outcomes.items()) if t["outcome"] == "failed"}
        return summary
    survivors = {n: t for n, t in sorted(outcomes.items()) if t["outcome"] == "passed"}
    summary["survivors"] = [{"test": n, "reason": t["survives"].get(mode)} for n, t in survivors.items()]
    summary["unexpected_survivors"] = [s["test"] for s in summary["survivors"] if s["reason"] is None]
    summary["marked_but_failed"] = sorted(n for n, t in outcomes.items() if mode in t["survives"] and t["outcome"] == "failed")
    return summary


def markdown(report: dict) -> str:
    lines = [
        "# GPU tests against broken replays",
        "",
        f"`{report['command']}` at commit `{report['commit']}` on {report['date']} ({report['device']}).",
        "Each mode ran `pytest -m gpu` with `BCG_DIFFUSION_TEST_SABOTAGE` set to it (`normal`: unset); a",
        "*survivor* is a test that passed under sabotage. See docs/testing.md.",
        "",
        "| mode | tests | passed | failed | skipped | survivors | unexpected survivors | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in report["modes"]:
        lines.append(
            f"| {s['mode']} | {s['tests']} | {s['passed']} | {s['failed']} | {s['skipped']} | "
            f"{len(s.get('survivors', [])) if s['mode'] != 'normal' else '-'} | "
            f"{len(s.get('unexpected_survivors', [])) if s['mode'] != 'normal' else '-'} | {s['seconds']:.0f}"
            f"{' (stopped at the limit)' if s['stopped'] else ''} |"
        )
    for s in report["modes"]:
        if s["mode"] == "normal":
            if s["failures"]:
                lines += ["", "## normal: failures (the suite must pass without sabotage)", ""]
                lines += [f"- `{n}`: {m}" for n, m in s["failures"].items()]
            continue
        lines += ["", f"## {s['mode']}: {len(s['survivors'])} survivor(s)", ""]
        lines += [f"- `{v['test']}`: {v['reason'] or '**UNEXPECTED**: no survives_sabotage marker for this mode'}"
                  for v in s["survivors"]] or ["(none)"]
        if s["marked_but_failed"]:
            lines += ["", "Marked as surviving but failed (the marker may be dropped):", ""]
            lines += [f"- `{n}`" for n in s["marked_but_failed"]]
    verdict = "PASS" if report["passed"] else "FAIL"
    lines += ["", f"Result: **{verdict}** (the normal run passes and no mode has an unexpected survivor)."]
    return "\n".join(lines) + "\n"


def _git_commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _device() -> str:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    except Exception as exc:  # noqa: BLE001 - the report says what it could not read
        return f"unknown ({type(exc).__name__})"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default=",".join(ALL_MODES), help=f"comma-separated, of {', '.join(ALL_MODES)} (default: all)")
    p.add_argument("--workers", type=int, default=3, help="pytest-xdist workers per mode (default: 3)")
    p.add_argument("--together", type=int, default=4,
                   help="modes run at once (default: 4, all; 1 runs them one after another)")
    p.add_argument("--timeout", type=float, default=300.0, help="pytest-timeout seconds per test (default: 300)")
    p.add_argument("--limit", type=float, default=480.0,
                   help="wall-clock seconds per mode; a session still running then is stopped and its finished "
                        "tests reported (default: 480)")
    p.add_argument("--out-dir", type=Path, default=Path(tempfile.gettempdir()) / "bcg-sabotage",
                   help="where the report (sabotage_<date>.{json,md}) and the sessions' logs go (default: %(default)s)")
    p.add_argument("--commit", default=None,
                   help="the commit to name in the report (default: git's HEAD, with '+changes' when the tree differs "
                        "from it; give it where the checkout's history is not the tested tree's)")
    p.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments (default: the tests folder)")
    return p


def _start(run: ModeRun) -> subprocess.Popen:
    env = dict(os.environ)
    env.pop(ENV_SABOTAGE, None)
    if run.mode != "normal":
        env[ENV_SABOTAGE] = run.mode
    log = open(run.log_path, "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(run.command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def run_modes(runs: list[ModeRun], together: int, limit: float) -> None:
    pending, active = list(runs), {}
    while pending or active:
        while pending and len(active) < together:
            run = pending.pop(0)
            run.results_path.write_text("")
            active[run.mode] = (run, _start(run), time.monotonic())
            print(f"started {run.mode}: {' '.join(run.command)} (log {run.log_path})", flush=True)
        time.sleep(1.0)
        for mode, (run, proc, started) in list(active.items()):
            run.seconds = time.monotonic() - started
            if proc.poll() is None and run.seconds > limit:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                run.stopped = True
            if proc.poll() is not None:
                run.returncode = proc.returncode
                run.outcomes = outcomes_from_lines(run.results_path.read_text().splitlines())
                print(f"finished {mode}: exit {run.returncode} after {run.seconds:.0f} s, {len(run.outcomes)} tests",
                      flush=True)
                del active[mode]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in ALL_MODES]
    if unknown or not modes:
        parser.error(f"--modes: unknown {', '.join(unknown) or '(none given)'}; use {', '.join(ALL_MODES)}")
    if args.workers < 1 or args.together < 1:
        parser.error("--workers and --together must be >= 1")
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H%M%S")
    work = args.out_dir / f"sabotage_{stamp}_runs"
    work.mkdir(parents=True, exist_ok=True)
    targets = args.pytest_args or ["tests"]
    runs = []
    for mode in modes:
        # --dist loadfile: a file's tests share one worker, so a module fixture (a launch of the
        # context-parallel harness, a built pipeline) runs once per session
        command = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-n", str(args.workers),
                   "--dist", "loadfile",
                   "--timeout", f"{args.timeout:g}", "--sabotage-results", str(work / f"{mode}.jsonl"), *targets]
        runs.append(ModeRun(mode, command, work / f"{mode}.jsonl", work / f"{mode}.log"))
    run_modes(runs, args.together, args.limit)
    summaries = []
    for run in runs:
        summary = summarize(run.mode, run.outcomes)
        summary.update(seconds=round(run.seconds, 1), returncode=run.returncode, stopped=run.stopped,
                       log=str(run.log_path.relative_to(args.out_dir)))
        summaries.append(summary)
    normal = next((s for s in summaries if s["mode"] == "normal"), None)
    passed = (normal is None or (normal["failed"] == 0 and not normal["stopped"])) and all(
        not s.get("unexpected_survivors") and not s["stopped"] for s in summaries)
    report = {
        "command": "python tests/sabotage_report.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": args.commit or _git_commit(), "date": stamp, "device": _device(), "passed": passed, "modes": summaries,
        "tests": {run.mode: run.outcomes for run in runs},
    }
    json_path, md_path = args.out_dir / f"sabotage_{stamp}.json", args.out_dir / f"sabotage_{stamp}.md"
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    md_path.write_text(markdown(report))
    print(markdown(report))
    print(f"wrote {json_path} and {md_path}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
