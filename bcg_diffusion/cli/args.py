"""The command line of ``bcg-generate``: the parser and its names, importing nothing heavy.

:mod:`.generate` (the entry) parses with :func:`build_parser` before torch, diffusers or ``bcg_pipelines`` are
imported, so ``--help`` and a mistyped option answer at once; :mod:`.plan` checks the parsed arguments.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from bcg_diffusion.toolkit.offload_option import DEFAULT_SLOTS, OFFLOAD_HELP
from bcg_diffusion.toolkit.choices import CP_MODES, MAX_BATCH, MAX_STEPS, SIDE_LIMIT_RULE
from bcg_diffusion.toolkit.numbers import finite_float
from bcg_diffusion.toolkit.options import add_model_options, command_name
from bcg_diffusion.toolkit.stack_options import add_stack_options

__all__ = ["DEFAULT_MODEL", "GUIDANCE_LIMIT", "NVLINK_MULTICAST_OFF", "OWN_SIZE", "SHAPE_KEYS", "build_parser",
           "dash_value_problem", "keep_nvlink_multicast_off", "prog"]

DEFAULT_MODEL = "flux"  # the tiny Flux pipeline builds and runs fastest on a CPU (a few seconds)
DEFAULT_PROMPT = "a red fox resting in a snowy birch forest at golden hour, soft light, highly detailed"
DEFAULT_OUT_DIR = Path("outputs")
SEED_LIMIT = 2**64  # torch.Generator.manual_seed takes 0 <= seed < 2**64
SHAPE_KEYS = ("height", "width", "num_frames")  # the call settings bcg_diffusion.warmup takes per shape
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
GUIDANCE_LIMIT = 1e4  # --guidance in 0 .. GUIDANCE_LIMIT, as serve.py's guidance_scale
#: ``--warmup`` given without a value (the run's own size); an empty value (``--warmup ""``) is refused instead.
OWN_SIZE = str("<the run's own size>")
#: NCCL's NVLink multicast (NVLS) stays off wherever this program starts; set only where the user has not.
NVLINK_MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def keep_nvlink_multicast_off() -> None:
    """NCCL's NVLink multicast off (docs/multi-gpu.md, "NVLink multicast must stay off"): each variable is set
    where the user has not set it."""
    for name, value in NVLINK_MULTICAST_OFF.items():
        os.environ.setdefault(name, value)

def prog() -> str:
    """The command's name in usage and error lines: ``bcg-generate`` when run as that, else ``generate.py``."""
    return command_name("generate.py", "bcg-generate")

def dash_value_problem(argv: list[str]) -> str | None:
    """A size option given a value that starts with ``-`` (``--warmup -64x64``): argparse reads such a value as an
    option and says only "unrecognized arguments"; this says what was wrong. ``None`` when there is none."""
    for option, value in zip(argv, argv[1:]):
        if option in ("--warmup", "--height", "--width", "--frames") and value.startswith("-") and value[1:2].isdigit():
            return f"{option} {value}: sizes are positive whole numbers (WxH such as 64x64 for --warmup)"
    return None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog(),
        description="Generate an image or video with a diffusers DiT pipeline, eagerly or with breakable CUDA "
        "graphs (BCG). With no arguments: the tiny random-weight Flux pipeline, a few seconds on a CPU.",
        epilog="See docs/generate.md for examples.",
    )
    add_model_options(p, DEFAULT_MODEL, list_models=True)
    g = p.add_argument_group("generation")
    g.add_argument("--prompt", default=DEFAULT_PROMPT, help="text prompt")
    g.add_argument("--negative-prompt", default=None,
                   help="negative prompt, for runs with classifier-free guidance (a run whose pipeline would ignore it "
                   "exits with code 2 saying why)")
    g.add_argument("--height", type=int, default=None,
                   help=f"image height in pixels (default: the family's for --size). The limit is {SIDE_LIMIT_RULE} "
                   "(--list-models prints each family's)")
    g.add_argument("--width", type=int, default=None, help="image width in pixels (default and limit: as --height)")
    g.add_argument("--frames", type=int, default=None, help="number of frames (video families only)")
    g.add_argument("--steps", type=int, default=None,
                   help=f"denoising steps, 1 .. {MAX_STEPS} (default: the family's)")
    g.add_argument("--guidance", type=finite_float, default=None,
                   help=f"guidance scale, 0 .. {GUIDANCE_LIMIT:.0f} (default: the family's)")
    g.add_argument("--seed", type=int, default=0, help="random seed of the initial noise, 0 <= seed < 2**64 (default: 0)")
    g.add_argument("--batch", type=int, default=1, help=f"images or videos per prompt, 1 .. {MAX_BATCH} (default: 1)")
    g.add_argument("--no-resolution-binning", action="store_true",
                   help="run the asked height x width as it is (use_resolution_binning=False). By default pipelines "
                   "that bin (PixArt, Sana) run the nearest of the model's aspect-ratio bins and resize the result "
                   "to the asked size; the summary says when that happened")
    g = p.add_argument_group("speed")
    g.add_argument("--bcg", action="store_true", help="replay each denoising step as breakable CUDA graphs")
    g.add_argument("--debug-cuda-graph", action="store_true",
                   help="BCG with every segment run eagerly (BCGConfig(debug=True)); implies --bcg")
    add_stack_options(g)  # --quant, --cache, --compile, --compile-cache, --attention-backend: as bcg-serve's
    g.add_argument("--offload", type=int, nargs="?", const=DEFAULT_SLOTS, default=None, metavar="K",
                   help=f"{OFFLOAD_HELP}; with --compare both runs stream")
    g.add_argument("--compare", action="store_true",
                   help="run eagerly, then with BCG on the same pipeline and seed; report the per-step speedup "
                   "and whether the outputs are bitwise identical")
    g.add_argument("--warmup", nargs="?", const=OWN_SIZE, default=None, metavar="WxH[,WxH...]",
                   help="before each timed run, bcg_diffusion.warmup(pipe, shapes, ...) with the run's other call "
                   "settings: with no value the run's own size, else these sizes (width x height, as the OpenAI images "
                   "API; WxHxFRAMES for videos). The output is the same with and without it")
    g = p.add_argument_group("several GPUs")
    g.add_argument("--cp", choices=CP_MODES, default=None,
                   help="diffusers context parallelism over the GPUs of a torchrun launch (torchrun --nproc_per_node N "
                   "scripts/generate.py --cp ulysses ...): ulysses_degree=N or ring_degree=N. Rank 0 writes the output "
                   "and prints the summary")
    g = p.add_argument_group("output")
    g.add_argument("--out", default=None,
                   help="output file: .png/.jpg/.webp for images, .mp4 or .gif for videos. MP4 needs imageio + "
                   "imageio-ffmpeg (pip install -e \".[video]\") or opencv; without them x.mp4 is written as the GIF "
                   "x.gif, and the command says so before it starts. A missing folder is created (the command says "
                   "so). Default: outputs/<model>_<size>_seed<seed>.png (.mp4 or .gif for videos)")
    g.add_argument("--fps", type=int, default=16, help="frames per second of a saved video (default: 16)")
    return p
