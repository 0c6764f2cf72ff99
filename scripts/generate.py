#!/usr/bin/env python
"""Generate an image or a video with a diffusers DiT pipeline, eagerly or with breakable CUDA graphs (BCG).

With no arguments it builds the tiny random-weight Flux pipeline of ``pipelines``, runs it on the best
device present (eagerly on a CPU) and writes ``outputs/flux_tiny_seed0.png``. See ``docs/generate.md``.

Examples::

    python scripts/generate.py                                   # tiny Flux, seconds on a CPU
    python scripts/generate.py --model pixart --size full --height 512 --width 512 --bcg
    python scripts/generate.py --model sd3 --size full --compare # eager vs BCG, same seed, same pipeline
    python scripts/generate.py --model /path/to/FLUX.1-dev --bcg # real weights from a local folder

Per-step times come from the pipeline's step-end callback (CUDA is synchronised at each time stamp), so
they cover one whole denoising step: every transformer call of the step plus the scheduler update.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import logging
import re
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

DEFAULT_MODEL = "flux"  # the tiny Flux pipeline builds and runs fastest on a CPU (a few seconds)
DEFAULT_PROMPT = "a red fox resting in a snowy birch forest at golden hour, soft light, highly detailed"
DEFAULT_OUT_DIR = Path("outputs")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
VIDEO_SUFFIXES = (".mp4", ".gif")
DTYPE_CHOICES = ("bf16", "bfloat16", "fp16", "float16", "fp32", "float32")
NO_CUDA_NOTE = "note: BCG needs a CUDA GPU and none is in use here, so everything runs eagerly."

REPO_ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------------------------
# Guarded access to the project's packages (both are written alongside these scripts)
# ---------------------------------------------------------------------------------------------------------
class BCGUnavailable(RuntimeError):
    """The installed ``bcg_diffusion`` lacks a name this script needs."""


def _import_project_module(name: str):
    """Import ``name`` (``pipelines`` or ``bcg_diffusion``), adding the repository root to ``sys.path`` if needed."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name or str(REPO_ROOT) in sys.path:
            raise
        sys.path.append(str(REPO_ROOT))
        return importlib.import_module(name)


def pipelines_api() -> SimpleNamespace:
    """The ``pipelines`` functions these scripts use.

    Takes each name from the package itself, falling back to its submodules (``pipelines.build``,
    ``pipelines.registry``) while the package's ``__init__`` does not re-export it yet. ``load_pipeline``
    is ``None`` when the package has none.
    """
    pkg = _import_project_module("pipelines")
    wanted = {
        "build_pipeline": ("build",),
        "load_pipeline": ("build", "load"),
        "list_families": ("registry",),
        "get_family": ("registry",),
        "family_of": ("registry",),
        "validate_shape": ("registry",),
        "check_call": ("registry",),
        "describe": ("registry", "describe"),
    }
    api = {}
    for name, submodules in wanted.items():
        obj = getattr(pkg, name, None)
        for sub in submodules:
            if obj is not None:
                break
            try:
                obj = getattr(importlib.import_module(f"pipelines.{sub}"), name, None)
            except ImportError:
                obj = None
        api[name] = obj
    missing = [n for n in ("build_pipeline", "list_families", "get_family", "check_call") if api[n] is None]
    if missing:
        raise ImportError(f"the pipelines package lacks {', '.join(missing)}")
    return SimpleNamespace(**api)


def bcg_api(*names: str) -> SimpleNamespace:
    """The named attributes of ``bcg_diffusion``; :class:`BCGUnavailable` with a clear message if any is missing."""
    try:
        mod = _import_project_module("bcg_diffusion")
    except Exception as exc:  # noqa: BLE001 - report whatever broke the import
        raise BCGUnavailable(f"cannot import bcg_diffusion ({type(exc).__name__}: {exc})") from exc
    missing = [n for n in names if not hasattr(mod, n)]
    if missing:
        version = getattr(mod, "__version__", "?")
        raise BCGUnavailable(
            f"bcg_diffusion {version} has no {', '.join(missing)}: this checkout's library does not provide "
            "the pipeline-level API yet"
        )
    return SimpleNamespace(**{n: getattr(mod, n) for n in names})


