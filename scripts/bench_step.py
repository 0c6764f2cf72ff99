#!/usr/bin/env python
"""Per-step latency benchmark: one transformer call, as a denoising step makes it, in several modes.

For each case (family, size, shape, batch) it builds the pipeline with random weights, runs one denoising
step with a forward pre-hook on ``pipe.transformer`` that records the inputs of the step's first transformer
call, and then times ``transformer(**those inputs)`` in every mode, in one process, interleaved in rounds
(mode A x N, mode B x N, ..., repeated R times) so that drift hits all modes alike.

Modes (see docs/benchmarks.md):

- ``eager``: the transformer as diffusers runs it.
- ``bcg``: breakable CUDA graphs (``bcg_diffusion.accelerate_transformer``) on a weight-sharing copy.
- ``whole_graph``: one ``torch.cuda.CUDAGraph`` of the whole call with static inputs: the practical floor.
- ``compile``: regional ``torch.compile`` (default mode) of the repeated blocks.
- ``compile_bcg``: regional ``torch.compile`` plus BCG.
- ``reduce_overhead``: ``torch.compile(transformer, mode="reduce-overhead")`` of the whole module.

Every mode other than eager works on its own weight-sharing copy of the transformer (module structure copied,
parameters and buffers shared), so compiled and BCG modes never stack by accident and eager stays eager.

Writes ``bench_step_<date>.json`` and ``.md`` into ``--out-dir`` (default ``bench_results/``), and the ``.png``
chart where matplotlib is installed (``pip install -e ".[bench]"``).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime as _dt
import gc
import importlib.util
import inspect
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))  # to share helpers with generate.py
import generate as gen  # noqa: E402

MODES = ("eager", "bcg", "whole_graph", "compile", "compile_bcg", "reduce_overhead")
CUDA_ONLY = ("whole_graph", "compile", "compile_bcg", "reduce_overhead")
COMPILED = ("compile", "compile_bcg", "reduce_overhead")
BCG_MODES = ("bcg", "compile_bcg")
MODE_HELP = {
    "eager": "the transformer as diffusers runs it (the baseline)",
    "bcg": "breakable CUDA graphs: graph segments with attention run eagerly between them",
    "whole_graph": "one torch.cuda.CUDAGraph of the whole call (static inputs): the practical floor",
    "compile": "regional torch.compile (default mode) of the repeated blocks",
    "compile_bcg": "regional torch.compile plus breakable CUDA graphs",
    "reduce_overhead": "torch.compile(transformer, mode='reduce-overhead') of the whole module",
}

# The default matrix: a launch-bound (small) and a compute-bound (large) shape per family, in the order
# that --shard deals out by family (K/3: pixart+qwenimage, sd3+flux, sana+wan take similar time).
# Launch-bound shapes run every mode and the end-to-end row. Compute-bound shapes skip reduce_overhead,
# the costliest set-up of the matrix (a whole-module compile per shape, 0.5-2 min): its CUDA graphs remove
# launch gaps that a compute-bound step does not have, and `compile` already measures fusion there.
# Their end-to-end row is skipped too (it would repeat the per-step ratio over 20-50 long steps).
COMPUTE_BOUND_MODES = ("eager", "bcg", "whole_graph", "compile", "compile_bcg")
DEFAULT_MATRIX = (
    ("pixart:full:512x512:b1", MODES, True),
    ("pixart:full:1024x1024:b1", COMPUTE_BOUND_MODES, False),
    ("sd3:full:512x512:b1", MODES, True),
    ("sd3:full:1024x1024:b1", COMPUTE_BOUND_MODES, False),
    ("sana:full:512x512:b1", MODES, True),
    ("sana:full:1024x1024:b4", COMPUTE_BOUND_MODES, False),
    ("qwenimage:full:512x512:b1", MODES, True),
    ("qwenimage:full:1024x1024:b1", COMPUTE_BOUND_MODES, False),
    ("flux:full:512x512:b1", MODES, True),
    ("flux:full:1024x1024:b1", COMPUTE_BOUND_MODES, False),
    ("wan:full:240x416:f5:b1", MODES, True),
    ("wan:full:480x832:f81:b1", COMPUTE_BOUND_MODES, False),
)
DEFAULT_CASES = tuple(text for text, _, _ in DEFAULT_MATRIX)
# --quick: under 5 minutes on one H200. Launch-bound shapes only; compile for one case.
QUICK_MATRIX = (
    ("pixart:full:512x512:b1", ("eager", "bcg", "whole_graph", "compile"), True),
    ("sd3:full:512x512:b1", ("eager", "bcg", "whole_graph"), True),
)
QUICK_ITERS, QUICK_ROUNDS = 10, 3
DEFAULT_ITERS, DEFAULT_ROUNDS, DEFAULT_WARMUP = 20, 3, 3
# Without --iters, each mode makes enough calls per round to take about this long (at least MIN_AUTO_ITERS
# and at most DEFAULT_ITERS calls), so slow compute-bound steps do not dominate the run time.
AUTO_ROUND_S, MIN_AUTO_ITERS = 0.4, 3
PROMPT = "a lighthouse on a rocky coast at dusk, waves crashing, dramatic sky"
CHART_NEEDS_MATPLOTLIB = 'no chart: matplotlib is not installed (the chart needs pip install -e ".[bench]")'


# ---------------------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------------------
@dataclass
class Case:
    family: str
    size: str = "full"
    height: int | None = None
    width: int | None = None
    frames: int | None = None
    batch: int = 1
    modes: tuple[str, ...] | None = None  # per-case modes (the default matrix and the quick preset)
    note: str = ""
    e2e: bool | None = None  # per-case end-to-end row (the default matrix); None: the --e2e setting

    @property
    def label(self) -> str:
        parts = [self.family, self.size]
        if self.height is not None:
            parts.append(f"{self.height}x{self.width}")
        if self.frames is not None:
            parts.append(f"f{self.frames}")
        parts.append(f"b{self.batch}")
        return ":".join(parts)


def parse_case(text: str) -> Case:
    """``family[:size][:HxW][:fFRAMES][:bBATCH]``, e.g. ``pixart:full:512x512:b2`` or ``wan:full:480x832:f81:b1``."""
    tokens = [t for t in text.strip().split(":") if t]
    if not tokens:
        raise ValueError("empty case")
    case = Case(tokens[0])
    for tok in tokens[1:]:
        if tok in ("tiny", "full"):
            case.size = tok
        elif m := re.fullmatch(r"(\d+)x(\d+)(?:x(\d+))?", tok):
            case.height, case.width = int(m.group(1)), int(m.group(2))
            if m.group(3):
                case.frames = int(m.group(3))
        elif m := re.fullmatch(r"f(\d+)", tok):
            case.frames = int(m.group(1))
        elif m := re.fullmatch(r"b(\d+)", tok):
            case.batch = int(m.group(1))
        else:
            raise ValueError(f"case {text!r}: cannot read {tok!r} (expected tiny|full, HxW, fFRAMES or bBATCH)")
    if case.batch < 1:
        raise ValueError(f"case {text!r}: batch must be >= 1")
    return case


def resolve_case(case: Case, api, cuda: bool) -> Case:
    """Fill the shape from the family's defaults and validate it (``ValueError`` saying what is allowed).

    Without CUDA every case is run at its family's tiny size and default tiny shape.
    """
    spec = api.get_family(case.family)
    api.check_call(spec, case.height, case.width, case.frames, size=case.size)  # the case as asked is valid
    if not cuda and (case.size != "tiny" or case.height is not None or case.frames is not None):
        case = Case(case.family, "tiny", None, None, None, case.batch, case.modes, e2e=case.e2e,
                    note=f"no CUDA: ran {case.label} as the tiny model at its default shape")
    shape = api.check_call(spec, case.height, case.width, case.frames, size=case.size)
    case.height, case.width = shape["height"], shape["width"]
    case.frames = shape.get("num_frames")
    return case


def parse_shard(text: str) -> tuple[int, int]:
    """``K/N`` (1 <= K <= N) -> ``(K, N)``; ``ValueError`` otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ValueError(f"--shard wants K/N with 1 <= K <= N, e.g. 1/3 (got {text!r})")
    return int(m.group(1)), int(m.group(2))


