"""The offload benchmark's result: the figures it is read by (bound, ratios, memory against the cap) and its
Markdown page."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

GIB = 2**30


def _median(result: dict[str, Any], name: str) -> float | None:
    mode = result["modes"].get(name)
    return mode["times_ms"].get("median_ms") if mode and mode["times_ms"] else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def derived(result: dict[str, Any]) -> dict[str, Any]:
    """The copy floor (bytes streamed per call over the measured bandwidth), the bound max(resident, floor), and
    the ratios the targets are stated in."""
    streamed = result["modes"].get("stream_bcg") or result["modes"].get("stream_eager") or {}
    per_call = streamed.get("stats", {}).get("bytes_per_call")
    gbs = (result.get("bandwidth") or {}).get("gb_per_s")
    floor = 1e3 * per_call / (gbs * 1e9) if per_call and gbs else None
    resident = _median(result, "resident_bcg") or _median(result, "resident_eager")
    bound = max(resident or 0.0, floor or 0.0) or None
    bcg, group = _median(result, "stream_bcg"), _median(result, "group_offload")
    return {
        "bytes_per_call": per_call, "copy_floor_ms": floor, "resident_ms": resident, "bound_ms": bound,
        "stream_bcg_over_bound": _ratio(bcg, bound), "stream_bcg_over_resident_bcg": _ratio(bcg, _median(result, "resident_bcg")),
        "stream_bcg_over_group_offload": _ratio(bcg, group),
        "stream_eager_over_group_offload": _ratio(_median(result, "stream_eager"), group),
    }


def summary(case: Any, bench: Any, built_s: float, link: dict | None, cap: int | None, fraction: float | None,
            args: Any) -> dict[str, Any]:
    result = {
        "case": case.label, "slots": bench.slots, "warmup": bench.warmup, "iters": bench.iters, "build_s": built_s,
        "cap_bytes": cap, "cap_fraction": fraction, "bandwidth": link,
        "modes": {r.name: asdict(r) for r in bench.results},
    }
    result["derived"] = derived(result)
    return result


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _size(nbytes: int | None) -> str:
    if nbytes is None:
        return "-"
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


def _mode_row(name: str, mode: dict[str, Any], cap: int | None) -> str:
    if mode["skipped"] or mode["error"]:
        return f"| {name} | {mode['skipped'] or mode['error']} | | | | | |"
    t, s = mode["times_ms"], mode["stats"]
    peak = mode["peak_bytes"]
    within = "" if peak is None or cap is None or name.startswith("resident") else (" (within)" if peak <= cap else " (OVER)")
    replay = f"{s.get('hits', '-')} replays, {s.get('captures_during_timed', '-')} captures" if "hits" in s else "eager"
    stream = (f"{_size(s['bytes_per_call'])}/call, {s['sync_loads_during_timed']} on demand, wait "
              f"{_fmt(s.get('wait_ms_per_call'), 1)} ms/call") if "bytes_per_call" in s else "-"
    return (f"| {name} | {_fmt(t.get('median_ms'), 1)} ({_fmt(t.get('p10_ms'), 1)}-{_fmt(t.get('p90_ms'), 1)}) | "
            f"{'yes' if mode['bitwise'] else 'NO'} | {_fmt(None if peak is None else peak / GIB)}{within} | "
            f"{replay} | {stream} | {_fmt(mode['setup_s'], 1)} |")


def markdown(result: dict[str, Any]) -> str:
    d, env = result["derived"], result.get("environment", {})
    cap = result["cap_bytes"]
    link = result.get("bandwidth") or {}
    lines = [
        f"# Weight streaming: {result['case']}, {result['slots']} slots",
        "",
        f"{env.get('gpu') or 'CPU'}, torch {env.get('torch')}, diffusers {env.get('diffusers')}, commit "
        f"{env.get('git_commit')}, {env.get('date')}. Cap of the streaming modes and group offloading: "
        f"{_fmt(None if cap is None else cap / GIB)} GiB; resident modes uncapped. Host-to-device bandwidth (pinned): "
        f"{_fmt(link.get('gb_per_s'), 1)} GB/s. Per call: {result['warmup']} untimed calls, then the median of "
        f"{result['iters']} timed ones (p10-p90), each between device synchronisations; bitwise: against the first mode in the table.",
        "",
        "| mode | ms per call | bitwise | peak GiB | graphs (timed calls) | streaming (timed calls) | set-up s |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [_mode_row(name, mode, cap) for name, mode in result["modes"].items()]
    lines += [
        "",
        f"- bytes streamed per call: {_size(d['bytes_per_call'])}; "
        f"copy floor (bytes / bandwidth) {_fmt(d['copy_floor_ms'], 1)} ms; resident {_fmt(d['resident_ms'], 1)} ms; "
        f"bound max(resident, floor) {_fmt(d['bound_ms'], 1)} ms",
        f"- stream_bcg / bound: {_fmt(d['stream_bcg_over_bound'], 3)}; / resident_bcg: "
        f"{_fmt(d['stream_bcg_over_resident_bcg'], 3)}; / group_offload: {_fmt(d['stream_bcg_over_group_offload'], 3)}; "
        f"stream_eager / group_offload: {_fmt(d['stream_eager_over_group_offload'], 3)}",
    ]
    return "\n".join(lines) + "\n"
