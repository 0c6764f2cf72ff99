"""What ``bcg-generate`` prints after its runs: the size asked for and the size the transformer ran, the
per-step times of each run, BCG's statistics, the compile set-up and, with ``--compare``, the speed-up and
whether the two outputs are bitwise identical."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import bcg_pipelines as pipelines
from bcg_diffusion.toolkit.timed_run import RunResult, ran_size

from .plan import Plan

__all__ = ["SetUp", "fmt_ms", "fmt_size", "format_bcg_stats", "print_summary"]


@dataclass
class SetUp:
    """Untimed work before the timed runs, for the summary.

    ``warmups``: the ``WarmupReport`` of each ``--warmup``, by the label of the run that followed it;
    ``first_compiled``: with ``--compile``, a sentence on the first call that ran compiled code (it
    compiles) and its time; ``None`` when that was the first timed run (its first step says it).
    """

    warmups: dict[str, Any] = field(default_factory=dict)
    first_compiled: str | None = None

    def compiled_in(self, sentence: str) -> None:
        if self.first_compiled is None:
            self.first_compiled = sentence


def print_summary(pipe, plan: Plan, args, call: dict[str, Any], results: list[RunResult], setup: SetUp,
                  verdict: tuple[bool, str] | None, build_s: float, compile_cache) -> None:
    label = plan.model if plan.is_family else f"{plan.model} (real weights)"
    cp = (f", context parallel {plan.ranks.mode} over {plan.ranks.world_size} GPUs (rank 0's times)"
          if plan.ranks else "")
    print(f"summary: {label}, {plan.model_size}, {plan.device}, {pipelines.dtype_name(plan.dtype)}, batch {args.batch}, "
          f"build {build_s:.1f} s{cp}")
    for line in size_lines(pipe, plan, call, results):
        print(f"  {line}")
    for before, report in setup.warmups.items():
        print(f"  warm-up before the {before} run: {len(report.shapes)} shape(s), {report.captures} graph key(s) "
              f"captured, {report.total_s:.2f} s (bcg_diffusion.warmup)")
    for result in results:
        print_run(result, warmed=result.label in setup.warmups)
    last = results[-1]
    if last.bcg_stats is not None:
        print(format_bcg_stats(last.bcg_stats, indent="    "))
    elif getattr(args, "offload", None) is not None:  # an eager run that streamed: its streaming statistics
        import bcg_diffusion

        print(f"  {str(bcg_diffusion.get_stats(pipe).offload).strip()}")
    if plan.stack.compile:
        print(compile_setup_line(setup, results))
    if compile_cache is not None:
        print(f"  compile cache: {compile_cache.status}")
    if args.compare:
        eager, accel = results
        a, b = eager.steady_median_step, accel.steady_median_step
        active = last.bcg_stats is not None and last.bcg_stats.active
        if not active:  # two eager runs: their ratio is noise, not a speed-up
            reason = last.bcg_stats.inactive_reason if last.bcg_stats is not None else None
            print(f"  per-step speedup: none: BCG is inactive ({reason or 'not accelerated'}) (no speed-up to expect: "
                  "both runs were eager on this machine)")
        elif a and b:
            print(f"  per-step speedup (median of steps after the first): {a / b:.2f}x "
                  f"({fmt_ms(a)} {eager.label} -> {fmt_ms(b)} {accel.label})")
        same, detail = verdict
        print(f"  outputs bitwise identical: {'YES' if same else 'NO'} ({detail})")


def size_lines(pipe, plan: Plan, call: dict[str, Any], results: list[RunResult]) -> list[str]:
    """The size asked for and the size the transformer ran (measured in the last run), and a line when
    the pipeline's resolution binning ran another size."""
    sizes = ran_sizes(pipe, results[-1])
    if not sizes:
        ran = "the transformer's input was not seen (the pipeline has no .transformer)"
    else:
        ran = "the transformer ran " + " and ".join(r.describe() for r in sizes)
        if plan.ranks is not None:
            ran += f", the whole input: each of the {plan.ranks.world_size} ranks runs its share of the tokens"
    lines = [f"size: asked {asked_size(call)}; {ran}"]
    note = binning_note(pipe, call, sizes)
    if note:
        lines.append(note)
    return lines