@contextlib.contextmanager
def quiet_library_warnings():
    """Silence warnings and log records below ERROR (used around BCG calls that we already explained)."""
    previous = logging.root.manager.disable
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(previous)


# ---------------------------------------------------------------------------------------------------------
# Helpers shared with bench_step.py
# ---------------------------------------------------------------------------------------------------------
def regional_compile(transformer, **compile_kwargs) -> str:
    """Compile the repeated blocks of ``transformer`` in place; return a sentence saying how.

    Uses diffusers' ``compile_repeated_blocks()`` where the class lists ``_repeated_blocks``, else
    ``nn.Module.compile`` on each block of the transformer's top-level ``ModuleList`` children.
    """
    import torch

    cls = type(transformer).__name__
    kw_text = f" ({', '.join(f'{k}={v!r}' for k, v in compile_kwargs.items())})" if compile_kwargs else ""
    repeated = getattr(transformer, "_repeated_blocks", None)
    if repeated:
        transformer.compile_repeated_blocks(**compile_kwargs)
        return f"regional torch.compile{kw_text} via {cls}.compile_repeated_blocks() on {', '.join(repeated)}"
    lists = []
    for name, child in transformer.named_children():
        if isinstance(child, torch.nn.ModuleList) and len(child):
            for block in child:
                block.compile(**compile_kwargs)
            lists.append(f"{name} ({len(child)} x {type(child[0]).__name__})")
    if not lists:
        raise ValueError(f"{cls} has neither _repeated_blocks nor ModuleList children of blocks to compile")
    return f"regional torch.compile{kw_text} of each block in {', '.join(lists)} ({cls} defines no _repeated_blocks)"


def attention_backend_names() -> list[str]:
    try:
        from diffusers.models.attention_dispatch import AttentionBackendName
    except ImportError:
        return []
    return [b.value for b in AttentionBackendName]


def set_attention_backend(transformer, name: str) -> str:
    """``transformer.set_attention_backend(name)``; return a note on how many attention processors it reached."""
    with quiet_library_warnings():  # diffusers warns that backends are experimental on every call
        transformer.set_attention_backend(name)
    total = reached = 0
    for module in transformer.modules():
        proc = getattr(module, "processor", None)
        if proc is None:
            continue
        total += 1
        reached += hasattr(proc, "_attention_backend")
    if total and not reached:
        return (f"attention backend {name!r} set, but none of the {total} attention processors of "
                f"{type(transformer).__name__} dispatch through it (they call SDPA directly)")
    return f"attention backend {name!r} set on {reached} of {total} attention processors"


def call_parameters(pipe) -> dict[str, inspect.Parameter]:
    """The named parameters of the pipeline's ``__call__``.

    Looks through the class hierarchy, past wrappers with a bare ``(*args, **kwargs)`` signature (such as the
    subclass ``accelerate_pipeline`` gives an accelerated pipeline), to the pipeline's own ``__call__``.
    """
    for cls in type(pipe).__mro__:
        fn = cls.__dict__.get("__call__")
        if fn is None:
            continue
        params = inspect.signature(fn).parameters
        if any(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name != "self" for name, p in params.items()):
            return dict(params)
    return dict(inspect.signature(pipe.__call__).parameters)


def cuda_sync(device) -> None:
    import torch

    if getattr(device, "type", str(device)).startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize(device)


def fmt_bytes(n: int | float | None) -> str:
    if n is None:
        return "n/a"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


def fmt_ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{1e3 * seconds:.2f} ms"


