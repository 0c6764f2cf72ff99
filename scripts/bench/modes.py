"""How one transformer call is run in each mode: a registry of modes, each a set-up function.

To add a mode (a compile policy, a quantized variant of a mode, ...): write ``setup(ctx) -> Runner`` and
call :func:`register` with its :class:`Mode`. Modes run in registry order within a round, BCG modes last.
Every mode but eager works on its own weight-sharing copy of the transformer, so compiled and BCG modes
never stack by accident and eager stays eager.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

import bcg_diffusion
from speedups import quiet_library_warnings, regional_compile

from .trees import clone_tree, copy_tree_, first_tensor, weight_sharing_copy

STATS_FIELDS = ("hits", "misses", "captures", "eager_calls", "capture_time_s", "graph_memory_bytes")
ENTRY_FIELDS = ("key", "segments", "breaks", "capture_time_s", "memory_bytes", "hits", "fallback")


class StepContext:
    """The transformer and the recorded inputs of a real denoising step, shared by all modes of a case."""

    def __init__(self, transformer, args, kwargs, cuda: bool, bcg_options: dict[str, Any]):
        self.transformer = transformer
        self.args = args
        self.kwargs = kwargs
        self.cuda = cuda
        self.bcg_options = dict(bcg_options)

    def call(self, module):
        return module(*self.args, **self.kwargs)


@dataclass
class Runner:
    """A mode, set up: ``fn()`` makes one call and returns its output tensor."""

    name: str
    fn: Callable[[], Any]
    module: Any = None  # the module this mode calls (BCG modes: the accelerated copy)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # numbers to report (capture_s, ...)
    bcg_options: dict[str, Any] | None = None  # BCG modes: the BCGConfig fields
    accelerated: bool = False
    activations: int = 0
    iters: int = 1  # timed calls per round

    @property
    def is_bcg(self) -> bool:
        return self.bcg_options is not None

    def activate(self, cuda: bool) -> None:
        """BCG modes: accelerate the copy (again), which recaptures on the next calls."""
        if self.is_bcg and not self.accelerated:
            accelerate_copy(self.module, cuda, self.bcg_options)
            self.accelerated = True
            self.activations += 1

    def deactivate(self) -> None:
        """BCG modes: remove the acceleration (BCG patches attention process-wide while any module has it)."""
        if self.is_bcg and self.accelerated:
            self.accelerated = False
            bcg_diffusion.remove_acceleration(self.module)


@dataclass(frozen=True)
class Mode:
    name: str
    description: str
    setup: Callable[[StepContext], Runner]
    needs_cuda: bool = False
    torch_compile: bool = False
    bcg: bool = False  # accelerated with BCG: runs last in each round (see measure.time_rounds)


MODE_REGISTRY: dict[str, Mode] = {}


def register(mode: Mode) -> Mode:
    """Add ``mode`` to the registry (the order of registration is the order of the tables)."""
    MODE_REGISTRY[mode.name] = mode
    return mode


def accelerate_copy(module, cuda: bool, options: dict[str, Any]):
    config = bcg_diffusion.BCGConfig(**options)
    if cuda:
        return bcg_diffusion.accelerate_transformer(module, config)
    with quiet_library_warnings():  # the no-CUDA no-op was announced once at start
        return bcg_diffusion.accelerate_transformer(module, config)


def bcg_stats_dict(module) -> dict[str, Any] | None:
    """``get_stats(module)`` as a JSON-able dict (``None`` when the module is not accelerated)."""
    try:
        stats = bcg_diffusion.get_stats(module)
    except Exception as exc:  # noqa: BLE001 - the statistics must not cost the measurement
        return {"error": f"{type(exc).__name__}: {exc}"}
    if stats is None:
        return None
    out = {k: getattr(stats, k, None) for k in STATS_FIELDS}
    out["entries"] = [{k: getattr(e, k, None) for k in ENTRY_FIELDS} for e in stats.entries]
    out["text"] = str(stats)
    return out


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
        raise RuntimeError(f"whole-step capture failed: {type(exc).__name__}: {exc}") from exc
    torch.cuda.synchronize()
    capture_s = time.perf_counter() - t0

    def replay():
        copy_tree_(static_args, ctx.args)  # what a real caller must do: live inputs into the static buffers
        copy_tree_(static_kwargs, ctx.kwargs)
        graph.replay()
        return static_out.clone()  # ... and copy the output out before the next replay overwrites it

    return Runner("whole_graph", replay, extra={"graph": graph, "capture_s": capture_s},
                  notes=["3 warm-up calls on a side stream, then one torch.cuda.graph capture; each call copies "
                         "the inputs in and clones the output"])


def _compiled_copy(ctx: StepContext) -> tuple[Any, str, float]:
    module = weight_sharing_copy(ctx.transformer)
    desc = regional_compile(module)
    t0 = time.perf_counter()
    for _ in range(2):  # compile now (and not under a BCG capture later)
        ctx.call(module)
    if ctx.cuda:
        torch.cuda.synchronize()
    return module, desc, time.perf_counter() - t0


def setup_compile(ctx: StepContext) -> Runner:
    module, desc, secs = _compiled_copy(ctx)
    return Runner("compile", lambda: first_tensor(ctx.call(module)), module=module, notes=[desc],
                  extra={"compile_calls_s": secs})


def setup_compile_bcg(ctx: StepContext) -> Runner:
    module, desc, secs = _compiled_copy(ctx)
    runner = Runner("compile_bcg", lambda: first_tensor(ctx.call(module)), module=module,
                    notes=[desc + ", then accelerate_transformer"], extra={"compile_calls_s": secs},
                    bcg_options=ctx.bcg_options)
    runner.activate(ctx.cuda)
    return runner


def setup_reduce_overhead(ctx: StepContext) -> Runner:
    compiled = torch.compile(weight_sharing_copy(ctx.transformer), mode="reduce-overhead")

    def call():
        torch.compiler.cudagraph_mark_step_begin()
        return first_tensor(ctx.call(compiled)).clone()

    return Runner("reduce_overhead", call, module=compiled,
                  notes=["torch.compile(transformer, mode='reduce-overhead') of the whole module "
                         "(cudagraph trees); output cloned"])


register(Mode("eager", "the transformer as diffusers runs it (the baseline)", setup_eager))
register(Mode("bcg", "breakable CUDA graphs: graph segments with attention run eagerly between them", setup_bcg,
              bcg=True))
register(Mode("whole_graph", "one torch.cuda.CUDAGraph of the whole call (static inputs): the practical floor",
              setup_whole_graph, needs_cuda=True))
register(Mode("compile", "regional torch.compile (default mode) of the repeated blocks", setup_compile,
              needs_cuda=True, torch_compile=True))
register(Mode("compile_bcg", "regional torch.compile plus breakable CUDA graphs", setup_compile_bcg,
              needs_cuda=True, torch_compile=True, bcg=True))
register(Mode("reduce_overhead", "torch.compile(transformer, mode='reduce-overhead') of the whole module",
              setup_reduce_overhead, needs_cuda=True, torch_compile=True))

MODES = tuple(MODE_REGISTRY)
CUDA_ONLY = tuple(m.name for m in MODE_REGISTRY.values() if m.needs_cuda)
COMPILED = tuple(m.name for m in MODE_REGISTRY.values() if m.torch_compile)
BCG_MODES = tuple(m.name for m in MODE_REGISTRY.values() if m.bcg)
