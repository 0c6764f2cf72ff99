"""The arguments of ``bcg-generate`` checked into a :class:`Plan` before anything is built.

Every check that can be made before the build runs in :func:`make_plan` and ends in ``parser.error`` (exit
code 2) naming the first thing to fix. What only a loaded checkpoint can tell (its family, its transformer,
whether its pipeline bins resolutions) is checked by :mod:`.run` once it is loaded.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bcg_diffusion.toolkit.choices import MAX_BATCH, MAX_STEPS, SIDE_LIMIT_RULE
from bcg_diffusion.toolkit.offload_option import offload_problem, offload_with_quant_problem
from bcg_diffusion.toolkit.files import is_folder
from bcg_diffusion.toolkit.media import IMAGE_SUFFIXES, VIDEO_SUFFIXES, can_write_mp4, missing_folder, video_target, why_not_writable
from bcg_diffusion.toolkit.model_limits import SideLimit, family_side_limit, largest_square, min_steps
from bcg_diffusion.toolkit.options import check_binning_flag, choose_device, family_or_checkpoint
from bcg_diffusion.toolkit.stack_options import StackOptions, read_stack
from bcg_diffusion.toolkit.sizes import parse_sizes

from .args import DEFAULT_OUT_DIR, GUIDANCE_LIMIT, OWN_SIZE, SEED_LIMIT, SHAPE_KEYS, TORCHRUN_VARIABLES

__all__ = ["Plan", "Ranks", "make_plan", "negative_prompt_problem"]


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
    dicts); ``ranks`` is set under ``--cp``; ``stack`` holds ``--quant``, ``--cache``, ``--compile``,
    ``--compile-cache`` and ``--attention-backend``, read as ``bcg-serve`` reads them.
    """

    model: str
    spec: Any  # FamilySpec, or None (real weights of a family not known yet)
    is_family: bool
    model_size: str  # --size of a family (tiny, full); "checkpoint" for real weights (not the image size)
    device: torch.device  # noqa: F821
    dtype: torch.dtype  # noqa: F821 - torch is imported where a plan is made (make_plan)
    call: dict[str, Any]
    out: Path
    is_video: bool
    use_bcg: bool
    warmup: list[dict[str, int]] | None = None
    ranks: Ranks | None = None
    stack: StackOptions = field(default_factory=StackOptions)  # the speed stack, read once
    notes: list[str] = field(default_factory=list)  # said before the build (the file --out becomes, a new folder)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def is_rank0(self) -> bool:
        return self.ranks is None or self.ranks.rank == 0

    @property
    def error_prefix(self) -> str:
        return "" if self.ranks is None else f"[rank {self.ranks.rank}] "

def make_plan(args, parser: argparse.ArgumentParser) -> Plan:
    """Validate the arguments (``parser.error`` -> exit 2) and work out the pipeline call, before any work."""
    import bcg_pipelines as pipelines

    check_arguments(args, parser)
    spec = family_or_checkpoint(args.model, parser)
    check_sides(args, spec, parser)
    check_steps(args, spec, parser)
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
    # the stack as bcg-serve reads it (a checkpoint's family is known after loading: its cache is checked then)
    stack = read_stack(args, parser, family=spec.name if spec is not None else None, device=device)
    check_offload(args, parser)
    model_size = args.size if spec is not None else "checkpoint"
    try:
        call = pipelines.plan_call(spec, args.size, prompt=args.prompt, height=args.height, width=args.width,
                                   num_frames=args.frames, steps=args.steps, guidance=args.guidance,
                                   negative_prompt=args.negative_prompt)
    except ValueError as exc:
        parser.error(str(exc))
    if args.negative_prompt is not None and spec is not None:  # a checkpoint's pipeline is checked once it is loaded
        problem = negative_prompt_problem(spec, call, spec.name, spec.guidance_kwarg)
        if problem:
            parser.error(problem)
    is_video = spec.is_video if spec is not None else (args.frames or 1) > 1
    model_name = args.model if spec is not None else Path(args.model).name
    out, notes = output_path(args, parser, model_name, model_size, is_video)
    if spec is not None and model_size == "full" and device.type != "cuda" and not args.yes:
        check_full_size_on_cpu(spec, dtype, parser)
    use_bcg = args.bcg or args.debug_cuda_graph or args.compare
    warmup = None
    if args.warmup is not None:
        warmup = parse_warmup_sizes(args.warmup, spec, model_size, call, is_video, parser)
    return Plan(args.model, spec, spec is not None, model_size, device, dtype, call, out, is_video, use_bcg, warmup, ranks,
                stack, notes)