def shard_cases(texts: list[str], k: int, n: int) -> list[int]:
    """Indices of the cases of shard ``k`` of ``n``: families are dealt out round-robin in order of first
    appearance, so all shapes of a family run in one shard (one process) and every case in exactly one."""
    family_of_case = [text.split(":", 1)[0].strip() for text in texts]
    families = list(dict.fromkeys(family_of_case))  # in order of first appearance
    mine = set(families[k - 1::n])
    return [i for i, family in enumerate(family_of_case) if family in mine]


# ---------------------------------------------------------------------------------------------------------
# Small tensor-tree helpers
# ---------------------------------------------------------------------------------------------------------
def clone_tree(x):
    import torch

    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, dict):
        return {k: clone_tree(v) for k, v in x.items()}
    if isinstance(x, list):
        return [clone_tree(v) for v in x]
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(clone_tree(v) for v in x)
    return x


def copy_tree_(dst, src) -> None:
    import torch

    if isinstance(dst, torch.Tensor):
        dst.copy_(src)
    elif isinstance(dst, dict):
        for k in dst:
            copy_tree_(dst[k], src[k])
    elif isinstance(dst, (list, tuple)):
        for d, s in zip(dst, src):
            copy_tree_(d, s)


def first_tensor(out):
    import torch

    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (list, tuple)) and out:
        return first_tensor(out[0])
    sample = getattr(out, "sample", None)
    if isinstance(sample, torch.Tensor):
        return sample
    raise TypeError(f"cannot find the output tensor in a {type(out).__name__}")


def describe_tree(x, depth: int = 0):
    import torch

    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).replace('torch.', '')}{list(x.shape)}"
    if depth > 2:
        return type(x).__name__
    if isinstance(x, dict):
        return {k: describe_tree(v, depth + 1) for k, v in x.items() if v is not None}
    if isinstance(x, (list, tuple)):
        return [describe_tree(v, depth + 1) for v in x][:8]
    if isinstance(x, (int, float, bool, str)) or x is None:
        return x
    return type(x).__name__


def weight_sharing_copy(module):
    """A copy of ``module``'s structure that shares its parameters and buffers (no extra weight memory)."""
    memo = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return copy.deepcopy(module, memo)


def _err(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) < 600 else text[:600] + " ..."


# ---------------------------------------------------------------------------------------------------------
# Timing, memory, profiling
# ---------------------------------------------------------------------------------------------------------
class Clock:
    """Times calls with CUDA events (GPU timeline) or, without CUDA, with ``perf_counter``."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def sync(self):
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def wall(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        self.sync()
        t0 = time.perf_counter()
        out = fn()
        self.sync()
        return time.perf_counter() - t0, out

    def calls(self, fn: Callable[[], Any], n: int) -> list[float]:
        if not self.cuda:
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            return times
        import torch

        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for s, e in zip(starts, ends):
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)]


def auto_iters(call_s: float) -> int:
    """Calls per round for a mode whose steady call takes ``call_s`` seconds (``--iters`` not given)."""
    if call_s <= 0:
        return DEFAULT_ITERS
    return max(MIN_AUTO_ITERS, min(DEFAULT_ITERS, math.ceil(AUTO_ROUND_S / call_s)))


def summarize(times: list[float]) -> dict[str, float]:
    s = sorted(times)

    def pct(p):
        return s[min(len(s) - 1, max(0, round(p * (len(s) - 1))))]

    return {"n": len(s), "median_ms": 1e3 * statistics.median(s), "mean_ms": 1e3 * statistics.fmean(s),
            "p10_ms": 1e3 * pct(0.10), "p90_ms": 1e3 * pct(0.90), "min_ms": 1e3 * s[0]}


def profile_kernels(fn: Callable[[], Any]) -> dict[str, Any]:
    """Kernel count and GPU time of one call, from torch.profiler's CUDA activity."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Profiler clears events at the end of each cycle" and the like
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    spans = []
    for ev in prof.profiler.kineto_results.events():
        dev = ev.device_type() if callable(ev.device_type) else ev.device_type
        if str(dev).endswith("CUDA"):
            name = ev.name() if callable(ev.name) else ev.name
            start = ev.start_ns() if callable(ev.start_ns) else ev.start_ns
            dur = ev.duration_ns() if callable(ev.duration_ns) else ev.duration_ns
            spans.append((name, start, dur))
    kernels = [s for s in spans if not s[0].startswith(("Memcpy", "Memset"))]
    busy, end = 0, None  # union of all device intervals (streams may overlap)
    for _, start, dur in sorted(spans, key=lambda s: s[1]):
        stop = start + dur
        if end is None or start >= end:
            busy += dur
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    return {"kernels": len(kernels), "memory_ops": len(spans) - len(kernels),
            "kernel_time_ms": sum(s[2] for s in kernels) / 1e6, "gpu_busy_ms": busy / 1e6}


# ---------------------------------------------------------------------------------------------------------
# Modes
# ---------------------------------------------------------------------------------------------------------
@dataclass
class Runner:
    name: str
    fn: Callable[[], Any]
    compiled: bool = False
    notes: list[str] = field(default_factory=list)
    first_call_s: float | None = None
    module: Any = None  # the module this mode calls (BCG modes: the accelerated copy)
    extra: dict[str, Any] = field(default_factory=dict)
    accelerated: bool = False  # BCG modes: whether the copy is accelerated right now
    activations: int = 0
    bcg_options: dict[str, Any] = field(default_factory=dict)
    iters: int = DEFAULT_ITERS  # timed calls per round

    @property
    def is_bcg(self) -> bool:
        return self.name in BCG_MODES

    def activate(self, cuda: bool) -> None:
        if self.is_bcg and not self.accelerated:
            _accelerate(self.module, cuda, self.bcg_options)
            self.accelerated = True
            self.activations += 1

    def deactivate(self) -> None:
        if self.is_bcg and self.accelerated:
            _bcg(("remove_acceleration",)).remove_acceleration(self.module)
            self.accelerated = False


