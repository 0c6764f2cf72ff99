"""Generate an image or a video with a diffusers DiT pipeline, eagerly or with breakable CUDA graphs (BCG).

With no arguments it builds the tiny random-weight Flux pipeline of ``pipelines``, runs it on the best
device present (eagerly on a CPU) and writes ``outputs/flux_tiny_seed0.png``. See ``docs/generate.md``.

Examples::

    python scripts/generate.py                                   # tiny Flux, seconds on a CPU
    python scripts/generate.py --model pixart --size full --height 512 --width 512 --bcg
    python scripts/generate.py --model sd3 --size full --compare # eager vs BCG, same seed, same pipeline
    python scripts/generate.py --model /path/to/FLUX.1-dev --bcg # real weights from a local folder
    torchrun --nproc_per_node 2 scripts/generate.py --model flux --size full --cp ulysses --bcg --compare

Per-step times come from the pipeline's step-end callback (CUDA is synchronised at each time stamp), so
they cover one whole denoising step: every transformer call of the step plus the scheduler update.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import re
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import bcg_diffusion
import bcg_pipelines as pipelines

from .cache_option import CACHE_HELP, apply_cache, cache_passes, check_cache_option, reset_cache_state
from .options import Failure, add_model_options, choose_device, family_or_checkpoint
from .quant_option import QUANT_HELP, QUANT_NAMES, apply_quant, torchao_problem
from .media import IMAGE_SUFFIXES, VIDEO_SUFFIXES, can_write_mp4, save_output, why_not_writable
from .speedups import (
    CP_MODES, attention_backend_names, enable_context_parallel, has_cp_plan, quiet_library_warnings, regional_compile,
    set_attention_backend)
from .timed_run import RunResult, compare_outputs, ran_size, run_pipeline  # noqa: F401  (run_pipeline: tests)

DEFAULT_MODEL = "flux"  # the tiny Flux pipeline builds and runs fastest on a CPU (a few seconds)
DEFAULT_PROMPT = "a red fox resting in a snowy birch forest at golden hour, soft light, highly detailed"
DEFAULT_OUT_DIR = Path("outputs")
SEED_LIMIT = 2**64  # torch.Generator.manual_seed takes 0 <= seed < 2**64
NO_CUDA_NOTE = "note: BCG needs a CUDA GPU and none is in use here, so everything runs eagerly."
SHAPE_KEYS = ("height", "width", "num_frames")  # the call settings bcg_diffusion.warmup takes per shape
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
#: NCCL's NVLink multicast (NVLS) stays off wherever this program starts; set only where the user has not.
NVLINK_MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="generate.py",
        description="Generate an image or video with a diffusers DiT pipeline, eagerly or with breakable CUDA "
        "graphs (BCG). With no arguments: the tiny random-weight Flux pipeline, a few seconds on a CPU.",
        epilog="See docs/generate.md for examples.",
    )
    add_model_options(p, DEFAULT_MODEL, list_models=True)
    g = p.add_argument_group("generation")
    g.add_argument("--prompt", default=DEFAULT_PROMPT, help="text prompt")
    g.add_argument("--negative-prompt", default=None, help="negative prompt (used by CFG families)")
    g.add_argument("--height", type=int, default=None, help="image height in pixels (default: the family's for --size)")
    g.add_argument("--width", type=int, default=None, help="image width in pixels (default: the family's for --size)")
    g.add_argument("--frames", type=int, default=None, help="number of frames (video families only)")
    g.add_argument("--steps", type=int, default=None, help="denoising steps (default: the family's)")
    g.add_argument("--guidance", type=float, default=None, help="guidance scale (default: the family's)")
    g.add_argument("--seed", type=int, default=0, help="random seed of the initial noise, 0 <= seed < 2**64 (default: 0)")
    g.add_argument("--batch", type=int, default=1, help="images or videos per prompt (default: 1)")
    g.add_argument("--no-resolution-binning", action="store_true",
                   help="run the asked height x width as it is (use_resolution_binning=False). By default pipelines "
                   "that bin (PixArt, Sana) run the nearest of the model's aspect-ratio bins and resize the result "
                   "to the asked size; the summary says when that happened")
    g = p.add_argument_group("speed")
    g.add_argument("--bcg", action="store_true", help="replay each denoising step as breakable CUDA graphs")
    g.add_argument("--debug-cuda-graph", action="store_true",
                   help="BCG with every segment run eagerly (BCGConfig(debug=True)); implies --bcg")
    g.add_argument("--compile", action="store_true",
                   help="regional torch.compile of the transformer's repeated blocks (combines with --bcg)")
    g.add_argument("--attention-backend", default=None, metavar="NAME",
                   help="diffusers attention backend, e.g. native, flash, _native_cudnn (set_attention_backend)")
    g.add_argument("--cache", default=None, metavar="SPEC",
                   help=f"a diffusers step cache on the transformer: {CACHE_HELP}; each run prints the module passes "
                   "the cache computed and reused")
    g.add_argument("--quant", choices=QUANT_NAMES, default=None,
                   help=f"torchao quantization of the transformer, applied right after the build: {QUANT_HELP} "
                   "(needs torchao: pip install -e \".[quant]\")")
    g.add_argument("--compare", action="store_true",
                   help="run eagerly, then with BCG on the same pipeline and seed; report the per-step speedup "
                   "and whether the outputs are bitwise identical")
    g.add_argument("--warmup", nargs="?", const="", default=None, metavar="WxH[,WxH...]",
                   help="before each timed run, bcg_diffusion.warmup(pipe, shapes, ...) with the run's other call "
                   "settings: with no value the run's own size, else these sizes (width x height, as the OpenAI images "
                   "API; WxHxFRAMES for videos). The output is the same with and without it")
    g.add_argument("--compile-cache", type=Path, default=None, metavar="DIR",
                   help="with --compile: keep torch's compile artifacts in DIR (bcg_diffusion.use_compile_cache) so "
                   "that a later process loads them instead of compiling again")
    g = p.add_argument_group("several GPUs")
    g.add_argument("--cp", choices=CP_MODES, default=None,
                   help="diffusers context parallelism over the GPUs of a torchrun launch (torchrun --nproc_per_node N "
                   "scripts/generate.py --cp ulysses ...): ulysses_degree=N or ring_degree=N. Rank 0 writes the output "
                   "and prints the summary")
    g = p.add_argument_group("output")
    g.add_argument("--out", type=Path, default=None,
                   help="output file: .png/.jpg/.webp for images, .mp4 or .gif for videos (MP4 needs imageio + "
                   "imageio-ffmpeg or opencv; otherwise a GIF is written). Default: outputs/<model>_<size>_seed<seed>.png")
    g.add_argument("--fps", type=int, default=16, help="frames per second of a saved video (default: 16)")
    return p


@dataclass(frozen=True)
class Ranks:
    """This process's place in a torchrun launch (``--cp``)."""

    mode: str  # a CP_MODES value
    rank: int
    world_size: int
    local_rank: int


