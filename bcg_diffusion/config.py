"""Configuration of pipeline acceleration (:class:`BCGConfig`), of weight streaming (:class:`OffloadConfig`) and
the operator environment switches."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

ENV_ENABLE = "BCG_DIFFUSION"
ENV_DEBUG = "BCG_DIFFUSION_DEBUG"
ATTENTION_POLICIES = ("capture_safe", "break")


@dataclass(frozen=True)
class OffloadConfig:
    """Weight streaming: a transformer larger than the GPU runs with its repeated blocks in host memory.

    Each block's parameters and buffers are packed into one host buffer (page-locked where CUDA is
    there); ``slots`` device buffers, each the size of the largest block, hold the block being computed
    and the next ones; block ``i`` always computes from slot ``i % slots``, so a captured graph reads its
    weights at the same addresses on every replay. A copy stream loads the next block while the current
    one computes. Everything else (embedders, final norm and projection) stays on the device.
    See docs/accelerate.md "Weight streaming".

    Attributes:
        slots: device buffers (K >= 2; at most the number of blocks). More slots load further ahead
            (K - 1 blocks) and cost K x the largest block of device memory.
        pin_memory: register the host copies with CUDA (page-locked), so that copies run asynchronously
            beside the compute. ``False`` keeps pageable memory (copies then hold the host until done).
            Without CUDA the copies are plain CPU copies either way.
        device: where the blocks compute, e.g. ``"cuda:1"``; ``None``: the current CUDA device, or the CPU
            where CUDA is absent.
        measure_waits: time with CUDA events how long the compute stream waited for copies
            (``get_stats(...).offload.wait_s``); off by default (two events per block call).
    """

    slots: int = 2
    pin_memory: bool = True
    device: str | None = None
    measure_waits: bool = False

    def __post_init__(self) -> None:
        if not _is_int(self.slots) or self.slots < 2:
            raise ValueError(
                f"OffloadConfig: slots must be an int >= 2 (the block computing and the next one loading), got "
                f"{self.slots!r}; use slots=2 for the least device memory"
            )
        for name in ("pin_memory", "measure_waits"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"OffloadConfig: {name} must be a bool, got {getattr(self, name)!r}")
        if self.device is not None and not isinstance(self.device, str):
            raise ValueError(f"OffloadConfig: device must be None or a device string like 'cuda:0', got {self.device!r}")


def offload_config(value: object) -> "OffloadConfig | None":
    """``BCGConfig.offload`` as given (``None``, an :class:`OffloadConfig`, or an int: the slot count) as a config."""
    if value is None or isinstance(value, OffloadConfig):
        return value
    if _is_int(value):
        return OffloadConfig(slots=value)
    raise ValueError(f"BCGConfig: offload must be None, an OffloadConfig or a slot count (int >= 2), got {value!r}")


@dataclass(frozen=True)
class BCGConfig:
    """How :func:`~bcg_diffusion.accelerate_pipeline` captures and replays a transformer.

    Attributes:
        debug: run every segment eagerly through the same code path (static inputs, breaks,
            bridge copies, output copies), capturing nothing. Output must equal eager; use it to
            tell graph bugs from model bugs. ``BCG_DIFFUSION_DEBUG=1`` turns it on.
        max_graphs: captured keys (shapes, ...) kept per transformer; the least recently used is
            evicted beyond it. At least 1.
        memory_budget_bytes: evict least recently used graphs while the graphs of one
            transformer hold more GPU memory than this. ``None``: no budget.
        warmup_iters: calls of a new key that run eagerly before it is captured (at the next
            call). They are real calls (their results are returned); they warm lazy
            initialisation and compiled code, and record the attention output layouts the capture
            allocates. At least 1.
        text_buckets: opt-in padding of the text sequence, for transformers that take a text
            mask and whose text length varies per prompt (QwenImage): the text is padded with
            masked tokens up to the next bucket so one graph serves many prompts. Padding with
            masked tokens is exact mathematically but not bitwise (attention reduces over more
            keys), so it is off by default and the key then holds the exact length.
        log_misses: log (INFO) once per new key after the first capture which field differed
            from the closest captured key.
        eager_modules: qualified names (``"transformer_blocks.3"``) or class names of
            submodules that run as eager breaks of their own.
        allow_unknown: which modules are taken: ``None`` (default) takes every diffusers model
            class, those outside ``KNOWN_TRANSFORMERS`` (the classes with per-class knowledge) on the
            generic path (breaks at ``dispatch_attention_fn`` and ``scaled_dot_product_attention``;
            verified bitwise on every diffusion transformer class of diffusers 0.42.1), and refuses
            other modules; ``True`` takes any module; ``False`` only the classes of
            ``KNOWN_TRANSFORMERS``.
        max_narrowing: after a failed capture, how many parts may be made eager breaks of their
            own (one per retry: the innermost module, or method of one, that was running where the
            host work happened, found from the failure's frames; a second failing instance of a
            class makes the whole class eager)
            before the key falls back to eager. A failure inline in the transformer's own forward
            switches the key to module mode instead (its forward runs eagerly, its blocks replay).
        check_weights: when the weight fingerprint (addresses, version counters, adapter state)
            and the model structure (attention processors, hooks of submodules) are read again:
            ``"auto"`` (once per pipeline call under ``accelerate_pipeline``, every call for a bare
            transformer), ``"every_call"``, or ``"per_pipeline_call"``. Adding or replacing
            parameters or modules (loading LoRA) is seen on every call in all modes.
        compile: compile the whole transformer forward with ``torch.compile`` (default mode, no
            CUDA graphs of Inductor) under BCG: the runner is outermost and captures the compiled
            code; with ``attention="capture_safe"`` a step is then one compiled, captured graph.
            Costs a whole-module compile per input shape (about 30 s for PixArt-Sigma at 512 px on
            a datacenter GPU). Not with hooks on submodules (step caches): compile the blocks instead.
        attention: ``"capture_safe"`` captures attention calls whose kernel is known capture-safe
            (torch SDPA called directly, diffusers' native SDPA backends) and breaks at every other
            (any other backend, context parallelism); ``"break"`` breaks at every attention call.
        pure_forwards: forwards you replaced (on an instance, a class, or as an attention processor)
            whose Python decides nothing per call on the host, so they may be captured: qualified
            names of functions or classes (``"my_pkg.patches.fused_forward"``,
            ``"my_pkg.MyAttnProcessor"``), or module prefixes ending in ``"."``
            (``"my_pkg.patches."``). Any other replaced forward, reassigned class forward or
            attention processor class from outside diffusers runs eagerly on every call while the
            modules it calls replay (module mode; docs/accelerate.md "What a replay assumes").
            cache-dit's re-implemented forwards are known pure.
        rank_timeout_s: under diffusers context parallelism, how long a rank waits in one
            agreement round for the others (a rank that crashed or hangs without saying so); the
            ranks agree before each transformer call and after each capture
            (docs/multi-gpu.md). A rank that raises tells the others at once. Seconds, > 0.
        offload: weight streaming of each transformer's repeated blocks from host memory
            (:class:`OffloadConfig`, or an int: its slot count); ``None`` (default): the weights stay
            where they are. Applied also where acceleration is off (no CUDA, ``BCG_DIFFUSION=0``): the
            model then streams eagerly; ``remove_acceleration`` undoes it.
    """

    debug: bool = False
    max_graphs: int = 8
    memory_budget_bytes: int | None = None
    warmup_iters: int = 1
    text_buckets: tuple[int, ...] | None = None
    log_misses: bool = True
    eager_modules: tuple[str, ...] = field(default_factory=tuple)
    allow_unknown: bool | None = None
    max_narrowing: int = 6
    check_weights: str = "auto"
    attention: str = "capture_safe"
    compile: bool = False
    pure_forwards: tuple[str, ...] = field(default_factory=tuple)
    rank_timeout_s: float = 300.0
    offload: OffloadConfig | None = None

    def __post_init__(self) -> None:
        _check(isinstance(self.debug, bool), "debug must be a bool", self.debug)
        _check(_is_int(self.max_graphs) and self.max_graphs >= 1, "max_graphs must be an int >= 1", self.max_graphs)
        _check(
            self.memory_budget_bytes is None or (_is_int(self.memory_budget_bytes) and self.memory_budget_bytes > 0),
            "memory_budget_bytes must be None or a positive int (bytes)",
            self.memory_budget_bytes,
        )
        _check(_is_int(self.warmup_iters) and self.warmup_iters >= 1, "warmup_iters must be an int >= 1", self.warmup_iters)
        if self.text_buckets is not None:
            buckets = tuple(self.text_buckets)
            _check(
                len(buckets) > 0 and all(_is_int(b) and b > 0 for b in buckets) and list(buckets) == sorted(set(buckets)),
                "text_buckets must be None or strictly increasing positive ints, e.g. (128, 256, 512)",
                self.text_buckets,
            )
            object.__setattr__(self, "text_buckets", buckets)
        _check(isinstance(self.log_misses, bool), "log_misses must be a bool", self.log_misses)
        if isinstance(self.eager_modules, str):
            raise ValueError(
                f"eager_modules must be a sequence of module names, got the string {self.eager_modules!r}; "
                f"write eager_modules=({self.eager_modules!r},)"
            )
        names = tuple(self.eager_modules)
        _check(all(isinstance(n, str) and n for n in names), "eager_modules must hold non-empty strings", self.eager_modules)
        object.__setattr__(self, "eager_modules", names)
        _check(self.allow_unknown is None or isinstance(self.allow_unknown, bool), "allow_unknown must be None or a bool", self.allow_unknown)
        _check(_is_int(self.max_narrowing) and self.max_narrowing >= 0, "max_narrowing must be an int >= 0", self.max_narrowing)
        _check(
            self.check_weights in ("auto", "every_call", "per_pipeline_call"),
            "check_weights must be 'auto', 'every_call' or 'per_pipeline_call'",
            self.check_weights,
        )
        _check(self.attention in ATTENTION_POLICIES, "attention must be 'capture_safe' or 'break'", self.attention)
        _check(isinstance(self.compile, bool), "compile must be a bool", self.compile)
        if isinstance(self.pure_forwards, str):
            raise ValueError(
                f"BCGConfig: pure_forwards must be a sequence of qualified names, got the string {self.pure_forwards!r}; "
                f"write pure_forwards=({self.pure_forwards!r},)"
            )
        pure = tuple(self.pure_forwards)
        _check(
            all(isinstance(n, str) and "." in n for n in pure),
            "pure_forwards must hold qualified names like 'my_pkg.module.function' or prefixes like 'my_pkg.'",
            self.pure_forwards,
        )
        object.__setattr__(self, "pure_forwards", pure)
        _check(
            isinstance(self.rank_timeout_s, (int, float)) and not isinstance(self.rank_timeout_s, bool)
            and self.rank_timeout_s > 0,
            "rank_timeout_s must be a positive number of seconds",
            self.rank_timeout_s,
        )
        object.__setattr__(self, "offload", offload_config(self.offload))

    def with_environment(self) -> "BCGConfig":
        """This config with ``BCG_DIFFUSION_DEBUG=1`` applied."""
        if env_flag(ENV_DEBUG) and not self.debug:
            return dataclasses.replace(self, debug=True)
        return self


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(ok: bool, message: str, value: object) -> None:
    if not ok:
        raise ValueError(f"BCGConfig: {message}, got {value!r}")


def env_flag(name: str, default: bool = False) -> bool:
    """Read a boolean environment switch (``1/true/yes/on`` and ``0/false/no/off``)."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"environment variable {name}={raw!r}: use 1 or 0")
