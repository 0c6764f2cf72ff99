"""A capture that fails N times in a row in one process, while other keys of the same transformer keep
replaying: the capture-failure loop.

The tiny Flux transformer of the zoo is accelerated (``max_narrowing=0``: a failed capture makes its key
run eagerly at once, after the library's one plain retry) and two *steady* keys are captured. Then, for
each of N *planted* failures, cycling through three means, a fresh key (another image and text length)
is warmed up and its capture fails inside a segment being recorded:

- ``host_read``: ``.item()`` of a device value (CUDA refuses it while a stream captures; on the CPU, in
  debug mode, the planting harness's emulation raises the same error);
- ``raise``: a :class:`PlantedCaptureError` raised in the captured code;
- ``interrupt``: a :class:`PlantedInterrupt` (a ``KeyboardInterrupt``) raised in the captured code. It is
  not a capture failure the library handles: it reaches the caller, who calls again with nothing planted,
  and the key must then capture and replay as if nothing had happened.

The plant sits in ``torch.nn.functional.gelu``, replaced process-wide for the run (the library takes it for
torch's own, so it is captured), and fires only while a segment is being recorded
(:func:`bcg_diffusion.core.is_recording_segment`). Between failures both steady keys replay on fresh
inputs. Every output (warm-up and fallback calls that ran eagerly, replays, the recovered calls) is compared
bitwise with an un-accelerated twin (a deep copy made before acceleration) on the same inputs. The device
memory (allocated, reserved) is sampled through the loop. Reports ``capture_failures.json`` and ``.md``.

    python -m bcg_diffusion.checks.capture_failures --failures 1000 --out DIR --time-budget 240
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import logging
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch

import bcg_diffusion
from bcg_diffusion.core import is_recording_segment
from bcg_diffusion.toolkit.numbers import finite_float
from bcg_pipelines import zoo

from .capture_failures_report import LoopReport, write_reports
from .planting import current_commit
from .planting_kinds import KINDS, PlantState

MEANS = ("host_read", "raise", "interrupt")
CASE = "FluxTransformer2DModel"
STEADY_KEYS = ((16, 24), (36, 12))  # (image tokens, text tokens) that replay between failures
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


class PlantedCaptureError(RuntimeError):
    """The ``raise`` means: an exception raised in the captured code."""


class PlantedInterrupt(KeyboardInterrupt):
    """The ``interrupt`` means: a ``KeyboardInterrupt`` raised in the captured code."""


@dataclass
class Plant:
    """What ``gelu`` does while a segment is recorded: nothing (``means`` None), or fail by ``means``.
    ``fired`` counts the capture attempts it made fail."""

    means: str | None = None
    fired: int = 0
    _host: PlantState = field(default_factory=PlantState)

    def __call__(self, out: torch.Tensor) -> torch.Tensor:
        if self.means is None or not is_recording_segment():
            return out
        self.fired += 1
        if self.means == "host_read":
            return KINDS["item"].work(out, self._host)  # fails inside a real capture (or its CPU emulation)
        if self.means == "raise":
            raise PlantedCaptureError("planted: an exception inside the capture")
        raise PlantedInterrupt("planted: an interrupt inside the capture")


@contextlib.contextmanager
def planted_gelu(plant: Plant) -> Iterator[None]:
    """``torch.nn.functional.gelu`` with ``plant`` after it, for the block; put back after."""
    real = torch.nn.functional.gelu

    def gelu(input: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        return plant(real(input, approximate=approximate))

    torch.nn.functional.gelu = gelu
    try:
        yield
    finally:
        torch.nn.functional.gelu = real


def fresh_keys(count: int) -> Iterator[tuple[int, int]]:
    """``count`` (image tokens, text tokens) pairs, none of them a steady key: each is a new graph key."""
    made = 0
    for total in range(8, 10_000):
        for image in range(4, total - 3):
            key = (image, total - image)
            if key in STEADY_KEYS:
                continue
            yield key
            made += 1
            if made == count:
                return


def flux_inputs(image: int, text: int, device: torch.device, dtype: torch.dtype, seed: int) -> dict[str, Any]:
    """One forward call of the zoo's tiny Flux with ``image`` and ``text`` tokens, seeded values."""
    g = torch.Generator("cpu").manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g).to(device, dtype)

    cols = torch.arange(image, dtype=torch.float32)
    img_ids = torch.stack([torch.zeros_like(cols), torch.zeros_like(cols), cols], dim=-1)
    return {"hidden_states": randn(1, image, 64), "encoder_hidden_states": randn(1, text, 32),
            "pooled_projections": randn(1, 32), "timestep": torch.full((1,), 0.5, device=device, dtype=dtype),
            "guidance": torch.full((1,), 3.5, device=device, dtype=dtype),
            "img_ids": img_ids.to(device, dtype), "txt_ids": torch.zeros(text, 3, device=device, dtype=dtype),
            "joint_attention_kwargs": {}, "return_dict": False}


def bitwise_equal(a: Any, b: Any) -> bool:
    """Outputs (a tensor or a tuple of them) with the same shapes, dtypes and bits (NaNs included)."""
    a, b = (a if isinstance(a, (tuple, list)) else (a,)), (b if isinstance(b, (tuple, list)) else (b,))
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and torch.equal(_raw(x), _raw(y))
        for x, y in zip(a, b))