def format_bcg_stats(stats, indent: str = "  ") -> str:
    """``str(stats)`` of a ``BCGStats`` (keys, segments and breaks per key, capture time, memory, hits, misses),
    indented, plus a line on eager fallbacks."""
    if stats is None:
        return f"{indent}BCG: no statistics (BCG inactive)"
    lines = [f"{indent}BCG: " + str(stats).splitlines()[0]] + [indent + line for line in str(stats).splitlines()[1:]]
    eager_calls = getattr(stats, "eager_calls", 0)
    if eager_calls:
        lines.append(f"{indent}  note: {eager_calls} transformer call(s) ran eagerly (a fallback key or "
                     "non-CUDA inputs); see the BCGCaptureWarning above, if any")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# Per-step timing
# ---------------------------------------------------------------------------------------------------------
class StepTimer:
    """Time stamps at the start of the denoising loop and at the end of each step of one ``pipe(...)`` call.

    The loop start is taken when the pipeline opens its progress bar (right before the first step); step ends
    come from ``callback_on_step_end`` (or the legacy ``callback`` of pipelines such as PixArt-Sigma).
    CUDA is synchronised before each time stamp, so a step's time includes its GPU work.
    """

    def __init__(self, pipe, device):
        self.pipe = pipe
        self.device = device
        self.loop_start: float | None = None
        self.ends: list[float] = []
        self.latents = None
        self.mode = "none"

    def _now(self) -> float:
        cuda_sync(self.device)
        return time.perf_counter()

    def install(self) -> dict[str, Any]:
        """Hook the pipeline; return the keyword arguments to add to its call."""
        pipe = self.pipe
        original_bar = type(pipe).progress_bar.__get__(pipe)

        def progress_bar(*args, **kwargs):
            bar = original_bar(*args, **kwargs)
            if self.loop_start is None:
                self.loop_start = self._now()
            return bar

        pipe.progress_bar = progress_bar
        params = call_parameters(pipe)
        if "callback_on_step_end" in params:
            self.mode = "callback_on_step_end"

            def on_step_end(_pipe, _step, _timestep, callback_kwargs):
                self.ends.append(self._now())
                latents = callback_kwargs.get("latents")
                if latents is not None:
                    self.latents = latents.detach().clone()
                return callback_kwargs

            kwargs: dict[str, Any] = {"callback_on_step_end": on_step_end}
            if "callback_on_step_end_tensor_inputs" in params:
                kwargs["callback_on_step_end_tensor_inputs"] = ["latents"]
            return kwargs
        if "callback" in params:
            self.mode = "callback"

            def on_step(_step, _timestep, latents):
                self.ends.append(self._now())
                self.latents = latents.detach().clone()

            kwargs = {"callback": on_step}
            if "callback_steps" in params:
                kwargs["callback_steps"] = 1
            return kwargs
        return {}

    def uninstall(self) -> None:
        self.pipe.__dict__.pop("progress_bar", None)

    def step_times(self) -> list[float]:
        if not self.ends:
            return []
        start = self.loop_start if self.loop_start is not None and self.loop_start <= self.ends[0] else None
        stamps = ([start] if start is not None else []) + self.ends
        return [b - a for a, b in zip(stamps, stamps[1:])]


@dataclass
class RunResult:
    label: str
    output: Any  # numpy array: images (B, H, W, 3) or videos (B, F, H, W, 3), floats in [0, 1]
    step_times: list[float]
    total_s: float
    latents: Any = None
    bcg_stats: Any = None
    notes: list[str] = field(default_factory=list)

    @property
    def median_step(self) -> float | None:
        return statistics.median(self.step_times) if self.step_times else None

    @property
    def steady_median_step(self) -> float | None:
        """Median over the steps after the first (the first may include capture or compilation)."""
        rest = self.step_times[1:]
        return statistics.median(rest) if rest else self.median_step