def asked_size(call: dict[str, Any]) -> str:
    if "height" not in call or "width" not in call:
        return "the pipeline's default size"
    frames = f"{call['num_frames']} frames of " if call.get("num_frames") else ""
    return f"{frames}{call['width']}x{call['height']} px (WxH)"


def ran_sizes(pipe, result: RunResult) -> list:
    """The ``timed_run.RanSize`` of each distinct input the transformer received in ``result``."""
    config = getattr(getattr(pipe, "transformer", None), "config", None) or {}
    return [ran_size(shapes, config) for shapes in result.input_shapes]


def binning_note(pipe, call: dict[str, Any], sizes: list) -> str | None:
    """A sentence when resolution binning ran a size other than the one asked for, else ``None``."""
    params = pipelines.call_parameters(pipe)
    if "use_resolution_binning" not in params or not sizes or "height" not in call:
        return None
    if not call.get("use_resolution_binning", params["use_resolution_binning"].default):
        return None
    scale, ran = getattr(pipe, "vae_scale_factor", None), sizes[0]
    if not scale or ran.height is None:
        return None
    height, width = ran.height * scale, ran.width * scale
    if (height, width) == (call["height"], call["width"]):
        return None
    asked = f"{call['width']}x{call['height']}"
    return (f"{type(pipe).__name__}'s resolution binning ran {width}x{height} and resized to {asked} (WxH); "
            f"--no-resolution-binning runs {asked}")


def print_run(result: RunResult, warmed: bool) -> None:
    times = result.step_times
    if times:
        print(f"  {result.label}: {len(times)} step{'s' if len(times) != 1 else ''}, median step {fmt_ms(result.median_step)} "
              f"(first {fmt_ms(times[0])}, later steps median {fmt_ms(result.steady_median_step)}), "
              f"total {result.total_s:.2f} s")
        if warmed:
            print(f"    first step after the warm-up: {fmt_ms(times[0])}, {times[0] / result.median_step:.2f}x the "
                  f"median step ({fmt_ms(result.median_step)})")
    else:
        print(f"  {result.label}: total {result.total_s:.2f} s (no per-step times)")
    if result.cache_passes is not None:
        print(f"    step cache: {result.cache_passes}")
    for note in result.notes:
        print(f"    {note}")


def compile_setup_line(setup: SetUp, results: list[RunResult]) -> str:
    """``--compile``: the time of the first compiled call (it compiles), against a later step."""
    first = results[0]
    where = setup.first_compiled
    if where is None:
        where = (f"the first step of the {first.label} run took {first.step_times[0]:.2f} s" if first.step_times
                 else f"the {first.label} run took {first.total_s:.2f} s")
    return (f"  compile set-up: {where} (the first compiled call compiles; it includes any BCG capture); "
            f"a later step takes {fmt_ms(results[-1].steady_median_step)} (median of the {results[-1].label} run)")


def format_bcg_stats(stats, indent: str = "  ") -> str:
    """``str(stats)`` of a ``BCGStats`` indented (one that is not active says so and why), plus a line on eager
    fallbacks."""
    first, *rest = str(stats).splitlines()
    lines = [f"{indent}BCG: {first}"] + [indent + line for line in rest]
    if stats.eager_calls:
        lines.append(f"{indent}  note: {stats.eager_calls} transformer call(s) ran eagerly (a fallback key or "
                     "non-CUDA inputs); see the BCGCaptureWarning above, if any")
    return "\n".join(lines)


def fmt_ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{1e3 * seconds:.2f} ms"


def fmt_size(shape: dict[str, int]) -> str:
    """``WxH`` (width first, as ``--warmup`` takes it), with ``xFRAMES`` for videos."""
    return f"{shape['width']}x{shape['height']}" + (f"x{shape['num_frames']}" if shape.get("num_frames") else "")