def _raw(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


class FailureLoop:
    """The model, its twin, the plant and the counts of one run (see the module docstring)."""

    def __init__(self, device: torch.device, dtype: torch.dtype, report: LoopReport) -> None:
        case = next(c for c in zoo.zoo_cases() if c.name == CASE)
        self.device, self.dtype, self.report = device, dtype, report
        self.model = zoo.build_tiny(case, device, dtype, 0)
        self.twin = copy.deepcopy(self.model)
        self.plant = Plant()
        self.calls = 0
        config = bcg_diffusion.BCGConfig(max_narrowing=0, debug=device.type != "cuda")
        bcg_diffusion.accelerate_transformer(self.model, config)

    def call(self, key: tuple[int, int], what: str, means: str = "") -> bool:
        """One call of ``key`` on fresh inputs, compared with the twin; False when it was interrupted."""
        self.calls += 1
        inputs = flux_inputs(*key, self.device, self.dtype, seed=self.calls)
        with torch.inference_mode():
            try:
                out = self.model(**inputs)
            except PlantedInterrupt:
                return False
            except Exception as exc:  # noqa: BLE001 - an exception reaching the caller is what is counted
                self.report.unhandled(what, key, means, exc)
                return True
            expected = self.twin(**inputs)
        if not bitwise_equal(out, expected):
            self.report.mismatch(what, key, means)
        self.report.compared += 1
        return True

    def steady(self) -> None:
        for key in STEADY_KEYS:
            self.call(key, "steady replay")

    def fail_once(self, key: tuple[int, int], means: str) -> None:
        """Warm ``key`` up, then make its capture fail by ``means`` (an interrupt: call again, unplanted)."""
        self.plant.means = means
        try:
            self.call(key, "warm-up", means)  # eager: the plant does not fire outside a recording
            answered = self.call(key, "capture (planted)", means)
        finally:
            self.plant.means = None
        if means == "interrupt":
            if answered:
                self.report.swallowed_interrupts += 1
            self.call(key, "after the interrupt", means)
        self.report.failures[means] += 1

    def memory(self, index: int) -> None:
        if self.device.type == "cuda":
            self.report.sample(index, torch.cuda.memory_allocated(self.device), torch.cuda.memory_reserved(self.device))

    def stats(self) -> dict[str, int]:
        s = bcg_diffusion.get_stats(self.model)
        return {n: getattr(s, n) for n in ("hits", "captures", "failed_captures", "eager_calls", "warmup_calls", "misses")}

    def close(self) -> None:
        bcg_diffusion.remove_acceleration(self.model)


def run_loop(failures: int, device: torch.device, dtype: torch.dtype, time_budget: float, report: LoopReport,
             sample_every: int = 25) -> LoopReport:
    """The loop (see the module docstring): ``failures`` planted failures within ``time_budget`` seconds."""
    start = time.perf_counter()
    loop = FailureLoop(device, dtype, report)
    with planted_gelu(loop.plant), _quiet() as heard:
        try:
            for _ in range(2):  # warm-up, capture
                loop.steady()
            report.stats_start = loop.stats()
            loop.memory(0)
            for i, key in enumerate(fresh_keys(failures)):
                if time.perf_counter() - start > time_budget:
                    report.stopped_by_budget = True
                    break
                loop.fail_once(key, MEANS[i % len(MEANS)])
                loop.steady()
                if (i + 1) % sample_every == 0:
                    loop.memory(i + 1)
            loop.memory(sum(report.failures.values()))
            report.stats_end = loop.stats()
        finally:
            report.failed_attempts = loop.plant.fired
            report.warnings = heard
            report.seconds = time.perf_counter() - start
            loop.close()
    if device.type == "cuda":
        del loop
        gc.collect()
        torch.cuda.empty_cache()
        report.reserved_after_release = torch.cuda.memory_reserved(device)
    return report


@contextlib.contextmanager
def _quiet() -> Iterator[list[str]]:
    """The library's INFO lines (a miss per new key) off; its distinct warnings collected."""
    logger = logging.getLogger("bcg_diffusion")
    level = logger.level
    logger.setLevel(logging.WARNING)
    heard: list[str] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield heard
            heard += sorted({str(w.message).splitlines()[0][:300] for w in caught})
    finally:
        logger.setLevel(level)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--failures", type=int, default=1000, help="planted capture failures (default: 1000)")
    parser.add_argument("--out", type=Path, required=True, help="folder of capture_failures.json and .md")
    parser.add_argument("--time-budget", type=finite_float, default=240.0,
                        help="seconds; the loop stops (reported as incomplete) when they have passed (default: 240)")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu (debug mode)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bf16 on cuda, fp32 on cpu")
    parser.add_argument("--sample-every", type=int, default=25, help="failures between memory samples (default: 25)")
    parser.add_argument("--commit", default=None, help="the commit to report (default: git rev-parse HEAD)")
    args = parser.parse_args(argv)
    if args.failures < 1 or args.sample_every < 1 or args.time_budget <= 0:
        parser.error("--failures and --sample-every must be >= 1 and --time-budget > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the loop and write the reports; exit status 0 when every check passed, 1 otherwise."""
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = DTYPES[args.dtype or ("bf16" if device.type == "cuda" else "fp32")]
    report = LoopReport(planned=args.failures, time_budget_s=args.time_budget, header={
        "commit": args.commit or current_commit(), "torch": torch.__version__, "dtype": str(dtype).replace("torch.", ""),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (debug mode)",
        "date": time.strftime("%Y-%m-%d %H:%M"), "means": list(MEANS), "steady_keys": [list(k) for k in STEADY_KEYS]})
    run_loop(args.failures, device, dtype, args.time_budget, report, args.sample_every)
    json_path, md_path = write_reports(args.out, report)
    print(md_path.read_text().split("\n## ")[0])
    print(f"wrote {json_path} and {md_path}")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