def run_pipeline(pipe, call_kwargs: dict[str, Any], seed: int, device, label: str) -> RunResult:
    """One ``pipe(...)`` call with a fresh generator seeded ``seed``; returns its output as numpy and timings."""
    import torch

    timer = StepTimer(pipe, device)
    extra = timer.install()
    gen_device = "cuda" if getattr(device, "type", "") == "cuda" else "cpu"
    generator = torch.Generator(device=gen_device).manual_seed(seed)
    try:
        t0 = timer._now()
        with torch.inference_mode():
            out = pipe(**call_kwargs, **extra, generator=generator, output_type="np")
        total = timer._now() - t0
    finally:
        timer.uninstall()
    images = getattr(out, "images", None)
    if images is None:
        images = getattr(out, "frames", None)
    if images is None:
        images = out[0]
    notes = [] if timer.mode != "none" else ["this pipeline has no step callback: per-step times unavailable"]
    return RunResult(label, images, timer.step_times(), total, timer.latents, notes=notes)


# ---------------------------------------------------------------------------------------------------------
# Saving
# ---------------------------------------------------------------------------------------------------------
def can_write_mp4() -> bool:
    has = importlib.util.find_spec
    return (has("imageio") is not None and has("imageio_ffmpeg") is not None) or has("cv2") is not None


def _to_uint8(array):
    import numpy as np

    array = np.asarray(array)
    if array.dtype != np.uint8:
        array = (np.clip(array, 0.0, 1.0) * 255).round().astype(np.uint8)
    return array


def _numbered(path: Path, index: int, count: int, tag: str = "") -> Path:
    stem = path.stem + tag + (f"_{index}" if count > 1 else "")
    return path.with_name(stem + path.suffix)


def save_output(output, path: Path, is_video: bool, fps: int, tag: str = "") -> list[Path]:
    """Write each image (PNG/JPEG/WebP) or video (MP4, else GIF) of the batch; return the paths written."""
    import numpy as np
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    batch = list(output) if isinstance(output, (list, tuple)) else [output[i] for i in range(len(output))]
    written = []
    for i, item in enumerate(batch):
        target = _numbered(path, i, len(batch), tag)
        if not is_video:
            Image.fromarray(_to_uint8(item)).save(target)
        else:
            frames = [_to_uint8(f) for f in (item if isinstance(item, (list, tuple)) else np.asarray(item))]
            if target.suffix.lower() == ".mp4":
                from diffusers.utils import export_to_video

                export_to_video([f.astype(np.float32) / 255.0 for f in frames], str(target), fps=fps)
            else:
                pil = [Image.fromarray(f) for f in frames]
                pil[0].save(target, save_all=True, append_images=pil[1:], duration=max(1, round(1000 / fps)), loop=0)
        written.append(target)
    return written