def check_arguments(args, parser: argparse.ArgumentParser) -> None:
    """``parser.error`` (exit 2) for numbers out of range and text that is not UTF-8 (the stack's options:
    :func:`~bcg_diffusion.toolkit.stack_options.read_stack`)."""
    limits = {"steps": MAX_STEPS, "batch": MAX_BATCH}  # the others have their own limits (shapes) or none
    for name in ("steps", "batch", "height", "width", "frames", "fps"):
        value, limit = getattr(args, name), limits.get(name)
        if value is not None and limit is not None and not 1 <= value <= limit:
            parser.error(f"--{name} must be in 1 .. {limit} (got {value})")
        if value is not None and value < 1:
            parser.error(f"--{name} must be >= 1 (got {value})")
    for name in ("prompt", "negative_prompt"):
        problem = not_utf8(getattr(args, name))
        if problem:
            parser.error(f"--{name.replace('_', '-')} is not valid UTF-8 ({problem}); give the text in UTF-8 (the "
                         "terminal's or the script's encoding)")
    if args.guidance is not None and not (math.isfinite(args.guidance) and 0 <= args.guidance <= GUIDANCE_LIMIT):
        parser.error(f"--guidance must be a number in 0 .. {GUIDANCE_LIMIT:.0f} (got {args.guidance})")
    if not 0 <= args.seed < SEED_LIMIT:
        parser.error(f"--seed must be in 0 .. 2**64 - 1 (got {args.seed})")

def check_offload(args, parser: argparse.ArgumentParser) -> None:
    """``--offload K``: K >= 2, and not with ``--cp`` or ``--quant`` (``parser.error`` saying why)."""
    if args.offload is None:
        return
    problem = offload_problem(args.offload)
    if problem:
        parser.error(problem)
    if args.cp is not None:
        parser.error(f"--offload with --cp {args.cp}: context parallelism splits the work, not the weights; each rank "
                     "would stream the whole transformer. Use one of the two")
    if problem := offload_with_quant_problem(args.offload, args.quant):
        parser.error(problem)

def not_utf8(text: str | None) -> str | None:
    """Where ``text`` (an argument as Python decoded it) cannot be UTF-8, or ``None``: bytes that were not UTF-8
    reach Python as lone surrogates U+DC80..U+DCFF (``surrogateescape``), which no tokenizer takes."""
    if text is None:
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"lone surrogate U+{code:04X}"
        return f"{what} at character {exc.start}"
    return None

def negative_prompt_problem(pipe_or_family, call: dict[str, Any], name: str, guidance_kwarg: str) -> str | None:
    """Why ``--negative-prompt`` would have no effect on this pipeline (a family, or a loaded checkpoint named
    ``name`` whose ``--guidance`` goes to ``guidance_kwarg``) with this call, and what to do; ``None`` if it counts
    (``bcg_pipelines.ignored_call_fields``)."""
    import bcg_pipelines as pipelines

    ignored = pipelines.ignored_call_fields(pipe_or_family, call).get("negative_prompt")
    if ignored is None:
        return None
    if ignored.setting == guidance_kwarg:
        todo = f"give --guidance above {ignored.above:g}, or leave --negative-prompt out"
    elif ignored.setting is not None:
        todo = (f"leave --negative-prompt out (this command does not set {ignored.setting}; from Python, call the "
                f"pipeline with {ignored.setting} > {ignored.above:g})")
    else:
        todo = "leave --negative-prompt out"
    return f"--negative-prompt has no effect on {name}: {ignored.reason}; {todo}"

