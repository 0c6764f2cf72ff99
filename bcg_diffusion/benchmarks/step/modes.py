"""How one transformer call is run in each mode: a registry of modes, each a set-up function.

To add a mode (a compile policy, a quantized variant of a mode, ...): write ``setup(ctx) -> Runner`` and
call :func:`register` with its :class:`Mode`. Modes run in registry order within a round, the modes that
patch attention process-wide (BCG modes, ``partition_ceiling``) last. Every mode but eager works on its
own weight-sharing copy of the transformer, so compiled and BCG modes never stack by accident and eager
stays eager (on a context-parallel case eager too gets a copy, with parallelism enabled on every copy;
only modes registered ``with_context_parallel`` run there). :data:`DEFAULT_MODES` are the modes of the
default matrix and of ``--cases`` without ``--modes``; the others run when ``--modes`` names them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

import bcg_diffusion
from bcg_diffusion.toolkit.speedups import quiet_library_warnings, regional_compile, regional_compile_all

from ..trees import clone_tree, copy_tree_, first_tensor, weight_sharing_copy
from .names import DEFAULT_MODES, MODE_NAMES

# The inductor config of partition_ceiling: Inductor partitions its CUDA graphs at the attention custom ops.
PARTITION_OPS = ["bcg::sdpa", "bcg::dispatch_attention"]
STATS_FIELDS = ("hits", "misses", "captures", "eager_calls", "capture_time_s", "graph_memory_bytes")
ENTRY_FIELDS = ("key", "segments", "breaks", "capture_time_s", "memory_bytes", "hits", "fallback")


class StepContext:
    """The transformer and the recorded inputs of a real denoising step, shared by all modes of a case.

    ``prepare(module) -> (module, notes)``, where given, is applied to every module a mode calls (context
    parallelism: each mode gets its own copy with it enabled, eager included); ``agree(value)`` returns the
    value every rank uses (rank 0's; the identity in one process)."""

    def __init__(self, transformer, args, kwargs, cuda: bool, bcg_options: dict[str, Any],
                 prepare: Callable[[Any], tuple[Any, list[str]]] | None = None,
                 agree: Callable[[Any], Any] | None = None):
        self.transformer = transformer
        self.args = args
        self.kwargs = kwargs
        self.cuda = cuda
        self.bcg_options = dict(bcg_options)
        self.prepare = prepare
        self.agree = agree or (lambda value: value)
        self.prepare_notes: list[str] = []

    @property
    def parallel(self) -> bool:
        """Every mode runs on a prepared (context-parallel) copy."""
        return self.prepare is not None

    def call(self, module):
        return module(*self.args, **self.kwargs)

    def fresh_copy(self):
        """A weight-sharing copy of the transformer for one mode, prepared where ``prepare`` says."""
        module = weight_sharing_copy(self.transformer)
        if self.prepare is not None:
            module, self.prepare_notes = self.prepare(module)
        return module

    def eager_module(self):
        """The module eager calls: the transformer itself, or a prepared copy of it."""
        return self.fresh_copy() if self.prepare is not None else self.transformer


class ModeUnavailable(RuntimeError):
    """The mode cannot run in this environment (reported as ``n/a`` with the reason, not as an error)."""


@dataclass
class Runner:
    """A mode, set up: ``fn()`` makes one call and returns its output tensor.

    Modes that patch attention process-wide are *active* only during their own turn: BCG modes (the copy
    is accelerated) and those with ``on_activate`` / ``on_deactivate`` (``partition_ceiling`` installs the
    attention wrappers). ``teardown`` runs once when the case is done with the mode.
    """

    name: str
    fn: Callable[[], Any]
    module: Any = None  # the module this mode calls (BCG modes: the accelerated copy)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # numbers to report (capture_s, ...)
    bcg_options: dict[str, Any] | None = None  # BCG modes: the BCGConfig fields
    accelerated: bool = False
    activations: int = 0
    iters: int = 1  # timed calls per round
    on_activate: Callable[[], None] | None = None  # non-BCG modes that patch attention (partition_ceiling)
    on_deactivate: Callable[[], None] | None = None
    teardown: Callable[[], None] | None = None

    @property
    def is_bcg(self) -> bool:
        return self.bcg_options is not None

    @property
    def patches_attention(self) -> bool:
        """Active only in its own turn (BCG modes and modes with ``on_activate``)."""
        return self.is_bcg or self.on_activate is not None

    def activate(self, cuda: bool) -> None:
        """BCG modes: accelerate the copy (again), which recaptures on the next calls; others: ``on_activate``."""
        if not self.patches_attention or self.accelerated:
            return
        if self.is_bcg:
            accelerate_copy(self.module, cuda, self.bcg_options)
        else:
            self.on_activate()
        self.accelerated = True
        self.activations += 1

    def deactivate(self) -> None:
        """BCG modes: remove the acceleration (BCG patches attention process-wide while any module has it);
        others: ``on_deactivate``."""
        if not self.patches_attention or not self.accelerated:
            return
        self.accelerated = False
        if self.is_bcg:
            bcg_diffusion.remove_acceleration(self.module)
        elif self.on_deactivate is not None:
            self.on_deactivate()

    def close(self) -> None:
        """Deactivate, then ``teardown`` (once)."""
        try:
            self.deactivate()
        finally:
            teardown, self.teardown = self.teardown, None
            if teardown is not None:
                teardown()


@dataclass(frozen=True)
class Mode:
    name: str
    description: str
    setup: Callable[[StepContext], Runner]
    needs_cuda: bool = False
    torch_compile: bool = False
    bcg: bool = False  # accelerated with BCG: runs last in each round (see measure.time_rounds)
    patches_attention: bool = False  # installs the attention wrappers without BCG: runs with the BCG modes
    with_context_parallel: bool = False  # measured on context-parallel cases (cpN) too

    @property
    def exclusive(self) -> bool:
        """Patches attention process-wide while active: active only in its own turn, after the others."""
        return self.bcg or self.patches_attention


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
    if not stats.active:
        return None
    out = {k: getattr(stats, k, None) for k in STATS_FIELDS}
    out["entries"] = [{k: getattr(e, k, None) for k in ENTRY_FIELDS} for e in stats.entries]
    out["text"] = str(stats)
    return out


def setup_eager(ctx: StepContext) -> Runner:
    t = ctx.eager_module()
    return Runner("eager", lambda: first_tensor(ctx.call(t)), module=t, notes=list(ctx.prepare_notes))


def _bcg_runner(name: str, ctx: StepContext, module, notes: list[str], attention: str | None = None,
                extra: dict[str, Any] | None = None) -> Runner:
    """A BCG mode on ``module``, accelerated (``attention``: the BCGConfig policy; None: the library default)."""
    options = dict(ctx.bcg_options, **({"attention": attention} if attention else {}))
    if attention:
        notes = notes + [f"BCGConfig(attention={attention!r})"]
    runner = Runner(name, lambda: first_tensor(ctx.call(module)), module=module, notes=notes, extra=extra or {},
                    bcg_options=options)
    runner.activate(ctx.cuda)
    return runner


def _sync(ctx: StepContext) -> None:
    if ctx.cuda:
        torch.cuda.synchronize()


def setup_bcg(ctx: StepContext, name: str = "bcg", attention: str | None = None) -> Runner:
    module = ctx.fresh_copy()
    notes = ["accelerate_transformer on a weight-sharing copy of the transformer"]
    if not ctx.cuda:
        notes.append("no CUDA: accelerate_transformer is a no-op, so this is eager")
    return _bcg_runner(name, ctx, module, notes, attention)


def setup_bcg_break(ctx: StepContext) -> Runner:
    return setup_bcg(ctx, "bcg_break", attention="break")


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


def _compiled_copy(ctx: StepContext, compile_fn: Callable[..., str] = regional_compile,
                   **compile_kwargs) -> tuple[Any, str, float]:
    module = ctx.fresh_copy()
    desc = compile_fn(module, **compile_kwargs)
    t0 = time.perf_counter()
    for _ in range(2):  # compile now (and not under a BCG capture later)
        ctx.call(module)
    _sync(ctx)
    return module, desc, time.perf_counter() - t0


def setup_compile(ctx: StepContext, name: str = "compile", compile_fn: Callable[..., str] = regional_compile) -> Runner:
    module, desc, secs = _compiled_copy(ctx, compile_fn)
    return Runner(name, lambda: first_tensor(ctx.call(module)), module=module, notes=[desc],
                  extra={"compile_calls_s": secs})


def setup_compile_bcg(ctx: StepContext, name: str = "compile_bcg", attention: str | None = None,
                      compile_fn: Callable[..., str] = regional_compile, **compile_kwargs) -> Runner:
    module, desc, secs = _compiled_copy(ctx, compile_fn, **compile_kwargs)
    return _bcg_runner(name, ctx, module, [desc + ", then accelerate_transformer"], attention,
                       extra={"compile_calls_s": secs})


def setup_compile_all(ctx: StepContext) -> Runner:
    return setup_compile(ctx, "compile_all", compile_fn=regional_compile_all)


def setup_compile_bcg_all(ctx: StepContext) -> Runner:
    return setup_compile_bcg(ctx, "compile_bcg_all", compile_fn=regional_compile_all)


def setup_compile_bcg_break(ctx: StepContext) -> Runner:
    return setup_compile_bcg(ctx, "compile_bcg_break", attention="break")


def setup_compile_bcg_dynamic(ctx: StepContext) -> Runner:
    return setup_compile_bcg(ctx, "compile_bcg_dynamic", dynamic=True)


def setup_compile_full_bcg(ctx: StepContext) -> Runner:
    """Whole-module compile (default mode: no CUDA graphs of Inductor) below BCG: the copy's ``forward`` is
    replaced by its compiled version (an instance attribute), then the copy is accelerated, so BCG's runner
    is outermost and the compiled forward, with attention as the bcg custom ops, runs inside it."""
    module = ctx.fresh_copy()
    module.forward = torch.compile(module.forward)
    notes = ["whole-module torch.compile (default mode) of forward on a weight-sharing copy, then accelerate_transformer"]
    runner = _bcg_runner("compile_full_bcg", ctx, module, notes)
    try:
        t0 = time.perf_counter()
        for _ in range(2):  # compile (in BCG's warm-up) and capture now; later calls replay
            ctx.call(module)
        _sync(ctx)
    except BaseException:
        runner.close()
        raise
    runner.extra["compile_calls_s"] = secs = time.perf_counter() - t0
    runner.notes.append(f"compile + first capture: {secs:.1f} s")
    return runner


def setup_reduce_overhead(ctx: StepContext) -> Runner:
    compiled = torch.compile(weight_sharing_copy(ctx.transformer), mode="reduce-overhead")

    def call():
        torch.compiler.cudagraph_mark_step_begin()
        return first_tensor(ctx.call(compiled)).clone()

    return Runner("reduce_overhead", call, module=compiled,
                  notes=["torch.compile(transformer, mode='reduce-overhead') of the whole module "
                         "(cudagraph trees); output cloned"])


def partition_config_problem(inductor_config: Any = None) -> str | None:
    """Why Inductor cannot partition its CUDA graphs at the attention op in this torch (``None`` if it can);
    ``inductor_config``: ``torch._inductor.config`` unless given (tests)."""
    if inductor_config is None:
        import torch._inductor.config as inductor_config

    missing = [k for k in ("graph_partition", "custom_should_partition_ops") if not hasattr(inductor_config, k)]
    if missing:
        return (f"torch {torch.__version__} has no torch._inductor.config.{' or '.join(missing)}, so Inductor cannot "
                "partition its CUDA graphs at the attention op")
    return None


def setup_partition_ceiling(ctx: StepContext, inductor_config: Any = None) -> Runner:
    """The ceiling of compiled code with eager attention, done by torch itself: ``torch.compile(copy,
    mode="reduce-overhead")`` with Inductor's graph partition, split at the attention custom ops (the
    library's attention wrappers, installed with ``bcg_diffusion.install_attention_breaks`` while this mode is
    active, make attention the ops when traced). The inductor config is patched around every call, so compilation (on the first calls,
    and any recompile) sees it; other modes never do."""
    problem = partition_config_problem(inductor_config)
    if problem:
        raise ModeUnavailable(problem)
    module = weight_sharing_copy(ctx.transformer)
    compiled = torch.compile(module, mode="reduce-overhead")
    config = torch._inductor.config.patch(graph_partition=True, custom_should_partition_ops=list(PARTITION_OPS))
    undo: list[Callable[[], None]] = []

    def install():
        undo.append(bcg_diffusion.install_attention_breaks(module).remove)

    def uninstall():
        while undo:
            undo.pop()()

    def call():
        torch.compiler.cudagraph_mark_step_begin()
        with config:
            out = first_tensor(ctx.call(compiled))
        return out.clone()

    runner = Runner("partition_ceiling", call, module=compiled, on_activate=install, on_deactivate=uninstall,
                    teardown=uninstall,
                    notes=["torch.compile(transformer, mode='reduce-overhead') of the whole module with "
                           f"graph_partition=True, custom_should_partition_ops={PARTITION_OPS}: Inductor's CUDA "
                           "graphs split at attention, which runs eagerly; output cloned"])
    runner.activate(ctx.cuda)
    return runner


register(Mode("eager", "the transformer as diffusers runs it (the baseline)", setup_eager, with_context_parallel=True))
register(Mode("bcg", "breakable CUDA graphs with the library's default attention policy (capture_safe: attention "
              "captured where its kernel is known capturable, an eager break elsewhere)", setup_bcg, bcg=True,
              with_context_parallel=True))
register(Mode("bcg_break", "breakable CUDA graphs with BCGConfig(attention='break'): every attention call an eager "
              "break", setup_bcg_break, bcg=True, with_context_parallel=True))
register(Mode("whole_graph", "one torch.cuda.CUDAGraph of the whole call (static inputs): the practical floor",
              setup_whole_graph, needs_cuda=True))
register(Mode("compile", "regional torch.compile (default mode) of the repeated blocks", setup_compile,
              needs_cuda=True, torch_compile=True, with_context_parallel=True))
register(Mode("compile_bcg", "regional torch.compile plus breakable CUDA graphs (default attention policy)",
              setup_compile_bcg, needs_cuda=True, torch_compile=True, bcg=True, with_context_parallel=True))
register(Mode("compile_all", "regional torch.compile of the repeated blocks and of every leftover direct child "
              "(embedders, norms, output head; speedups.regional_compile_all), no BCG", setup_compile_all,
              needs_cuda=True, torch_compile=True, with_context_parallel=True))
register(Mode("compile_bcg_all", "compile_all plus breakable CUDA graphs: every module of the step compiled, the "
              "transformer's forward Python eager and replayed", setup_compile_bcg_all, needs_cuda=True,
              torch_compile=True, bcg=True, with_context_parallel=True))
register(Mode("compile_bcg_break", "regional torch.compile plus breakable CUDA graphs with attention='break'",
              setup_compile_bcg_break, needs_cuda=True, torch_compile=True, bcg=True))
register(Mode("compile_bcg_dynamic", "regional torch.compile with dynamic=True, then breakable CUDA graphs",
              setup_compile_bcg_dynamic, needs_cuda=True, torch_compile=True, bcg=True))
register(Mode("compile_full_bcg", "whole-module torch.compile (default mode, no Inductor CUDA graphs) of forward, "
              "under breakable CUDA graphs (the BCG runner outermost)", setup_compile_full_bcg, needs_cuda=True,
              torch_compile=True, bcg=True))
register(Mode("reduce_overhead", "torch.compile(transformer, mode='reduce-overhead') of the whole module",
              setup_reduce_overhead, needs_cuda=True, torch_compile=True))
register(Mode("partition_ceiling", "torch.compile(transformer, mode='reduce-overhead') with Inductor's graph "
              "partition at the attention custom ops: compiled code with eager attention, done by torch (the ceiling "
              "for compile + BCG)", setup_partition_ceiling, needs_cuda=True, torch_compile=True,
              patches_attention=True))

MODES = tuple(MODE_REGISTRY)
if MODES != MODE_NAMES:  # the parser offers names.MODE_NAMES before this module is imported
    raise RuntimeError(f"modes.MODE_REGISTRY {MODES} and names.MODE_NAMES {MODE_NAMES} differ; keep them equal")
CUDA_ONLY = tuple(m.name for m in MODE_REGISTRY.values() if m.needs_cuda)
COMPILED = tuple(m.name for m in MODE_REGISTRY.values() if m.torch_compile)
BCG_MODES = tuple(m.name for m in MODE_REGISTRY.values() if m.bcg)
EXCLUSIVE_MODES = tuple(m.name for m in MODE_REGISTRY.values() if m.exclusive)  # active in their own turn only
CONTEXT_PARALLEL_MODES = tuple(m.name for m in MODE_REGISTRY.values() if m.with_context_parallel)