@dataclass
class Plan:
    """What to build and how to call it, after validation.

    ``warmup`` is ``None`` without ``--warmup``, else the shapes to warm (``bcg_diffusion.warmup``'s
    dicts); ``ranks`` is set under ``--cp``.
    """

    model: str
    spec: Any  # FamilySpec, or None (real weights of a family not known yet)
    is_family: bool
    size: str  # the --size of a family; "checkpoint" for real weights
    device: torch.device
    dtype: torch.dtype
    call: dict[str, Any]
    out: Path
    is_video: bool
    use_bcg: bool
    warmup: list[dict[str, int]] | None = None
    ranks: Ranks | None = None

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def is_rank0(self) -> bool:
        return self.ranks is None or self.ranks.rank == 0

    @property
    def error_prefix(self) -> str:
        return "" if self.ranks is None else f"[rank {self.ranks.rank}] "


def check_arguments(args, parser: argparse.ArgumentParser) -> None:
    """``parser.error`` (exit 2) for numbers out of range and unknown attention backends."""
    for name in ("steps", "batch", "height", "width", "frames", "fps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be >= 1 (got {value})")
    if not 0 <= args.seed < SEED_LIMIT:
        parser.error(f"--seed must be in 0 .. 2**64 - 1 (got {args.seed})")
    if args.attention_backend is not None and args.attention_backend.lower() not in attention_backend_names():
        parser.error(f"--attention-backend {args.attention_backend!r} is not a diffusers backend; "
                     f"choose one of: {', '.join(attention_backend_names())}")