def check_sides(args, spec, parser: argparse.ArgumentParser) -> None:
    """``--height``/``--width`` above the model's limit (:func:`~bcg_diffusion.toolkit.model_limits.family_side_limit`:
    its position table, or the rule's bound: such a run would take hours and tens of GiB): ``parser.error``."""
    limit = family_side_limit(spec, args.size)
    for name in ("height", "width"):
        value = getattr(args, name)
        if value is not None and value > limit.pixels:
            parser.error(f"--{name} {value} is above the limit of {limit.pixels} px for {side_limit_text(spec, args.size, limit)}")


def side_limit_text(spec, size: str, limit: SideLimit) -> str:
    """The model and why its sides are bounded, for a message after "the limit of N px for ": the rule's text
    (``flux (4x the largest side ...; --list-models ...)``), or the position table's with the largest size."""
    if limit.reason == SIDE_LIMIT_RULE:
        return f"{spec.name if spec is not None else 'a checkpoint'} ({SIDE_LIMIT_RULE}; --list-models prints each family's)"
    square = largest_square(limit, spec.spatial_multiple if spec is not None else 1)
    return f"{spec.name if spec is not None else 'this checkpoint'} ({size}): {limit.reason}; the largest size is {square}x{square}"


def check_steps(args, spec, parser: argparse.ArgumentParser) -> None:
    """``--steps`` below what the family's scheduler takes (:func:`~bcg_diffusion.toolkit.model_limits.min_steps`):
    ``parser.error`` (a checkpoint's scheduler is checked once it is loaded)."""
    if spec is None or args.steps is None:
        return
    fewest = min_steps(spec.scheduler_config, spec.scheduler_class_name)
    if args.steps < fewest.steps:
        parser.error(f"--steps {args.steps}: {spec.name}'s scheduler {fewest.reason}; give --steps {fewest.steps} or more")


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

    import bcg_pipelines as pipelines

    from bcg_diffusion.toolkit.speedups import has_cp_plan

    def splittable(family) -> bool:
        return has_cp_plan(getattr(diffusers, family.transformer_class_name))

    if not splittable(spec):
        can = [name for name in pipelines.list_families() if splittable(pipelines.get_family(name))]
        parser.error(f"--cp {mode}: {spec.transformer_class_name} ({spec.name}) has no _cp_plan, so diffusers cannot "
                     f"split it over GPUs; families that have one: {', '.join(can)}")

def cp_device(ranks: Ranks, args, parser: argparse.ArgumentParser):
    """``cuda:LOCAL_RANK``, after checking that there is such a GPU and no other ``--device`` was asked for."""
    import torch
    if args.device not in (None, "cuda"):
        parser.error(f"--cp {ranks.mode} puts rank r on cuda:LOCAL_RANK; leave out --device {args.device}")
    if not torch.cuda.is_available():
        parser.error(f"--cp {ranks.mode} needs one CUDA GPU per rank (NCCL), and torch sees no CUDA device")
    if ranks.local_rank >= torch.cuda.device_count():
        parser.error(f"--cp {ranks.mode}: LOCAL_RANK {ranks.local_rank}, but torch sees only "
                     f"{torch.cuda.device_count()} CUDA device(s); use --nproc_per_node <= the number of GPUs")
    return torch.device("cuda", ranks.local_rank)