# ---------------------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="generate.py",
        description="Generate an image or video with a diffusers DiT pipeline, eagerly or with breakable CUDA "
        "graphs (BCG). With no arguments: the tiny random-weight Flux pipeline, a few seconds on a CPU.",
        epilog="See docs/generate.md for examples.",
    )
    g = p.add_argument_group("model")
    g.add_argument("--model", default=DEFAULT_MODEL,
                   help="a family of the pipelines registry (random weights; --list-models shows them), or a local "
                   f"pipeline folder / hub id (org/name) for real weights (default: {DEFAULT_MODEL})")
    g.add_argument("--size", choices=("tiny", "full"), default="tiny",
                   help="tiny: a few-layer model for CPUs and tests; full: the published architecture (default: tiny)")
    g.add_argument("--list-models", action="store_true", help="list the families and exit")
    g.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    g.add_argument("--dtype", choices=DTYPE_CHOICES, default=None, help="default: bf16 on CUDA, fp32 on CPU")
    g = p.add_argument_group("generation")
    g.add_argument("--prompt", default=DEFAULT_PROMPT, help="text prompt")
    g.add_argument("--negative-prompt", default=None, help="negative prompt (used by CFG families)")
    g.add_argument("--height", type=int, default=None, help="image height in pixels (default: the family's for --size)")
    g.add_argument("--width", type=int, default=None, help="image width in pixels (default: the family's for --size)")
    g.add_argument("--frames", type=int, default=None, help="number of frames (video families only)")
    g.add_argument("--steps", type=int, default=None, help="denoising steps (default: the family's)")
    g.add_argument("--guidance", type=float, default=None, help="guidance scale (default: the family's)")
    g.add_argument("--seed", type=int, default=0, help="random seed of the initial noise (default: 0)")
    g.add_argument("--batch", type=int, default=1, help="images or videos per prompt (default: 1)")
    g = p.add_argument_group("speed")
    g.add_argument("--bcg", action="store_true", help="replay each denoising step as breakable CUDA graphs")
    g.add_argument("--debug-cuda-graph", action="store_true",
                   help="BCG with every segment run eagerly (BCGConfig(debug=True)); implies --bcg")
    g.add_argument("--compile", action="store_true",
                   help="regional torch.compile of the transformer's repeated blocks (combines with --bcg)")
    g.add_argument("--attention-backend", default=None, metavar="NAME",
                   help="diffusers attention backend, e.g. native, flash, _native_cudnn (set_attention_backend)")
    g.add_argument("--compare", action="store_true",
                   help="run eagerly, then with BCG on the same pipeline and seed; report the per-step speedup "
                   "and whether the outputs are bitwise identical")
    g = p.add_argument_group("output")
    g.add_argument("--out", type=Path, default=None,
                   help="output file: .png/.jpg/.webp for images, .mp4 or .gif for videos (MP4 needs imageio + "
                   "imageio-ffmpeg or opencv; otherwise a GIF is written). Default: outputs/<model>_<size>_seed<seed>.png")
    g.add_argument("--fps", type=int, default=16, help="frames per second of a saved video (default: 16)")
    return p


@dataclass
class Plan:
    """What to build and how to call it, after validation."""

    model: str
    spec: Any  # FamilySpec or None (real weights of an unknown family)
    is_family: bool
    device: Any
    dtype: Any
    call: dict[str, Any]
    out: Path
    is_video: bool
    use_bcg: bool
    cuda: bool


def _looks_like_checkpoint(model: str) -> bool:
    return Path(model).expanduser().exists() or "/" in model or "\\" in model


def _sanitize(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "model"


def make_plan(args, parser: argparse.ArgumentParser, api) -> Plan:
    """Validate the arguments (``parser.error`` -> exit 2) and work out the pipeline call."""
    import torch

    for name in ("steps", "batch", "height", "width", "frames", "fps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be >= 1 (got {value})")
    if args.attention_backend is not None:
        names = attention_backend_names()
        if names and args.attention_backend.lower() not in names:
            parser.error(f"--attention-backend {args.attention_backend!r} is not a diffusers backend; "
                         f"choose one of: {', '.join(names)}")
    try:
        device = torch.device(args.device) if args.device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    except RuntimeError as exc:
        parser.error(f"--device {args.device!r}: {exc}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device} asks for CUDA, but torch sees no CUDA device")
    cuda = device.type == "cuda"
    dtype = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
             "fp32": torch.float32, "float32": torch.float32}.get(args.dtype)
    if dtype is None:
        dtype = torch.bfloat16 if cuda else torch.float32

    families = api.list_families()
    is_family = args.model in families
    spec = None
    if is_family:
        spec = api.get_family(args.model)
    elif not _looks_like_checkpoint(args.model):
        try:
            api.get_family(args.model)  # raises with the list of known families
        except ValueError as exc:
            parser.error(f"--model: {exc} (or give a local pipeline folder or a hub id such as org/name)")
        parser.error(f"--model: unknown family {args.model!r}; known families: {', '.join(families)}")

    call: dict[str, Any] = {"prompt": args.prompt}
    if spec is not None:
        size = args.size if is_family else "full"
        defaults = spec.default_call(size)
        try:
            shape = api.check_call(spec, args.height, args.width, args.frames, size=size)
        except ValueError as exc:
            parser.error(str(exc))
        call.update({k: v for k, v in defaults.items() if k not in ("height", "width", "num_frames")})
        call.update(shape)
        if args.guidance is not None:
            call[spec.guidance_kwarg] = args.guidance
        is_video = spec.is_video
    else:
        if args.height is not None:
            call["height"] = args.height
        if args.width is not None:
            call["width"] = args.width
        if args.frames is not None:
            call["num_frames"] = args.frames
        if args.guidance is not None:
            call["guidance_scale"] = args.guidance
        is_video = args.frames is not None and args.frames > 1
    if args.steps is not None:
        call["num_inference_steps"] = args.steps
    if args.negative_prompt is not None:
        call["negative_prompt"] = args.negative_prompt
    call["_batch"] = args.batch

    if args.out is None:
        base = _sanitize(args.model if is_family else Path(args.model).name)
        suffix = (".mp4" if can_write_mp4() else ".gif") if is_video else ".png"
        out = DEFAULT_OUT_DIR / f"{base}_{args.size if is_family else 'weights'}_seed{args.seed}{suffix}"
    else:
        out = args.out
        suffix = out.suffix.lower()
        allowed = VIDEO_SUFFIXES if is_video else IMAGE_SUFFIXES
        if suffix not in allowed:
            kind = "a video" if is_video else "an image"
            parser.error(f"--out {str(out)!r}: {args.model} makes {kind}; use one of {', '.join(allowed)}")
    use_bcg = args.bcg or args.debug_cuda_graph or args.compare
    return Plan(args.model, spec, is_family, device, dtype, call, out, is_video, use_bcg, cuda)