def output_path(args, parser, model_name: str, size: str, is_video: bool) -> Path:
    """``--out`` checked for its suffix and that it can be written, or the default path."""
    if args.out is None:
        suffix = (".mp4" if can_write_mp4() else ".gif") if is_video else ".png"
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", model_name).strip("-.") or "model"
        return DEFAULT_OUT_DIR / f"{name}_{size if size != 'checkpoint' else 'weights'}_seed{args.seed}{suffix}"
    allowed = VIDEO_SUFFIXES if is_video else IMAGE_SUFFIXES
    if args.out.suffix.lower() not in allowed:
        kind = "a video" if is_video else "an image"
        parser.error(f"--out {str(args.out)!r}: {args.model} makes {kind}; use one of {', '.join(allowed)}")
    problem = why_not_writable(args.out)
    if problem:
        parser.error(f"--out {str(args.out)!r} cannot be written: {problem}")
    return args.out


def check_full_size_on_cpu(spec, dtype: torch.dtype, parser: argparse.ArgumentParser) -> None:
    """``parser.error`` with the memory a full-size build needs (from the family's parameter counts)."""
    d = pipelines.describe(spec, "full")
    params = d.transformer_params + sum(te[3] for te in d.text_encoders)
    gib = params * torch.empty((), dtype=dtype).element_size() / 2**30
    parser.error(f"--size full without CUDA builds {spec.name} on the CPU: {d.transformer_params / 1e9:.1f}B "
                 f"transformer and {(params - d.transformer_params) / 1e9:.1f}B text-encoder parameters, about "
                 f"{gib:.0f} GiB of memory in {pipelines.dtype_name(dtype)} for the weights alone (VAE and "
                 "activations on top), and minutes per step. Pass --yes to build it anyway.")


def check_binning_flag(spec, parser: argparse.ArgumentParser) -> None:
    """``--no-resolution-binning`` on a family whose pipeline does not bin: ``parser.error``."""
    import diffusers

    pipeline_class = getattr(diffusers, spec.pipeline_class_name)
    if "use_resolution_binning" not in inspect.signature(pipeline_class.__call__).parameters:
        parser.error(f"--no-resolution-binning: {spec.pipeline_class_name} does not bin resolutions (its __call__ "
                     "takes no use_resolution_binning), so it already runs the asked size; leave the flag out")


def parse_warmup_sizes(text: str, spec, size: str, call: dict[str, Any], is_video: bool,
                       parser: argparse.ArgumentParser) -> list[dict[str, int]]:
    """``--warmup`` as ``bcg_diffusion.warmup`` shapes: ``""`` is the run's own size; else ``WxH[xF],...``
    (width first, as the OpenAI images API and serve.py), each checked as ``--height/--width`` are."""
    if not text:
        own = {k: call[k] for k in SHAPE_KEYS if k in call}
        if "height" not in own or "width" not in own:
            parser.error("--warmup without sizes warms the run's own size, which this checkpoint leaves to its "
                         "pipeline; give --height and --width, or sizes such as --warmup 1024x1024")
        return [own]
    shapes = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)x(\d+)(?:x(\d+))?\s*", part)
        if m is None:
            parser.error(f"--warmup {text!r}: cannot read {part!r}; give sizes as WxH (width x height), e.g. "
                         "512x512,1344x768, or WxHxFRAMES for a video family")
        width, height = int(m[1]), int(m[2])
        frames = int(m[3]) if m[3] else call.get("num_frames")
        if m[3] and not is_video:
            parser.error(f"--warmup {part.strip()}: {spec.name if spec else 'this model'} makes images; give WxH")
        if spec is None:
            shape = {"height": height, "width": width, **({"num_frames": frames} if frames else {})}
        else:
            try:
                shape = pipelines.check_call(spec, height, width, frames, size=size)
            except ValueError as exc:
                parser.error(f"--warmup {part.strip()}: {exc}")
        shapes.append(shape)
    return shapes