class StepContext:
    """The transformer and the recorded inputs of a real denoising step, shared by all modes of a case."""

    def __init__(self, transformer, args, kwargs, cuda: bool, bcg_options: dict[str, Any] | None = None):
        self.transformer = transformer
        self.args = args
        self.kwargs = kwargs
        self.cuda = cuda
        self.bcg_options = dict(bcg_options or {})

    def call(self, module):
        return module(*self.args, **self.kwargs)


def _bcg(names=("accelerate_transformer", "BCGConfig", "get_stats")):
    return gen.bcg_api(*names)


def bcg_config(api, options: dict[str, Any]):
    """``BCGConfig(**options)``, keeping only the fields this version of the library has."""
    names = {f.name for f in dataclasses.fields(api.BCGConfig)}
    return api.BCGConfig(**{k: v for k, v in options.items() if k in names and v is not None})


def _accelerate(module, cuda: bool, options: dict[str, Any]):
    api = _bcg()
    config = bcg_config(api, options)
    if cuda:
        return api.accelerate_transformer(module, config)
    with gen.quiet_library_warnings():  # the no-CUDA no-op was announced once at start
        return api.accelerate_transformer(module, config)


def setup_eager(ctx: StepContext) -> Runner:
    t = ctx.transformer
    return Runner("eager", lambda: first_tensor(ctx.call(t)), module=t)


def setup_bcg(ctx: StepContext) -> Runner:
    module = weight_sharing_copy(ctx.transformer)
    notes = ["accelerate_transformer on a weight-sharing copy of the transformer"]
    if not ctx.cuda:
        notes.append("no CUDA: accelerate_transformer is a no-op, so this is eager")
    runner = Runner("bcg", lambda: first_tensor(ctx.call(module)), module=module, notes=notes,
                    bcg_options=ctx.bcg_options)
    runner.activate(ctx.cuda)
    return runner


def setup_whole_graph(ctx: StepContext) -> Runner:
    import torch

    t = ctx.transformer
    static_args, static_kwargs = clone_tree(ctx.args), clone_tree(ctx.kwargs)
    t0 = time.perf_counter()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            t(*static_args, **static_kwargs)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    # The graph must own its cuBLAS workspace: one cached from an earlier capture on torch.cuda.graph's
    # shared capture stream lives in that graph's pool, which CUDA graph trees (reduce_overhead) and BCG free.
    torch._C._cuda_clearCublasWorkspaces()
    try:
        with torch.cuda.graph(graph):
            static_out = first_tensor(t(*static_args, **static_kwargs))
    except Exception as exc:
        torch.cuda.synchronize()
        raise RuntimeError(f"whole-step capture failed: {_err(exc)}") from exc
    torch.cuda.synchronize()
    setup = time.perf_counter() - t0

    def replay():
        copy_tree_(static_args, ctx.args)  # what a real caller must do: live inputs into the static buffers
        copy_tree_(static_kwargs, ctx.kwargs)
        graph.replay()
        return static_out.clone()  # ... and copy the output out before the next replay overwrites it

    return Runner("whole_graph", replay, extra={"graph": graph, "capture_s": setup},
                  notes=["3 warm-up calls on a side stream, then one torch.cuda.graph capture; each call copies "
                         "the inputs in and clones the output"])


def _compiled_copy(ctx: StepContext) -> tuple[Any, str, float]:
    module = weight_sharing_copy(ctx.transformer)
    desc = gen.regional_compile(module)
    t0 = time.perf_counter()
    for _ in range(2):  # compile now (and not under a BCG capture later)
        ctx.call(module)
    if ctx.cuda:
        import torch

        torch.cuda.synchronize()
    return module, desc, time.perf_counter() - t0


def setup_compile(ctx: StepContext) -> Runner:
    module, desc, secs = _compiled_copy(ctx)
    return Runner("compile", lambda: first_tensor(ctx.call(module)), compiled=True, module=module,
                  notes=[desc], extra={"compile_calls_s": secs})


def setup_compile_bcg(ctx: StepContext) -> Runner:
    module, desc, secs = _compiled_copy(ctx)
    runner = Runner("compile_bcg", lambda: first_tensor(ctx.call(module)), compiled=True, module=module,
                    notes=[desc + ", then accelerate_transformer"], extra={"compile_calls_s": secs},
                    bcg_options=ctx.bcg_options)
    runner.activate(ctx.cuda)
    return runner


def setup_reduce_overhead(ctx: StepContext) -> Runner:
    import torch

    compiled = torch.compile(weight_sharing_copy(ctx.transformer), mode="reduce-overhead")

    def call():
        torch.compiler.cudagraph_mark_step_begin()
        return first_tensor(ctx.call(compiled)).clone()

    return Runner("reduce_overhead", call, compiled=True, module=compiled,
                  notes=["torch.compile(transformer, mode='reduce-overhead') of the whole module "
                         "(cudagraph trees); output cloned"])


SETUPS = {
    "eager": setup_eager,
    "bcg": setup_bcg,
    "whole_graph": setup_whole_graph,
    "compile": setup_compile,
    "compile_bcg": setup_compile_bcg,
    "reduce_overhead": setup_reduce_overhead,
}


def bcg_options(opts) -> dict[str, Any]:
    return {"check_weights": opts.check_weights}


def bcg_stats_dict(module) -> dict[str, Any] | None:
    try:
        stats = _bcg(("get_stats",)).get_stats(module)
    except Exception as exc:  # noqa: BLE001
        return {"error": _err(exc)}
    if stats is None:
        return None
    out = {k: getattr(stats, k, None) for k in
           ("hits", "misses", "captures", "eager_calls", "capture_time_s", "graph_memory_bytes")}
    out["entries"] = [
        {k: getattr(e, k, None) for k in ("key", "segments", "breaks", "capture_time_s", "memory_bytes", "hits",
                                           "fallback")}
        for e in list(getattr(stats, "entries", []) or [])
    ]
    out["text"] = str(stats)
    return out


# ---------------------------------------------------------------------------------------------------------
# One case
# ---------------------------------------------------------------------------------------------------------
def pipe_call_kwargs(pipe, spec, case: Case, steps: int) -> dict[str, Any]:
    params = gen.call_parameters(pipe)
    call = {k: v for k, v in spec.default_call(case.size).items() if k not in ("height", "width", "num_frames")}
    call.update(prompt=PROMPT, height=case.height, width=case.width, num_inference_steps=steps)
    if case.frames is not None:
        call["num_frames"] = case.frames
    for key in ("num_images_per_prompt", "num_videos_per_prompt"):
        if key in params:
            call[key] = case.batch
            break
    if "use_resolution_binning" in params:
        call["use_resolution_binning"] = False  # run the shape asked for, not the nearest aspect-ratio bin
    if "clean_caption" in params:
        call["clean_caption"] = False
    return call