def finish_call_kwargs(pipe, call: dict[str, Any]) -> dict[str, Any]:
    """Adapt the planned call to this pipeline's signature (batch keyword, caption cleaning)."""
    params = call_parameters(pipe)
    call = dict(call)
    batch = call.pop("_batch", 1)
    for key in ("num_images_per_prompt", "num_videos_per_prompt"):
        if key in params:
            call[key] = batch
            break
    else:
        if batch != 1:
            raise ValueError(f"{type(pipe).__name__} takes no images-per-prompt argument; use --batch 1")
    if "clean_caption" in params and importlib.util.find_spec("bs4") is None:
        call.setdefault("clean_caption", False)  # needs beautifulsoup4; diffusers would warn and fall back
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        for key in [k for k in call if k not in params]:
            print(f"note: {type(pipe).__name__} takes no {key!r} argument; ignored")
            call.pop(key)
    return call


def list_models(api) -> int:
    print(f"{'family':<14} {'title':<28} {'kind':<6} {'CFG':<10} {'tiny':<14} full")
    for name in api.list_families():
        spec = api.get_family(name)

        def shape(sz):
            s = f"{sz.height}x{sz.width}"
            return s + (f"x{sz.num_frames}f" if sz.num_frames else "")

        print(f"{name:<14} {spec.title:<28} {'video' if spec.is_video else 'image':<6} {spec.cfg_mode:<10} "
              f"{shape(spec.tiny):<14} {shape(spec.full)}")
    return 0


# ---------------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------------
def _build(plan: Plan, args, api):
    if plan.is_family:
        return api.build_pipeline(plan.model, size=args.size, device=plan.device, dtype=plan.dtype, seed=args.seed)
    if api.load_pipeline is not None:
        params = inspect.signature(api.load_pipeline).parameters
        kwargs = {k: v for k, v in (("device", plan.device), ("dtype", plan.dtype)) if k in params}
        return api.load_pipeline(plan.model, **kwargs)
    from diffusers import DiffusionPipeline

    return DiffusionPipeline.from_pretrained(plan.model, torch_dtype=plan.dtype).to(plan.device)