def torchrun_ranks(mode: str, parser: argparse.ArgumentParser) -> Ranks:
    """``--cp``: this process's rank from torchrun's variables (``parser.error`` without them or with one rank)."""
    missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
    launch = f"torchrun --nproc_per_node 2 scripts/generate.py --cp {mode} ..."
    if missing:
        parser.error(f"--cp {mode} runs one process per GPU under torchrun, which sets "
                     f"{', '.join(TORCHRUN_VARIABLES)}; {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                     f"not set. Launch it as: {launch}")
    try:
        rank, world, local = (int(os.environ[name]) for name in TORCHRUN_VARIABLES)
    except ValueError:
        values = ", ".join(f"{n}={os.environ[n]!r}" for n in TORCHRUN_VARIABLES)
        parser.error(f"--cp {mode}: {values} are not all integers")
    if world < 2:
        parser.error(f"--cp {mode} splits each step over the ranks of a torchrun launch, but WORLD_SIZE is {world}; "
                     f"launch N >= 2 processes, one per GPU: {launch}")
    return Ranks(mode, rank, world, local)


def check_cp_plan(spec, mode: str, parser: argparse.ArgumentParser) -> None:
    """``--cp`` on a family whose transformer diffusers cannot split: ``parser.error`` naming the ones it can."""
    import diffusers

    def splittable(family) -> bool:
        return has_cp_plan(getattr(diffusers, family.transformer_class_name))

    if not splittable(spec):
        can = [name for name in pipelines.list_families() if splittable(pipelines.get_family(name))]
        parser.error(f"--cp {mode}: {spec.transformer_class_name} ({spec.name}) has no _cp_plan, so diffusers cannot "
                     f"split it over GPUs; families that have one: {', '.join(can)}")


def cp_device(ranks: Ranks, args, parser: argparse.ArgumentParser) -> torch.device:
    """``cuda:LOCAL_RANK``, after checking that there is such a GPU and no other ``--device`` was asked for."""
    if args.device not in (None, "cuda"):
        parser.error(f"--cp {ranks.mode} puts rank r on cuda:LOCAL_RANK; leave out --device {args.device}")
    if not torch.cuda.is_available():
        parser.error(f"--cp {ranks.mode} needs one CUDA GPU per rank (NCCL), and torch sees no CUDA device")
    if ranks.local_rank >= torch.cuda.device_count():
        parser.error(f"--cp {ranks.mode}: LOCAL_RANK {ranks.local_rank}, but torch sees only "
                     f"{torch.cuda.device_count()} CUDA device(s); use --nproc_per_node <= the number of GPUs")
    return torch.device("cuda", ranks.local_rank)


def make_plan(args, parser: argparse.ArgumentParser) -> Plan:
    """Validate the arguments (``parser.error`` -> exit 2) and work out the pipeline call, before any work."""
    check_arguments(args, parser)
    spec = family_or_checkpoint(args.model, parser)
    ranks = None
    if args.cp is not None:  # the launch, then the family, then the GPUs: each error says the first thing to fix
        ranks = torchrun_ranks(args.cp, parser)
        if spec is not None:  # a checkpoint's transformer is checked once it is loaded
            check_cp_plan(spec, args.cp, parser)
        device = cp_device(ranks, args, parser)
    else:
        device = choose_device(args, parser)
    dtype = pipelines.resolve_dtype(args.dtype, device)
    if args.no_resolution_binning and spec is not None:  # a checkpoint's pipeline is checked once it is loaded
        check_binning_flag(spec, parser)
    if args.compile_cache is not None:
        if not args.compile:
            parser.error("--compile-cache keeps torch.compile's artifacts, and nothing compiles without --compile; "
                         "add --compile or leave --compile-cache out")
        if args.compile_cache.exists() and not args.compile_cache.is_dir():
            parser.error(f"--compile-cache {str(args.compile_cache)!r} is a file; give a folder (it is created if "
                         "missing)")
    if args.cache is not None:
        try:  # a checkpoint's family is known after loading: checked again then
            check_cache_option(args.cache, spec.name if spec is not None else None)
        except ValueError as exc:
            parser.error(f"--cache: {exc}")
    if args.quant is not None and (problem := torchao_problem()):
        parser.error(f"--quant {args.quant}: {problem}")
    size = args.size if spec is not None else "checkpoint"
    try:
        call = pipelines.plan_call(spec, args.size, prompt=args.prompt, height=args.height, width=args.width,
                                   num_frames=args.frames, steps=args.steps, guidance=args.guidance,
                                   negative_prompt=args.negative_prompt)
    except ValueError as exc:
        parser.error(str(exc))
    is_video = spec.is_video if spec is not None else (args.frames or 1) > 1
    model_name = args.model if spec is not None else Path(args.model).name
    out = output_path(args, parser, model_name, size, is_video)
    if spec is not None and size == "full" and device.type != "cuda" and not args.yes:
        check_full_size_on_cpu(spec, dtype, parser)
    use_bcg = args.bcg or args.debug_cuda_graph or args.compare
    warmup = None if args.warmup is None else parse_warmup_sizes(args.warmup, spec, size, call, is_video, parser)
    return Plan(args.model, spec, spec is not None, size, device, dtype, call, out, is_video, use_bcg, warmup, ranks)


def list_models() -> int:
    def shape(sz):
        return f"{sz.height}x{sz.width}" + (f"x{sz.num_frames}f" if sz.num_frames else "")

    print(f"{'family':<14} {'title':<28} {'kind':<6} {'CFG':<10} {'tiny':<14} full")
    for name in pipelines.list_families():
        spec = pipelines.get_family(name)
        print(f"{name:<14} {spec.title:<28} {'video' if spec.is_video else 'image':<6} {spec.cfg_mode:<10} "
              f"{shape(spec.tiny):<14} {shape(spec.full)}")
    return 0


def fmt_ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{1e3 * seconds:.2f} ms"


def format_bcg_stats(stats, indent: str = "  ") -> str:
    """``str(stats)`` of a ``BCGStats`` indented, plus a line on eager fallbacks."""
    first, *rest = str(stats).splitlines()
    lines = [f"{indent}BCG: {first}"] + [indent + line for line in rest]
    if stats.eager_calls:
        lines.append(f"{indent}  note: {stats.eager_calls} transformer call(s) ran eagerly (a fallback key or "
                     "non-CUDA inputs); see the BCGCaptureWarning above, if any")
    return "\n".join(lines)


def build(plan: Plan, args):
    """The pipeline with random weights (a family) or real weights (a checkpoint), progress bar on."""
    if plan.is_family:
        pipe = pipelines.build_pipeline(plan.model, size=args.size, device=plan.device, dtype=plan.dtype, seed=args.seed)
    else:
        pipe = pipelines.load_pipeline(plan.model, device=plan.device, dtype=plan.dtype)
        with contextlib.suppress(ValueError):
            plan.spec = pipelines.family_of(pipe)
    pipe.set_progress_bar_config(disable=not plan.is_rank0, desc="denoising")  # --cp: rank 0's bar only
    return pipe


def quantize_transformer(pipe, args) -> list[str]:
    """``--quant``: quantize the transformer with torchao right after the build; the note to print."""
    if not args.quant:
        return []
    try:
        return [apply_quant(pipe, args.quant)]
    except Exception as exc:  # noqa: BLE001 - e.g. a config the device does not support
        raise Failure(1, f"error: --quant {args.quant}: {type(exc).__name__}: {exc}") from exc


def prepare(pipe, plan: Plan, args) -> tuple[dict[str, Any], list[str]]:
    """The call fitted to the pipeline, and notes on the attention backend and compilation set on it."""
    if args.no_resolution_binning and "use_resolution_binning" not in pipelines.call_parameters(pipe):
        raise Failure(2, f"generate.py: error: --no-resolution-binning: {type(pipe).__name__} does not bin "
                      "resolutions (its __call__ takes no use_resolution_binning), so it already runs the asked size; "
                      "leave the flag out")
    try:
        call, dropped = pipelines.fit_call(pipe, plan.call, batch=args.batch, exact_shape=args.no_resolution_binning)
    except ValueError as exc:
        raise Failure(2, f"generate.py: error: {exc}") from exc
    notes = [f"note: {type(pipe).__name__} takes no {key!r} argument; ignored" for key in dropped]
    transformer = getattr(pipe, "transformer", None)
    if (args.attention_backend or args.compile or args.cp) and transformer is None:
        raise Failure(2, "error: --attention-backend, --compile and --cp need a pipeline with a transformer")
    if args.attention_backend:
        try:
            notes.append(set_attention_backend(transformer, args.attention_backend.lower()))
        except Exception as exc:  # noqa: BLE001 - e.g. the backend's package is not installed
            raise Failure(2, f"error: --attention-backend {args.attention_backend}: {exc}") from exc
    if plan.ranks is not None:  # after the attention backend (diffusers checks it), before compile and BCG
        notes.append(split_over_ranks(transformer, plan.ranks))
    if args.compile:
        try:
            notes.append(regional_compile(transformer))
        except Exception as exc:  # noqa: BLE001
            raise Failure(1, f"error: --compile: {type(exc).__name__}: {exc}") from exc
    return call, notes


def split_over_ranks(transformer, ranks: Ranks) -> str:
    """``--cp``: diffusers context parallelism on the transformer; the note to print."""
    if not has_cp_plan(type(transformer)):  # a checkpoint (a family was checked before building)
        raise Failure(2, f"generate.py: error: --cp {ranks.mode}: {type(transformer).__name__} has no _cp_plan, so "
                      "diffusers cannot split it over GPUs")
    try:
        return enable_context_parallel(transformer, ranks.mode, ranks.world_size)
    except Exception as exc:  # noqa: BLE001 - e.g. heads not divisible by the degree, a backend without CP
        raise Failure(1, f"error: --cp {ranks.mode}: {type(exc).__name__}: {exc}") from exc


def accelerate(pipe, plan: Plan, args) -> None:
    config = bcg_diffusion.BCGConfig(debug=args.debug_cuda_graph)
    try:
        with contextlib.nullcontext() if plan.cuda else quiet_library_warnings():  # CPU no-op: said once
            bcg_diffusion.accelerate_pipeline(pipe, config)
    except Exception as exc:  # noqa: BLE001 - e.g. AccelerationError (offload hooks, unknown transformer)
        raise Failure(1, f"error: BCG could not be applied: {type(exc).__name__}: {exc}") from exc


def enable_step_cache(pipe, plan: Plan, args, call: dict[str, Any]) -> None:
    """``--cache``: enable the step cache on the transformer (a checkpoint's family is checked here)."""
    if plan.spec is None:
        raise Failure(2, f"error: --cache needs a known family; {plan.model} is none of {', '.join(pipelines.list_families())}")
    try:
        if not plan.is_family:
            check_cache_option(args.cache, plan.spec.name)
        print(f"  {apply_cache(pipe, args.cache, plan.spec.name, call['num_inference_steps'])}", flush=True)
    except ValueError as exc:
        raise Failure(2, f"generate.py: error: --cache: {exc}") from exc


def counted_run(pipe, plan: Plan, args, call: dict[str, Any], label: str) -> RunResult:
    """One timed run; with ``--cache`` from a fresh cache state, counting the module passes it computed and reused."""
    if args.cache:
        reset_cache_state(pipe.transformer)
    with cache_passes(pipe.transformer, bool(args.cache)) as passes:
        result = run_pipeline(pipe, call, args.seed, plan.device, label)
    result.cache_passes = passes
    return result


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


def fmt_size(shape: dict[str, int]) -> str:
    """``WxH`` (width first, as ``--warmup`` takes it), with ``xFRAMES`` for videos."""
    return f"{shape['width']}x{shape['height']}" + (f"x{shape['num_frames']}" if shape.get("num_frames") else "")


def warm_up(pipe, plan: Plan, call: dict[str, Any], before: str, setup: SetUp, args) -> None:
    """``--warmup``: ``bcg_diffusion.warmup`` at the planned shapes with the run's other call settings."""
    settings = {k: v for k, v in call.items() if k not in (*SHAPE_KEYS, "num_inference_steps")}
    sizes = ", ".join(fmt_size(s) for s in plan.warmup)
    print(f"warm-up before the {before} run: bcg_diffusion.warmup at {sizes} "
          f"({'WxHxframes' if plan.is_video else 'WxH'}) ...", flush=True)
    try:
        with torch.inference_mode():  # as the timed runs (timed_run.run_pipeline): grad mode is part of a graph key
            report = bcg_diffusion.warmup(pipe, plan.warmup, **settings)
    except Exception as exc:  # noqa: BLE001
        raise Failure(1, f"error: --warmup: {type(exc).__name__}: {exc}") from exc
    print(textwrap.indent(str(report), "  "), flush=True)
    setup.warmups[before] = report
    if args.compile:
        setup.compiled_in(f"bcg_diffusion.warmup before the {before} run took {report.total_s:.2f} s in all")


def run(pipe, plan: Plan, args, call: dict[str, Any]) -> tuple[list[RunResult], SetUp]:
    """The eager run (with ``--compare``), then the run asked for, each after its ``--warmup``; BCG
    statistics on the last."""
    tag = " + compile" if args.compile else ""
    tag += f" + {args.cache}" if args.cache else ""
    bcg_label = "bcg-debug" if args.debug_cuda_graph else "bcg"
    results, setup = [], SetUp()
    try:
        if args.compare and plan.cuda and plan.warmup is None:  # one-off CUDA initialisation must not count
            print("warm-up: one untimed 1-step eager call", flush=True)
            first = run_pipeline(pipe, {**call, "num_inference_steps": 1}, args.seed, plan.device, "warm-up")
            if args.compile:
                seconds = first.step_times[0] if first.step_times else first.total_s
                setup.compiled_in(f"the untimed 1-step eager call took {seconds:.2f} s in its step")
        if args.cache:  # after the CUDA warm-up call, before --warmup and acceleration
            enable_step_cache(pipe, plan, args, call)
        if args.compare:
            label = "eager" + tag
            if plan.warmup is not None:
                warm_up(pipe, plan, call, label, setup, args)
            results.append(counted_run(pipe, plan, args, call, label))
            label = bcg_label + tag + ("" if plan.cuda else " (inactive: no CUDA)")
        else:
            label = (bcg_label if plan.use_bcg and plan.cuda else "eager") + tag
        if plan.use_bcg:
            accelerate(pipe, plan, args)
        if plan.warmup is not None:
            warm_up(pipe, plan, call, label, setup, args)
        results.append(counted_run(pipe, plan, args, call, label))
    except Failure:
        raise
    except Exception as exc:  # noqa: BLE001
        raise Failure(1, f"error: generation failed: {type(exc).__name__}: {exc}") from exc
    results[-1].bcg_stats = bcg_diffusion.get_stats(pipe) if plan.use_bcg else None
    return results, setup


def check_outputs(plan: Plan, results: list[RunResult]) -> tuple[bool, str] | None:
    """``--compare``: whether the two runs' outputs are bitwise identical, and the sentence saying so.
    Under ``--cp`` every rank compares its own and all must agree (a collective: every rank calls it)."""
    if len(results) < 2:
        return None
    same, detail = compare_outputs(*results)
    if plan.ranks is not None:
        import torch.distributed as dist

        flag = torch.tensor([int(same)], device=plan.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        same = bool(flag.item())
        detail = f"{'on' if same else 'not on'} all {plan.ranks.world_size} ranks; rank 0: {detail}"
    return same, detail


def asked_size(call: dict[str, Any]) -> str:
    if "height" not in call or "width" not in call:
        return "the pipeline's default size"
    frames = f"{call['num_frames']} frames of " if call.get("num_frames") else ""
    return f"{frames}{call['width']}x{call['height']} px (WxH)"


def ran_sizes(pipe, result: RunResult) -> list:
    """The ``timed_run.RanSize`` of each distinct input the transformer received in ``result``."""
    config = getattr(getattr(pipe, "transformer", None), "config", None) or {}
    return [ran_size(shapes, config) for shapes in result.input_shapes]


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
        print(f"  {result.label}: {len(times)} steps, median step {fmt_ms(result.median_step)} "
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


def print_summary(pipe, plan: Plan, args, call: dict[str, Any], results: list[RunResult], setup: SetUp,
                  verdict: tuple[bool, str] | None, build_s: float, compile_cache) -> None:
    label = plan.model if plan.is_family else f"{plan.model} (real weights)"
    cp = (f", context parallel {plan.ranks.mode} over {plan.ranks.world_size} GPUs (rank 0's times)"
          if plan.ranks else "")
    print(f"summary: {label}, {plan.size}, {plan.device}, {pipelines.dtype_name(plan.dtype)}, batch {args.batch}, "
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
    elif plan.use_bcg and plan.cuda:
        print("    BCG: get_stats returned nothing (acceleration not active)")
    if args.compile:
        print(compile_setup_line(setup, results))
    if compile_cache is not None:
        print(f"  compile cache: {compile_cache.status}")
    if args.compare:
        eager, accel = results
        a, b = eager.steady_median_step, accel.steady_median_step
        if a and b:
            print(f"  per-step speedup (median of steps after the first): {a / b:.2f}x "
                  f"({fmt_ms(a)} {eager.label} -> {fmt_ms(b)} {accel.label})")
        same, detail = verdict
        print(f"  outputs bitwise identical: {'YES' if same else 'NO'} ({detail})")
        if not plan.cuda:
            print("  (no speed-up to expect: both runs were eager on this machine)")


def keep_nvlink_multicast_off() -> None:
    """NCCL's NVLink multicast off (issue 19): each variable is set where the user has not set it."""
    for name, value in NVLINK_MULTICAST_OFF.items():
        os.environ.setdefault(name, value)


def open_compile_cache(plan: Plan, args):
    """``--compile-cache``: ``bcg_diffusion.use_compile_cache`` before anything compiles (under ``--cp`` one
    sub-folder per rank, so that no two processes write one file); prints its status."""
    if args.compile_cache is None:
        return None
    directory = args.compile_cache if plan.ranks is None else args.compile_cache / f"rank{plan.ranks.rank}"
    try:
        cache = bcg_diffusion.use_compile_cache(directory)
    except Exception as exc:  # noqa: BLE001 - e.g. a folder that cannot be written
        raise Failure(2, f"generate.py: error: --compile-cache {directory}: {exc}") from exc
    print(f"compile cache: {cache.status}", flush=True)
    return cache


def save_compile_cache(cache) -> tuple[int, str | None]:
    """``cache.save()`` after the run: (exit code, the line to print)."""
    if cache is None:
        return 0, None
    try:
        path = cache.save()
    except Exception as exc:  # noqa: BLE001 - the output is written either way; the exit code says it
        return 1, f"error: --compile-cache: saving the artifacts failed: {type(exc).__name__}: {exc}"
    if path is None:
        return 0, "compile cache: nothing was compiled, nothing saved"
    return 0, f"compile cache: saved this process's compile artifacts to {path}"


def generate(plan: Plan, args) -> int:
    """Build, run, write and summarise (on every rank under ``--cp``; only rank 0 writes and prints)."""
    err = plan.error_prefix
    if not plan.cuda:
        print(NO_CUDA_NOTE if plan.use_bcg else "note: running eagerly on the CPU (BCG needs a CUDA GPU).")
    try:
        compile_cache = open_compile_cache(plan, args)
    except Failure as failure:
        print(f"{err}{failure}", file=sys.stderr)
        return failure.code
    print(f"building {plan.model} ({plan.size}) on {plan.device} in {pipelines.dtype_name(plan.dtype)} ...", flush=True)
    t0 = time.perf_counter()
    try:
        pipe = build(plan, args)
    except Exception as exc:  # noqa: BLE001 - a failed build is reported, not a traceback
        print(f"{err}error: could not build {plan.model}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    build_s = time.perf_counter() - t0
    try:
        quantized = quantize_transformer(pipe, args)
        call, notes = prepare(pipe, plan, args)
        notes = quantized + notes
        print(f"built in {build_s:.1f} s; {', '.join(f'{k}={v!r}' for k, v in call.items() if k != 'prompt')}")
        for note in notes:
            print(f"  {note}")
        results, setup = run(pipe, plan, args, call)
        verdict = check_outputs(plan, results)
    except Failure as failure:
        print(f"{err}{failure}", file=sys.stderr)
        return failure.code
    code, saved = save_compile_cache(compile_cache)
    if code:
        print(f"{err}{saved}", file=sys.stderr)
    if not plan.is_rank0:
        return code
    written = save_output(results[0].output, plan.out, plan.is_video, args.fps)
    if args.compare:
        written += save_output(results[1].output, plan.out, plan.is_video, args.fps, tag="_bcg")
    print_summary(pipe, plan, args, call, results, setup, verdict, build_s, compile_cache)
    if saved and not code:
        print(saved)
    for path in written:
        print(f"wrote {path}")
    return code


@contextlib.contextmanager
def only_rank0_speaks(plan: Plan):
    """Under ``--cp``, ranks other than 0 print nothing but errors (stdout and library warnings off)."""
    if plan.is_rank0:
        yield
        return
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull), quiet_library_warnings():
        yield


def generate_on_ranks(plan: Plan, args) -> int:
    """``--cp``: one NCCL process group over the torchrun launch around :func:`generate`, destroyed at the end."""
    import torch.distributed as dist

    try:
        torch.cuda.set_device(plan.device)
        dist.init_process_group(backend="nccl", device_id=plan.device)
    except Exception as exc:  # noqa: BLE001
        print(f"{plan.error_prefix}error: --cp: the NCCL process group could not start: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 1
    try:
        with only_rank0_speaks(plan):
            return generate(plan, args)
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    keep_nvlink_multicast_off()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.list_models:
            return list_models()
        plan = make_plan(args, parser)
    except SystemExit as exc:  # --help (0) or a bad argument (2)
        return int(exc.code or 0)
    return generate(plan, args) if plan.ranks is None else generate_on_ranks(plan, args)


if __name__ == "__main__":
    sys.exit(main())