def record_step_inputs(pipe, call: dict[str, Any], seed: int, device) -> tuple[tuple, dict, int]:
    """Run one denoising step; return (args, kwargs) of its first transformer call (cloned) and the call count."""
    import torch

    seen: dict[str, Any] = {"n": 0}

    def hook(_module, args, kwargs):
        if seen["n"] == 0:
            seen["args"], seen["kwargs"] = clone_tree(args), clone_tree(kwargs)
        seen["n"] += 1

    handle = pipe.transformer.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        gen_device = "cuda" if device.type == "cuda" else "cpu"
        with torch.inference_mode():
            pipe(**call, generator=torch.Generator(gen_device).manual_seed(seed), output_type="latent")
    finally:
        handle.remove()
    if not seen["n"]:
        raise RuntimeError("the pipeline never called its transformer")
    return seen["args"], seen["kwargs"], seen["n"]


def free_memory(cuda: bool, dynamo: bool = False) -> None:
    gc.collect()
    if dynamo:
        try:
            import torch._dynamo

            torch._dynamo.reset()
        except Exception:  # noqa: BLE001
            pass
        gc.collect()
    if cuda:
        import torch

        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def run_modes(ctx: StepContext, modes: list[str], opts, clock: Clock, log) -> dict[str, dict[str, Any]]:
    """Set up each mode (timing its first call and memory), then time all of them interleaved in rounds.

    BCG patches attention functions process-wide while any module is accelerated, which would give eager
    calls an extra wrapper and the compiled modes graph breaks. So the BCG modes run last in each round and
    their copies are un-accelerated while the other modes run (and re-accelerated, i.e. recaptured, with
    untimed warm-up calls, before their own turn).
    """
    import torch

    modes = [m for m in modes if m not in BCG_MODES] + [m for m in modes if m in BCG_MODES]
    results: dict[str, dict[str, Any]] = {}
    runners: dict[str, Runner] = {}
    reference = None
    for mode in modes:
        res = results[mode] = {"status": "ok", "torch_compile": mode in COMPILED, "description": MODE_HELP[mode]}
        if mode in CUDA_ONLY and not ctx.cuda:
            res.update(status="n/a", reason="needs CUDA")
            continue
        runner = None
        try:
            if ctx.cuda:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                base_alloc, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
            with torch.inference_mode():
                t0 = time.perf_counter()
                runner = SETUPS[mode](ctx)
                construct_s = time.perf_counter() - t0
                first_s, out = clock.wall(runner.fn)
                out = out.detach().clone()
                warm = [clock.wall(runner.fn)[0] for _ in range(max(0, opts.warmup - 1))]
                if mode == "eager":  # is eager itself bitwise repeatable? (else "= eager" cannot hold)
                    again = runner.fn()
                    res["repeatable"] = bool(torch.equal(again, out))
                    del again
            runner.iters = opts.iters or auto_iters(min(warm) if warm else first_s)
            res["iters_per_round"] = runner.iters
            runner.first_call_s = first_s
            res["construct_s"] = construct_s
            res["first_call_s"] = first_s
            res["warmup_s"] = warm
            res["notes"] = list(runner.notes)
            res.update({k: v for k, v in runner.extra.items() if isinstance(v, (int, float))})
            if ctx.cuda:
                torch.cuda.synchronize()
                res["peak_alloc_delta_bytes"] = torch.cuda.max_memory_allocated() - base_alloc
                res["retained_alloc_bytes"] = torch.cuda.memory_allocated() - base_alloc
                res["retained_reserved_bytes"] = torch.cuda.memory_reserved() - base_reserved
            if mode == "eager":
                reference = out
            if reference is not None:
                same = out.shape == reference.shape and torch.equal(out, reference)
                res["bitwise_equal_to_eager"] = bool(same)
                res["max_abs_diff_vs_eager"] = 0.0 if same else float((out.float() - reference.float()).abs().max())
            if runner.is_bcg:
                res["bcg_stats_after_setup"] = bcg_stats_dict(runner.module)
            runners[mode] = runner
            log(f"    {mode}: ready (set-up {construct_s:.2f} s, first call {first_s:.3f} s)")
        except Exception as exc:  # noqa: BLE001 - one mode's failure must not stop the others
            res.update(status="n/a" if mode == "whole_graph" else "error", reason=_err(exc))
            res["traceback"] = traceback.format_exc(limit=8)
            log(f"    {mode}: {res['status']}: {res['reason']}")
            if runner is not None:
                _safe_deactivate(runner)
            runner = None
            free_memory(ctx.cuda)

    times: dict[str, list[float]] = {m: [] for m in runners}
    for rnd in range(opts.rounds):
        parts = []
        for mode in list(runners):
            runner = runners[mode]
            try:
                with torch.inference_mode():
                    if runner.is_bcg:
                        if not runner.accelerated:
                            runner.activate(ctx.cuda)
                            for _ in range(opts.warmup):  # recapture and settle, untimed
                                runner.fn()
                    else:
                        for other in runners.values():
                            _safe_deactivate(other)
                    chunk = clock.calls(runner.fn, runner.iters)
                times[mode] += chunk
                parts.append(f"{mode} {1e3 * statistics.median(chunk):.2f}")
            except Exception as exc:  # noqa: BLE001
                results[mode].update(status="error", reason=f"during timing: {_err(exc)}")
                _safe_deactivate(runners.pop(mode))
                parts.append(f"{mode} error")
        log(f"    round {rnd + 1}/{opts.rounds} (median ms): " + ", ".join(parts))

    for mode, runner in runners.items():
        res = results[mode]
        res.update(summarize(times[mode]))
        steady = res["median_ms"] / 1e3
        res["setup_s"] = max(0.0, res["construct_s"] + res["first_call_s"] - steady)
        if runner.is_bcg:
            res["bcg_stats"] = bcg_stats_dict(runner.module)
            res["captures_in_rounds"] = max(0, runner.activations - 1)
            stats = res["bcg_stats"] or {}
            if stats.get("eager_calls"):
                res["notes"].append(f"BCG ran {stats['eager_calls']} call(s) eagerly (fallback)")
            for entry in stats.get("entries") or []:
                if entry.get("fallback"):
                    res["notes"].append(f"BCG key fell back to eager: {entry['fallback']}")
    for runner in runners.values():
        _safe_deactivate(runner)
    eager = results.get("eager", {}).get("median_ms")
    floor = results.get("whole_graph", {}).get("median_ms")
    eager_peak = results.get("eager", {}).get("peak_alloc_delta_bytes")
    for res in results.values():
        if "median_ms" not in res:
            continue
        res["speedup_vs_eager"] = eager / res["median_ms"] if eager else None
        res["ratio_to_whole_graph"] = res["median_ms"] / floor if floor else None
        if eager_peak is not None and res.get("peak_alloc_delta_bytes") is not None:
            res["extra_peak_vs_eager_bytes"] = res["peak_alloc_delta_bytes"] - eager_peak
    if ctx.cuda and "eager" in runners:
        try:
            with torch.inference_mode():
                results["eager"]["profile"] = profile_kernels(runners["eager"].fn)
            prof = results["eager"]["profile"]
            log(f"    eager profile: {prof['kernels']} kernels, GPU busy {prof['gpu_busy_ms']:.2f} ms of "
                f"{results['eager']['median_ms']:.2f} ms")
        except Exception as exc:  # noqa: BLE001
            results["eager"]["profile"] = {"error": _err(exc)}
    runners.clear()
    return results