def output_path(args, parser, model_name: str, model_size: str, is_video: bool) -> tuple[Path, list[str]]:
    """``--out`` checked for its suffix and that it can be written (or the default path), and the notes to print
    before the build: the GIF an MP4 becomes without an MP4 writer, a folder that will be created."""
    if args.out is None:
        suffix = (".mp4" if can_write_mp4() else ".gif") if is_video else ".png"
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", model_name).strip("-.") or "model"
        size_tag = model_size if model_size != "checkpoint" else "weights"
        return DEFAULT_OUT_DIR / f"{name}_{size_tag}_seed{args.seed}{suffix}", []
    allowed = VIDEO_SUFFIXES if is_video else IMAGE_SUFFIXES
    given = Path(args.out)  # args.out is the text as typed: a trailing "/" marks a folder, existing or not
    if is_folder(given) or args.out.endswith(("/", os.sep)):
        example = given / f"{model_name}.{'gif' if is_video else 'png'}"
        parser.error(f"--out {args.out!r} cannot be written: it is a folder; give a file in it, e.g. --out "
                     f"{example}")
    if given.suffix.lower() not in allowed:
        kind = "a video" if is_video else "an image"
        parser.error(f"--out {args.out!r}: {args.model} makes {kind}; use one of {', '.join(allowed)}")
    out, note = video_target(given) if is_video else (given, None)
    notes = [note] if note else []
    added = (len("_bcg") if args.compare else 0) + (len(f"_{args.batch - 1}") if args.batch > 1 else 0)
    problem = why_not_writable(out, name_extra=added)  # the names of --compare's and --batch's files are longer
    if problem:
        parser.error(f"--out {args.out!r} cannot be written: {problem}")
    folder = missing_folder(out)
    if folder is not None:
        notes.append(f"note: --out {args.out}: the folder {folder} does not exist; it is created when the output is "
                     "written")
    return out, notes

def check_full_size_on_cpu(spec, dtype, parser: argparse.ArgumentParser) -> None:
    """``parser.error`` with the memory a full-size build needs (from the family's parameter counts)."""
    import torch

    import bcg_pipelines as pipelines
    d = pipelines.describe(spec, "full")
    params = d.transformer_params + sum(te[3] for te in d.text_encoders)
    gib = params * torch.empty((), dtype=dtype).element_size() / 2**30
    parser.error(f"--size full without CUDA builds {spec.name} on the CPU: {d.transformer_params / 1e9:.1f}B "
                 f"transformer and {(params - d.transformer_params) / 1e9:.1f}B text-encoder parameters, about "
                 f"{gib:.0f} GiB of memory in {pipelines.dtype_name(dtype)} for the weights alone (VAE and "
                 "activations on top), and minutes per step. Pass --yes to build it anyway.")

def parse_warmup_sizes(text: str, spec, model_size: str, call: dict[str, Any], is_video: bool,
                       parser: argparse.ArgumentParser) -> list[dict[str, int]]:
    """``--warmup`` as ``bcg_diffusion.warmup`` shapes: :data:`~.args.OWN_SIZE` (the option without a value) is the
    run's own size; an empty value is refused; else ``WxH[xF],...``
    (width first, as the OpenAI images API and serve.py), each checked as ``--height/--width`` are."""
    import bcg_pipelines as pipelines

    if text is not OWN_SIZE and not text.strip():
        parser.error(f"--warmup {text!r}: give sizes such as 512x512,768x512, or --warmup alone (no value) for the "
                     "run's own size")
    if text is OWN_SIZE:
        own = {k: call[k] for k in SHAPE_KEYS if k in call}
        if "height" not in own or "width" not in own:
            parser.error("--warmup without sizes warms the run's own size, which this checkpoint leaves to its "
                         "pipeline; give --height and --width, or sizes such as --warmup 1024x1024")
        return [own]
    try:
        sizes = parse_sizes(text)
    except ValueError as exc:
        parser.error(f"--warmup {text!r}: {exc}")
    shapes = []
    for size in sizes:
        width, height = size.width, size.height
        limit = family_side_limit(spec, model_size if spec is not None else "full")
        if max(width, height) > limit.pixels:
            parser.error(f"--warmup {size.text}: above the limit of {limit.pixels} px per side for "
                         f"{side_limit_text(spec, model_size, limit)}")
        frames = size.frames if size.frames else call.get("num_frames")
        if size.frames and not is_video:
            parser.error(f"--warmup {size.text}: {spec.name if spec else 'this model'} makes images; give WxH")
        if spec is None:
            shape = {"height": height, "width": width, **({"num_frames": frames} if frames else {})}
        else:
            try:
                shape = pipelines.check_call(spec, height, width, frames, size=model_size)
            except ValueError as exc:
                parser.error(f"--warmup {size.text}: {exc}")
        shapes.append(shape)
    return shapes