def _print_run(result: RunResult, steps_planned: int | None) -> None:
    times = result.step_times
    if times:
        print(f"  {result.label}: {len(times)} steps, median step {fmt_ms(result.median_step)} "
              f"(first {fmt_ms(times[0])}, later steps median {fmt_ms(result.steady_median_step)}), "
              f"total {result.total_s:.2f} s")
    else:
        print(f"  {result.label}: total {result.total_s:.2f} s (no per-step times)")
    for note in result.notes:
        print(f"    {note}")


def _compare_outputs(a: RunResult, b: RunResult) -> tuple[bool, str]:
    import numpy as np
    import torch

    parts, same = [], True
    if a.latents is not None and b.latents is not None:
        eq = a.latents.shape == b.latents.shape and torch.equal(a.latents, b.latents)
        same &= eq
        if eq:
            parts.append("final latents bitwise identical")
        else:
            diff = (a.latents.float() - b.latents.float()).abs().max().item() if a.latents.shape == b.latents.shape else float("nan")
            parts.append(f"final latents differ (max abs diff {diff:.3g})")
    oa, ob = np.asarray(a.output), np.asarray(b.output)
    eq = oa.shape == ob.shape and np.array_equal(oa, ob)
    same &= eq
    if eq:
        parts.append("decoded outputs bitwise identical")
    else:
        diff = float(np.abs(oa.astype(np.float64) - ob.astype(np.float64)).max()) if oa.shape == ob.shape else float("nan")
        parts.append(f"decoded outputs differ (max abs diff {diff:.3g})")
    return same, "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a bad argument (2)
        return int(exc.code or 0)
    try:
        api = pipelines_api()
    except ImportError as exc:
        print(f"error: cannot use the pipelines package: {exc}", file=sys.stderr)
        return 1
    if args.list_models:
        return list_models(api)
    try:
        plan = make_plan(args, parser, api)
    except SystemExit as exc:
        return int(exc.code or 0)

    import torch

    if args.debug_cuda_graph:
        args.bcg = True
    if not plan.cuda:
        print(NO_CUDA_NOTE if plan.use_bcg else "note: running eagerly on the CPU (BCG needs a CUDA GPU).")

    bcg = None
    if plan.use_bcg:
        try:
            bcg = bcg_api("accelerate_pipeline", "BCGConfig", "get_stats")
        except BCGUnavailable as exc:
            if plan.cuda:
                print(f"error: --bcg/--compare need bcg_diffusion's pipeline API: {exc}", file=sys.stderr)
                return 1
            bcg = None  # nothing to accelerate on a CPU anyway

    label = plan.model if plan.is_family else f"{plan.model} (real weights)"
    print(f"building {label} ({args.size if plan.is_family else 'from checkpoint'}) on {plan.device} in "
          f"{str(plan.dtype).replace('torch.', '')} ...", flush=True)
    t0 = time.perf_counter()
    try:
        pipe = _build(plan, args, api)
    except Exception as exc:  # noqa: BLE001 - a failed build is reported, not a traceback
        print(f"error: could not build {label}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    build_s = time.perf_counter() - t0
    if plan.spec is None and api.family_of is not None:
        with contextlib.suppress(ValueError):
            plan.spec = api.family_of(pipe)
    pipe.set_progress_bar_config(disable=False, desc="denoising")
    try:
        call = finish_call_kwargs(pipe, plan.call)
    except ValueError as exc:
        parser.print_usage(sys.stderr)
        print(f"generate.py: error: {exc}", file=sys.stderr)
        return 2
    transformer = getattr(pipe, "transformer", None)
    setup_notes = []
    if (args.attention_backend or args.compile) and transformer is None:
        print("error: --attention-backend and --compile need a pipeline with a transformer", file=sys.stderr)
        return 2
    if args.attention_backend:
        try:
            setup_notes.append(set_attention_backend(transformer, args.attention_backend.lower()))
        except Exception as exc:  # noqa: BLE001 - e.g. the backend's package is not installed
            print(f"error: --attention-backend {args.attention_backend}: {exc}", file=sys.stderr)
            return 2
    if args.compile:
        try:
            setup_notes.append(regional_compile(transformer))
        except Exception as exc:  # noqa: BLE001
            print(f"error: --compile: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
    print(f"built in {build_s:.1f} s; {', '.join(f'{k}={v!r}' for k, v in call.items() if k != 'prompt')}")
    for note in setup_notes:
        print(f"  {note}")

    config = None
    if bcg is not None:
        config = bcg.BCGConfig(debug=True) if args.debug_cuda_graph else bcg.BCGConfig()

    def accelerate():
        if bcg is None:
            return None
        if plan.cuda:
            bcg.accelerate_pipeline(pipe, config)
        else:
            with quiet_library_warnings():  # the CPU no-op warning was already printed once above
                bcg.accelerate_pipeline(pipe, config)
        return bcg.get_stats

    def accelerate_or_report():
        try:
            return accelerate(), None
        except Exception as exc:  # noqa: BLE001 - e.g. AccelerationError (offload hooks, unknown transformer)
            return None, f"error: BCG could not be applied: {type(exc).__name__}: {exc}"

    tag = " + compile" if args.compile else ""
    results: list[RunResult] = []
    try:
        if args.compare:
            if plan.cuda:  # one-off CUDA initialisation (cuBLAS, cuDNN, allocator) must not count against eager
                print("warm-up: one untimed 1-step eager call", flush=True)
                run_pipeline(pipe, {**call, "num_inference_steps": 1}, args.seed, plan.device, "warm-up")
            results.append(run_pipeline(pipe, call, args.seed, plan.device, "eager" + tag))
            stats_fn, problem = accelerate_or_report()
            if problem:
                print(problem, file=sys.stderr)
                return 1
            bcg_label = ("bcg-debug" if args.debug_cuda_graph else "bcg") + tag
            if not plan.cuda:
                bcg_label += " (inactive: no CUDA)"
            results.append(run_pipeline(pipe, call, args.seed, plan.device, bcg_label))
            results[-1].bcg_stats = stats_fn(pipe) if stats_fn else None
        else:
            stats_fn, problem = accelerate_or_report() if args.bcg else (None, None)
            if problem:
                print(problem, file=sys.stderr)
                return 1
            mode = ("bcg-debug" if args.debug_cuda_graph else "bcg") if args.bcg and plan.cuda else "eager"
            results.append(run_pipeline(pipe, call, args.seed, plan.device, mode + tag))
            results[-1].bcg_stats = stats_fn(pipe) if stats_fn else None
    except Exception as exc:  # noqa: BLE001
        print(f"error: generation failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1

    written = save_output(results[0].output, plan.out, plan.is_video, args.fps)
    if args.compare:
        written += save_output(results[1].output, plan.out, plan.is_video, args.fps, tag="_bcg")

    print(f"summary: {label}, {args.size if plan.is_family else 'checkpoint'}, {plan.device}, "
          f"{str(plan.dtype).replace('torch.', '')}, batch {args.batch}, build {build_s:.1f} s")
    for result in results:
        _print_run(result, call.get("num_inference_steps"))
        if plan.use_bcg and result is results[-1] and (args.bcg or args.compare):
            if result.bcg_stats is not None:
                print(format_bcg_stats(result.bcg_stats, indent="    "))
            elif plan.cuda:
                print("    BCG: get_stats returned nothing (acceleration not active)")
    if args.compare:
        eager, accel = results
        a, b = eager.steady_median_step, accel.steady_median_step
        if a and b:
            print(f"  per-step speedup (median of steps after the first): {a / b:.2f}x "
                  f"({fmt_ms(a)} eager -> {fmt_ms(b)} {accel.label})")
        same, detail = _compare_outputs(eager, accel)
        print(f"  outputs bitwise identical: {'YES' if same else 'NO'} ({detail})")
        if not plan.cuda:
            print("  (no speed-up to expect: both runs were eager on this machine)")
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