def _safe_deactivate(runner: Runner) -> None:
    try:
        runner.deactivate()
    except Exception:  # noqa: BLE001 - cleanup must not mask the result
        runner.accelerated = False


def run_e2e(pipe, call: dict[str, Any], seed: int, device, cuda: bool, clock: Clock, log) -> dict[str, Any]:
    """A full ``pipe(...)`` call (all steps, VAE decode): eager, then BCG's first call (capture) and a second."""
    import numpy as np
    import torch

    def one():
        g = torch.Generator("cuda" if cuda else "cpu").manual_seed(seed)
        with torch.inference_mode():
            out = pipe(**call, generator=g, output_type="np")
        imgs = getattr(out, "images", None)
        return np.asarray(imgs if imgs is not None else out.frames)

    res: dict[str, Any] = {"steps": call["num_inference_steps"]}
    warm_call = dict(call, num_inference_steps=min(2, call["num_inference_steps"]))
    with torch.inference_mode():  # untimed warm-up of text encoders, VAE decode, cuDNN
        pipe(**warm_call, generator=torch.Generator("cuda" if cuda else "cpu").manual_seed(seed), output_type="np")
    res["eager_s"], ref = clock.wall(one)
    log(f"    e2e eager: {res['eager_s']:.2f} s for {res['steps']} steps")
    try:
        api = _bcg(("accelerate_pipeline", "remove_acceleration", "BCGConfig", "get_stats"))
    except gen.BCGUnavailable as exc:
        res["bcg_error"] = str(exc)
        log(f"    e2e bcg: error: {exc}")
        return res
    try:
        if cuda:
            pipe = api.accelerate_pipeline(pipe, api.BCGConfig()) or pipe
        else:
            with gen.quiet_library_warnings():
                pipe = api.accelerate_pipeline(pipe, api.BCGConfig()) or pipe
        res["bcg_first_s"], first = clock.wall(one)
        res["bcg_second_s"], second = clock.wall(one)
        res["bitwise_equal_to_eager"] = bool(np.array_equal(ref, second) and np.array_equal(ref, first))
        res["speedup_second_vs_eager"] = res["eager_s"] / res["bcg_second_s"]
        res["capture_overhead_s"] = res["bcg_first_s"] - res["bcg_second_s"]
        res["bcg_stats"] = None
        try:
            stats = api.get_stats(pipe)
            if stats is not None:
                res["bcg_stats"] = {k: getattr(stats, k, None) for k in
                                    ("hits", "misses", "captures", "capture_time_s", "graph_memory_bytes")}
        except Exception as exc:  # noqa: BLE001
            res["bcg_stats"] = {"error": _err(exc)}
        if not cuda:
            res["note"] = "no CUDA: accelerate_pipeline is a no-op, so the BCG calls ran eagerly"
        log(f"    e2e bcg: first call {res['bcg_first_s']:.2f} s (with capture), second {res['bcg_second_s']:.2f} s, "
            f"identical to eager: {res['bitwise_equal_to_eager']}")
    except Exception as exc:  # noqa: BLE001
        res["bcg_error"] = _err(exc)
        log(f"    e2e bcg: error: {res['bcg_error']}")
    finally:
        try:
            api.remove_acceleration(pipe)
        except Exception:  # noqa: BLE001
            pass
    return res


def run_case(case: Case, modes: list[str], opts, api, device, dtype, clock: Clock, log) -> dict[str, Any]:
    import torch

    spec = api.get_family(case.family)
    result: dict[str, Any] = {
        "case": case.label, "family": case.family, "title": spec.title, "size": case.size, "height": case.height,
        "width": case.width, "frames": case.frames, "batch": case.batch, "cfg_mode": spec.cfg_mode,
        "modes": {}, "e2e": None, "error": None,
    }
    if case.note:
        result["note"] = case.note
    pipe = ctx = None
    used_compile = any(m in COMPILED for m in modes)
    try:
        t0 = time.perf_counter()
        pipe = api.build_pipeline(case.family, size=case.size, device=device, dtype=dtype, seed=opts.seed)
        result["build_s"] = time.perf_counter() - t0
        log(f"    built in {result['build_s']:.1f} s")
        call = pipe_call_kwargs(pipe, spec, case, steps=1)
        args, kwargs, ncalls = record_step_inputs(pipe, call, opts.seed, device)
        result["calls_per_step"] = ncalls
        result["step_inputs"] = describe_tree({**{f"arg{i}": a for i, a in enumerate(args)}, **kwargs})
        hs = kwargs.get("hidden_states", args[0] if args else None)
        result["transformer_batch"] = int(hs.shape[0]) if isinstance(hs, torch.Tensor) else None
        log(f"    step inputs: hidden_states {describe_tree(hs)}, {ncalls} transformer call(s) per step")
        ctx = StepContext(pipe.transformer, args, kwargs, clock.cuda, bcg_options(opts))
        result["modes"] = run_modes(ctx, modes, opts, clock, log)
        ctx = None
        free_memory(clock.cuda, dynamo=used_compile)
        if case.e2e if opts.e2e is None else opts.e2e:
            steps = opts.e2e_steps or spec.default_steps
            try:
                result["e2e"] = run_e2e(pipe, pipe_call_kwargs(pipe, spec, case, steps), opts.seed, device,
                                        clock.cuda, clock, log)
            except Exception as exc:  # noqa: BLE001
                result["e2e"] = {"error": _err(exc)}
                log(f"    e2e: error: {result['e2e']['error']}")
    except Exception as exc:  # noqa: BLE001 - a broken case is recorded and the run goes on
        result["error"] = _err(exc)
        result["traceback"] = traceback.format_exc(limit=8)
        log(f"    case failed: {result['error']}")
    finally:
        del pipe, ctx
        free_memory(clock.cuda, dynamo=used_compile)
    return result


# ---------------------------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------------------------
def environment(device, dtype, cuda: bool) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "gpu": torch.cuda.get_device_name(device) if cuda else None,
        "device": str(device),
        "dtype": str(dtype).replace("torch.", ""),
        "cpu_count": os.cpu_count(),
    }
    for name in ("diffusers", "transformers", "bcg_diffusion"):
        try:
            mod = __import__(name)
            env[name] = getattr(mod, "__version__", "?")
        except Exception as exc:  # noqa: BLE001
            env[name] = f"unavailable ({type(exc).__name__})"
    try:
        import bcg_diffusion

        env["bcg_pipeline_api"] = all(hasattr(bcg_diffusion, n) for n in ("accelerate_transformer", "accelerate_pipeline"))
    except Exception:  # noqa: BLE001
        env["bcg_pipeline_api"] = False
    # A copy of the tree on another machine (no .git, or a stale one) can be told its commit.
    env["git_commit"] = os.environ.get("BENCH_GIT_COMMIT") or None
    if env["git_commit"] is None:
        try:
            env["git_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                               text=True, cwd=gen.REPO_ROOT, timeout=10).stdout.strip() or None
        except Exception:  # noqa: BLE001
            pass
    return env


def _f(x, fmt="{:.2f}", none="n/a"):
    return none if x is None else fmt.format(x)


def _yes_no(value) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _iters_text(iters) -> str:
    if iters:
        return f"{iters} calls"
    return f"calls for about {AUTO_ROUND_S} s ({MIN_AUTO_ITERS}-{DEFAULT_ITERS})"


def _short_note(note: str) -> str:
    if "compile_repeated_blocks" in note:
        return "regional: compile_repeated_blocks()"
    if "of each block" in note:
        return "regional: each block compiled"
    if "reduce-overhead" in note:
        return "whole module"
    if note.startswith(("BCG ran", "BCG key", "no CUDA")):
        return note
    return ""


def markdown_report(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        f"# bench_step results, {env['date']}",
        "",
        f"GPU: {env['gpu'] or 'none (CPU run: code-path check only, timings mean nothing for BCG)'}; "
        f"torch {env['torch']}, CUDA {env['cuda']}, diffusers {env['diffusers']}, dtype {env['dtype']}, "
        f"commit {env.get('git_commit')}.",
        f"{_iters_text(report['settings'].get('iters'))} x {report['settings']['rounds']} interleaved rounds per mode after "
        f"{report['settings']['warmup']} warm-up calls; latency is the median of one transformer call (the step's "
        "first call; `calls/step` says how many a step makes). BCG modes: "
        + ", ".join(f"{k}={v!r}" for k, v in report["settings"].get("bcg_config_of_step_modes", {}).items()) + ".",
        "",
        "`/ whole_graph`: mode time divided by whole-step CUDA graph time (1.00 is the practical floor). "
        "`x eager`: eager time divided by mode time (speedup). `compile`: whether torch.compile was on. "
        "`setup s`: first-call time minus a steady call (capture and/or compilation). `extra peak`: peak GPU memory "
        "of the mode minus that of eager. `= eager`: output bitwise equal to eager's.",
    ]
    if report.get("merged_from"):
        lines += ["", "Merged from " + "; ".join(
            f"`{m['file']}` ({'shard ' + m['shard'] + ': ' if m.get('shard') else ''}{', '.join(m['cases'])}, "
            f"{_f(m.get('total_s'), '{:.0f}')} s, commit {m.get('git_commit')})" for m in report["merged_from"]) + "."]
    if report.get("not_run"):
        lines += ["", "Not run (time budget spent): " + ", ".join(report["not_run"]) + "."]
    lines += [
        "",
        "## Per-step latency",
        "",
        "| case | mode | compile | median ms | p10-p90 ms | / whole_graph | x eager | setup s | extra peak MiB | = eager | notes |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in report["cases"]:
        if case.get("error") and not case["modes"]:
            lines.append(f"| {case['case']} | - | - | - | - | - | - | - | - | - | case failed: {case['error']} |")
            continue
        for mode, r in case["modes"].items():
            if "median_ms" not in r:
                lines.append(f"| {case['case']} | {mode} | {'yes' if r['torch_compile'] else 'no'} | n/a | | | | | | | "
                             f"{r['status']}: {r.get('reason', '')} |".replace("\n", " "))
                continue
            extra = r.get("extra_peak_vs_eager_bytes")
            eq = r.get("bitwise_equal_to_eager")
            notes = "; ".join(_short_note(n) for n in r.get("notes", []) if _short_note(n))
            lines.append(
                f"| {case['case']} | {mode} | {'yes' if r['torch_compile'] else 'no'} | {r['median_ms']:.2f} | "
                f"{r['p10_ms']:.2f}-{r['p90_ms']:.2f} | {_f(r.get('ratio_to_whole_graph'))} | "
                f"{_f(r.get('speedup_vs_eager'))} | {_f(r.get('setup_s'))} | "
                f"{_f(None if extra is None else extra / 2**20, '{:.0f}')} | {'-' if eq is None else ('yes' if eq else 'no')} | "
                f"{notes} |"
            )
    lines += ["", "## Cases", "", "| case | transformer batch | calls/step | eager kernels/step | eager GPU busy ms | "
              "eager ms / GPU busy | eager repeatable | hidden_states | note |", "|---|---|---|---|---|---|---|---|---|"]
    for case in report["cases"]:
        eager = case["modes"].get("eager", {})
        prof = eager.get("profile") or {}
        hs = (case.get("step_inputs") or {}).get("hidden_states", (case.get("step_inputs") or {}).get("arg0"))
        bound = (eager["median_ms"] / prof["gpu_busy_ms"]) if prof.get("gpu_busy_ms") and eager.get("median_ms") else None
        lines.append(f"| {case['case']} | {case.get('transformer_batch', '-')} | {case.get('calls_per_step', '-')} | "
                     f"{prof.get('kernels', 'n/a')} | {_f(prof.get('gpu_busy_ms'))} | {_f(bound)} | "
                     f"{_yes_no(eager.get('repeatable'))} | {hs} | "
                     f"{case.get('note', '') or (case.get('error') or '')} |")
    e2e_rows = [c for c in report["cases"] if c.get("e2e")]
    if e2e_rows:
        lines += ["", "## End to end (full pipe call: all steps and VAE decode)", "",
                  "| case | steps | eager s | BCG first call s (with capture) | BCG later call s | x eager (later) | "
                  "= eager | notes |", "|---|---|---|---|---|---|---|---|"]
        for case in e2e_rows:
            e = case["e2e"]
            note = e.get("error") or e.get("bcg_error") or e.get("note") or ""
            eq = e.get("bitwise_equal_to_eager")
            lines.append(f"| {case['case']} | {e.get('steps', '-')} | {_f(e.get('eager_s'))} | {_f(e.get('bcg_first_s'))} | "
                         f"{_f(e.get('bcg_second_s'))} | {_f(e.get('speedup_second_vs_eager'))} | "
                         f"{'-' if eq is None else ('yes' if eq else 'no')} | {note} |")
    lines += ["", "Mode details:", ""]
    for mode in MODES:
        lines.append(f"- `{mode}`: {MODE_HELP[mode]}" + (" (torch.compile on)" if mode in COMPILED else ""))
    return "\n".join(lines) + "\n"


def plot_report(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [c for c in report["cases"] if c["modes"]]
    modes = [m for m in MODES if any("median_ms" in c["modes"].get(m, {}) for c in cases)]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.5 * len(cases) + 2), 4.8))
    width = 0.8 / max(1, len(modes))
    for j, mode in enumerate(modes):
        xs, ys = [], []
        for i, c in enumerate(cases):
            r = c["modes"].get(mode, {})
            if r.get("speedup_vs_eager"):
                xs.append(i + (j - (len(modes) - 1) / 2) * width)
                ys.append(r["speedup_vs_eager"])
        bars = ax.bar(xs, ys, width, label=mode + (" (torch.compile)" if mode in COMPILED else ""),
                      hatch="//" if mode in COMPILED else None)
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(cases)), [c["case"] for c in cases], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("speedup over eager (eager ms / mode ms)")
    env = report["environment"]
    ax.set_title(f"One transformer call per denoising step: {env['gpu'] or 'CPU (code-path check only)'}, "
                 f"{env['date'][:10]}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench_step.py",
        description="Per-step latency of a DiT transformer call in eager, BCG, whole-graph and compiled modes, "
        "measured interleaved in one process. See docs/benchmarks.md.",
    )
    p.add_argument("--cases", default=None,
                   help="comma-separated cases family[:size][:HxW][:fFRAMES][:bBATCH], e.g. "
                   "'pixart:full:512x512:b1,flux:full:1024x1024:b1' (default: the full matrix; --quick: a small one)")
    p.add_argument("--modes", default=None, help=f"comma-separated modes out of {','.join(MODES)} (default: all)")
    p.add_argument("--iters", type=int, default=None,
                   help=f"timed calls per mode per round (default: enough for about {AUTO_ROUND_S} s, "
                   f"{MIN_AUTO_ITERS} to {DEFAULT_ITERS} calls; --quick: {QUICK_ITERS})")
    p.add_argument("--rounds", type=int, default=None, help=f"interleaved rounds (default {DEFAULT_ROUNDS})")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed calls per mode after set-up (default 3)")
    p.add_argument("--quick", action="store_true",
                   help="a preset that finishes in under 5 minutes on one H200: PixArt and SD3.5 at 512 px, "
                   f"modes eager/bcg/whole_graph (+ compile on PixArt), {QUICK_ITERS} x {QUICK_ROUNDS} calls")
    p.add_argument("--e2e", action=argparse.BooleanOptionalAction, default=None,
                   help="also time a full pipe(...) call eager vs BCG (first call with capture, then a second). "
                   "Default: on for --cases and --quick, and for the launch-bound cases of the default matrix")
    p.add_argument("--e2e-steps", type=int, default=None, help="steps of the end-to-end call (default: the family's)")
    p.add_argument("--check-weights", choices=("per_pipeline_call", "every_call", "auto"), default="per_pipeline_call",
                   help="BCGConfig.check_weights of the bcg modes. The benchmark calls a bare transformer, for which "
                   "the library default ('auto') recomputes the weight fingerprint on every call; inside a pipeline "
                   "it is read once per pipeline call, which the default here mimics (default: per_pipeline_call)")
    p.add_argument("--dtype", choices=gen.DTYPE_CHOICES, default=None, help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, default=Path("bench_results"), help="default: bench_results/")
    p.add_argument("--shard", default=None, metavar="K/N",
                   help="run only shard K of N of the chosen cases (families dealt out round-robin, so each family "
                   "runs whole in one shard); combine the shards' JSON files afterwards with --merge")
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="start no new case after this many seconds (the first always runs; the rest are reported "
                   "as not run); results "
                   "are written after every case, so a run stopped from outside keeps the finished cases")
    p.add_argument("--merge", nargs="+", type=Path, default=None, metavar="JSON",
                   help="measure nothing: combine result files (e.g. the shards of one matrix, same GPU, versions and "
                   "commit) into one JSON, Markdown table and chart")
    p.add_argument("--allow-different-commits", action="store_true",
                   help="with --merge: accept files from different commits of this project (each file's commit "
                   "is listed in the result)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        opts = parser.parse_args(argv)
        if opts.merge:
            return main_merge(opts.merge, opts.out_dir, opts.allow_different_commits)
        for name in ("iters", "rounds", "e2e_steps"):
            v = getattr(opts, name)
            if v is not None and v < 1:
                parser.error(f"--{name.replace('_', '-')} must be >= 1 (got {v})")
        if opts.warmup < 1:
            parser.error(f"--warmup must be >= 1 (got {opts.warmup})")
        modes_override = None
        if opts.modes:
            modes_override = [m.strip() for m in opts.modes.split(",") if m.strip()]
            bad = [m for m in modes_override if m not in MODES]
            if bad:
                parser.error(f"--modes: unknown mode(s) {', '.join(bad)}; choose from {', '.join(MODES)}")
        try:
            api = gen.pipelines_api()
        except ImportError as exc:
            print(f"error: cannot use the pipelines package: {exc}", file=sys.stderr)
            return 1
        import torch

        cuda = torch.cuda.is_available()
        if opts.cases:  # a case of the default matrix keeps its modes and end-to-end setting there
            matrix = {parse_case(text).label: (modes, e2e) for text, modes, e2e in DEFAULT_MATRIX}
            raw = []
            for c in (c for c in opts.cases.split(",") if c.strip()):
                try:
                    modes, e2e = matrix.get(parse_case(c).label, (None, True))
                except ValueError:
                    modes, e2e = None, True  # reported below
                raw.append((c, modes, e2e))
        elif opts.quick:
            raw = list(QUICK_MATRIX)
        else:
            raw = list(DEFAULT_MATRIX)
        shard = None
        if opts.shard:
            try:
                shard = parse_shard(opts.shard)
            except ValueError as exc:
                parser.error(str(exc))
            raw = [raw[i] for i in shard_cases([r[0] for r in raw], *shard)]
            if not raw:
                parser.error(f"--shard {opts.shard}: no cases in this shard (fewer families than shards)")
        if opts.time_budget is not None and opts.time_budget <= 0:
            parser.error(f"--time-budget must be > 0 seconds (got {opts.time_budget})")
        cases, skipped = [], []
        known = api.list_families()
        for text, case_modes, case_e2e in raw:
            try:
                case = parse_case(text)
                if case.family not in known:
                    raise ValueError(f"unknown family {case.family!r}; known families: {', '.join(known)}")
                case.modes, case.e2e = case_modes, case_e2e
                cases.append(resolve_case(case, api, cuda))
            except ValueError as exc:
                if opts.cases:
                    parser.error(f"--cases: {exc}")
                skipped.append({"case": text, "error": str(exc)})
    except SystemExit as exc:
        return int(exc.code or 0)
    opts.iters = opts.iters or (QUICK_ITERS if opts.quick else None)  # None: auto_iters per mode
    opts.rounds = opts.rounds or (QUICK_ROUNDS if opts.quick else DEFAULT_ROUNDS)

    if not cuda:  # one tiny case per family is enough to test the code path
        seen, unique = set(), []
        for c in cases:
            if c.label not in seen:
                seen.add(c.label)
                unique.append(c)
        cases = unique
    device = torch.device("cuda" if cuda else "cpu")
    dtype = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
             "fp32": torch.float32, "float32": torch.float32}.get(opts.dtype) or (torch.bfloat16 if cuda else torch.float32)
    clock = Clock(cuda)

    def log(msg: str) -> None:
        print(msg, flush=True)

    if not cuda:
        log("note: no CUDA GPU: running eager and bcg (a no-op without CUDA) on tiny models to test the code path; "
            "whole_graph and the compile modes are n/a (needs CUDA). CPU timings say nothing about BCG.")
    try:  # several weight-sharing copies of one block class are compiled per case
        import torch._dynamo

        for knob in ("cache_size_limit", "recompile_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, max(64, getattr(torch._dynamo.config, knob)))
    except Exception:  # noqa: BLE001
        pass

    env = environment(device, dtype, cuda)
    report: dict[str, Any] = {
        "environment": env,
        "settings": {"iters": opts.iters, "rounds": opts.rounds, "warmup": opts.warmup, "e2e": opts.e2e,
                     "e2e_steps": opts.e2e_steps, "seed": opts.seed, "quick": opts.quick,
                     "shard": opts.shard, "time_budget_s": opts.time_budget,
                     "bcg_config_of_step_modes": bcg_options(opts),
                     "argv": sys.argv[1:] if argv is None else list(argv),
                     "timing": "CUDA events per call" if cuda else "perf_counter per call (no CUDA)"},
        "modes": {m: {"description": MODE_HELP[m], "torch_compile": m in COMPILED} for m in MODES},
        "cases": [],
        "skipped_cases": skipped,
    }
    for s in skipped:
        log(f"skipping {s['case']}: {s['error']}")
    log(f"bench_step: {len(cases)} case(s) on {env['gpu'] or 'CPU'}, torch {env['torch']}, diffusers {env['diffusers']}"
        + (f", shard {opts.shard}" if opts.shard else ""))
    base = output_base(opts.out_dir)
    t_start = time.perf_counter()
    for i, case in enumerate(cases, 1):
        elapsed = time.perf_counter() - t_start
        if opts.time_budget is not None and i > 1 and elapsed > opts.time_budget:
            report["not_run"] = [c.label for c in cases[i - 1:]]
            log(f"time budget of {opts.time_budget:.0f} s spent after {elapsed:.0f} s: not running "
                + ", ".join(report["not_run"]))
            break
        modes = modes_override or list(case.modes or MODES)
        log(f"[{i}/{len(cases)}] {case.label}: modes {', '.join(modes)}" + (f" ({case.note})" if case.note else ""))
        report["cases"].append(run_case(case, modes, opts, api, device, dtype, clock, log))
        report["total_s"] = time.perf_counter() - t_start
        write_report(report, base, chart=False)  # a run stopped from outside keeps the finished cases
    report["total_s"] = time.perf_counter() - t_start
    log(f"done in {report['total_s']:.0f} s")
    for path in write_report(report, base, chart=True, log=log):
        log(f"wrote {path}")
    return 0


def output_base(out_dir: Path) -> Path:
    """A fresh ``out_dir/bench_step_<date>_<time>[_N]`` (no file of that name exists yet)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"bench_step_{_dt.datetime.now().strftime('%Y-%m-%d_%H%M%S')}"
    base, n = out_dir / stem, 1
    while any(base.with_suffix(s).exists() for s in (".json", ".md", ".png")):
        n += 1
        base = out_dir / f"{stem}_{n}"
    return base


def write_report(report: dict[str, Any], base: Path, chart: bool, log=None) -> list[Path]:
    """Write ``base``.json and .md (and, with ``chart``, .png); return the paths written."""
    json_path, md_path, png_path = (base.with_suffix(s) for s in (".json", ".md", ".png"))
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    md_path.write_text(markdown_report(report))
    written = [json_path, md_path]
    if chart:
        try:
            plot_report(report, png_path)
            written.append(png_path)
        except ImportError:  # matplotlib is an optional extra: the numbers are in the JSON and Markdown
            if log:
                log(CHART_NEEDS_MATPLOTLIB)
        except Exception as exc:  # noqa: BLE001 - the numbers matter more than the chart
            if log:
                log(f"could not draw the chart: {_err(exc)}")
    return written


MERGE_MUST_AGREE = ("gpu", "torch", "cuda", "diffusers", "dtype", "git_commit")


def merge_reports(paths: list[Path], allow_different_commits: bool = False) -> dict[str, Any]:
    """One report from several result files of the same set-up (``ValueError`` saying what differs).

    With ``allow_different_commits`` the files may come from different commits of this project; each
    file's commit is kept in ``merged_from`` and the Markdown says so.

    Cases keep the order of the default matrix where they belong to it, else the order of the files; a
    case may appear in only one file.
    """
    reports = []
    for path in paths:
        try:
            reports.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read {path}: {exc}") from exc
        if not isinstance(reports[-1], dict) or "environment" not in reports[-1] or "cases" not in reports[-1]:
            raise ValueError(f"{path} is not a bench_step result file (no 'environment' and 'cases')")
    first, first_settings = reports[0]["environment"], reports[0]["settings"]
    for path, rep in zip(paths[1:], reports[1:]):
        for key in MERGE_MUST_AGREE:
            if key == "git_commit" and allow_different_commits:
                continue
            if rep["environment"].get(key) != first.get(key):
                raise ValueError(f"{path}: {key} is {rep['environment'].get(key)!r} but {paths[0]} has "
                                 f"{first.get(key)!r}; merge only results of one set-up")
        for key in ("iters", "rounds", "warmup", "check_weights"):
            if rep["settings"].get(key) != first_settings.get(key):
                raise ValueError(f"{path}: setting {key} is {rep['settings'].get(key)!r} but {paths[0]} has "
                                 f"{first_settings.get(key)!r}; merge only results measured alike")
    cases, seen = [], {}
    for path, rep in zip(paths, reports):
        for case in rep["cases"]:
            if case["case"] in seen:
                raise ValueError(f"case {case['case']} is in both {seen[case['case']]} and {path}")
            seen[case["case"]] = path
            cases.append(case)
    order = {text: i for i, text in enumerate(DEFAULT_CASES)}
    cases.sort(key=lambda c: order.get(c["case"], len(order)))  # stable: others keep file order
    settings = dict(first_settings, shard=None, argv=None)
    commits = sorted({str(rep["environment"].get("git_commit")) for rep in reports})
    environment = dict(first)
    if len(commits) > 1:
        environment["git_commit"] = " + ".join(commits)
    return {
        "environment": environment,
        "settings": settings,
        "modes": reports[0].get("modes", {}),
        "cases": cases,
        "skipped_cases": [s for rep in reports for s in rep.get("skipped_cases", [])],
        "not_run": [c for rep in reports for c in rep.get("not_run", []) if c not in seen],  # unless run elsewhere
        "total_s": sum(rep.get("total_s") or 0.0 for rep in reports),
        "merged_from": [
            {"file": Path(p).name, "date": rep["environment"].get("date"), "shard": rep["settings"].get("shard"),
             "git_commit": rep["environment"].get("git_commit"),
             "argv": rep["settings"].get("argv"), "total_s": rep.get("total_s"), "cases": [c["case"] for c in rep["cases"]]}
            for p, rep in zip(paths, reports)
        ],
    }


def main_merge(paths: list[Path], out_dir: Path, allow_different_commits: bool = False) -> int:
    try:
        report = merge_reports(paths, allow_different_commits)
    except ValueError as exc:
        print(f"error: --merge: {exc}", file=sys.stderr)
        return 2
    for path in write_report(report, output_base(out_dir), chart=True, log=print):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
