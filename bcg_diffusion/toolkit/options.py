"""What ``generate.py`` and ``serve.py`` share on their command lines: the model options, reading ``--model``
and ``--device``, quieting known-harmless library messages (the library's), and :class:`Failure`.

Building the options imports nothing heavy (:mod:`.choices`); torch and ``bcg_pipelines`` are imported by the
checks that need them, after the arguments are parsed.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import sys
from pathlib import Path

import bcg_diffusion

from .choices import DTYPE_NAMES, SIZES

#: A hub id: ``org/name`` (both parts as the Hugging Face Hub allows them), nothing more.
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
#: The devices the commands run on: CUDA (with BCG) or the CPU (eagerly).
DEVICE_TYPES = ("cuda", "cpu")


class Failure(Exception):
    """A run that stops with ``message`` on stderr and exit code ``code``."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def add_model_options(p: argparse.ArgumentParser, default_model: str, *, which: str = "",
                      list_models: bool = False) -> argparse._ArgumentGroup:
    """The ``model`` group: ``--model``, ``--size``, ``--yes``, ``--device``, ``--dtype`` (and ``--list-models``);
    ``which`` narrows the families ``--model`` takes (e.g. "; image families only")."""
    g = p.add_argument_group("model")
    g.add_argument("--model", default=default_model,
                   help="a family of the pipelines registry (random weights"
                   + ("; --list-models shows them" if list_models else "")
                   + f"), or a local pipeline folder / hub id (org/name) for real weights (default: {default_model})"
                   + which)
    g.add_argument("--size", choices=SIZES, default="tiny",
                   help="tiny: a few-layer model for CPUs and tests; full: the published architecture (default: tiny)")
    g.add_argument("--yes", action="store_true", help="build --size full even without CUDA (needs tens of GiB)")
    if list_models:
        g.add_argument("--list-models", action="store_true", help="list the families and exit")
    g.add_argument("--device", default=None,
                   help="cuda, cuda:N or cpu (default: cuda if available, else cpu; BCG needs cuda)")
    g.add_argument("--dtype", choices=DTYPE_NAMES, default=None, help="default: bf16 on CUDA, fp32 on CPU")
    return g


def family_or_checkpoint(model: str, parser: argparse.ArgumentParser):
    """The family spec of ``model``, or ``None`` for a local pipeline folder or a hub id (``org/name``);
    ``parser.error`` for an unknown name, a path that does not exist or a folder that holds no pipeline."""
    import bcg_pipelines as pipelines

    if model in pipelines.list_families():
        return pipelines.get_family(model)
    families = ", ".join(pipelines.list_families())
    if not model.strip():
        parser.error(f"--model is empty; give a family ({families}), a local pipeline folder (with model_index.json; "
                     "--model . for the current folder) or a hub id such as org/name")
    path = Path(model).expanduser()
    if path.is_dir():
        problem = pipeline_index_problem(path)
        if problem:
            parser.error(f"--model {model}: {problem}; give the folder that pipe.save_pretrained() or huggingface-cli "
                         "download wrote")
        return None
    if path.exists():
        parser.error(f"--model {model} is a file; give a pipeline folder (with model_index.json), a hub id such as "
                     f"org/name, or a family: {families}")
    if HUB_ID.match(model) and not model.startswith((".", "~")):
        check_hub_id(model, parser)
        return None
    if "/" in model or "\\" in model or model.startswith(("~", ".")):
        parser.error(f"--model {model}: no such folder; give a local pipeline folder (with model_index.json), a "
                     f"hub id such as org/name, or a family: {families}")
    parser.error(f"--model: unknown family {model!r}; known families: {families} "
                 "(or give a local pipeline folder or a hub id such as org/name)")


def pipeline_index_problem(folder: Path) -> str | None:
    """Why ``folder`` holds no loadable diffusers pipeline index, or ``None``: ``model_index.json`` must exist and be a
    JSON object naming the pipeline class (``_class_name``), which ``DiffusionPipeline.from_pretrained`` reads."""
    index = folder / "model_index.json"
    if not index.is_file():
        return "the folder holds no diffusers pipeline (no model_index.json)"
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return f"model_index.json is not valid JSON ({exc})"
    if not isinstance(data, dict):
        return f"model_index.json is not a JSON object (it holds a {type(data).__name__})"
    if not isinstance(data.get("_class_name"), str):
        return "model_index.json has no _class_name (the pipeline class diffusers loads), so it describes no pipeline"
    return None


def command_name(script: str, command: str) -> str:
    """The name a command shows in its usage and error lines: ``command`` (``bcg-generate``) when this process was
    started as that console script, else ``script`` (``generate.py``: run as a script, with ``python -m`` or from
    Python)."""
    return command if Path(sys.argv[0]).name.removesuffix(".exe") == command else script


def hub_offline() -> bool:
    return any(os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}
               for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def check_hub_id(model: str, parser: argparse.ArgumentParser) -> None:
    """``parser.error`` for a hub id that cannot be loaded without the network while the hub is offline."""
    if not hub_offline():
        return  # it may be downloaded; a failure is reported after the attempt (offline_hint)
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - diffusers depends on huggingface_hub
        return
    if isinstance(try_to_load_from_cache(model, "model_index.json"), str):
        return
    parser.error(f"--model {model}: not in the local Hugging Face cache, and the Hub is offline (HF_HUB_OFFLINE is "
                 f"set). {download_hint(model)}")


def download_hint(model: str) -> str:
    local = f"/path/to/{model.split('/')[-1]}"
    return (f"Download it where the Hub can be reached (huggingface-cli download {model} --local-dir {local}), copy "
            f"the folder here and pass --model {local}; or run a family with random weights (--model flux --size "
            "full)")


def offline_hint(model: str, exc: BaseException) -> str | None:
    """The message of a hub id that could not be loaded (not cached, the Hub unreachable), for a command line:
    what happened in one sentence and how to pass a folder; ``None`` when ``exc`` is another failure."""
    text = str(exc)
    if not HUB_ID.match(model) or Path(model).expanduser().exists() or "could not load pipeline" not in text:
        return None
    reason = "the Hub is offline (HF_HUB_OFFLINE is set)" if hub_offline() else "the Hub could not be reached"
    return (f"could not load {model}: it is not a local folder, not in the local Hugging Face cache, and {reason}. "
            f"{download_hint(model)}")


def check_binning_flag(spec, parser: argparse.ArgumentParser) -> None:
    """``--no-resolution-binning`` on a family whose pipeline does not bin: ``parser.error``."""
    import diffusers

    pipeline_class = getattr(diffusers, spec.pipeline_class_name)
    if "use_resolution_binning" not in inspect.signature(pipeline_class.__call__).parameters:
        parser.error(f"--no-resolution-binning: {spec.pipeline_class_name} does not bin resolutions (its __call__ "
                     "takes no use_resolution_binning), so it already runs the asked size; leave the flag out")


def choose_device(args, parser: argparse.ArgumentParser):
    """``--device`` as a ``torch.device``: ``cuda``, ``cuda:N`` (a GPU torch sees) or ``cpu``; anything else is a
    usage error (exit code 2) in one line, before anything is built."""
    import torch

    import bcg_pipelines as pipelines

    try:
        device = pipelines.resolve_device(args.device)
    except RuntimeError:
        parser.error(f"--device {args.device!r} is not a device name torch reads; use cuda, cuda:N or cpu")
    if device.type not in DEVICE_TYPES:
        parser.error(f"--device {args.device}: this command runs on cuda (with BCG) or on the cpu (eagerly), not on "
                     f"{device.type}; use cuda, cuda:N or cpu")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            parser.error(f"--device {args.device} asks for CUDA, but torch sees no CUDA device; use --device cpu "
                         "(everything runs eagerly)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            parser.error(f"--device {args.device}: torch sees {torch.cuda.device_count()} CUDA device(s), "
                         f"cuda:0 .. cuda:{torch.cuda.device_count() - 1}")
    return device


# -- known-harmless library messages -----------------------------------------------------------------------
def quiet_known_messages() -> None:
    """Drop the library messages that say nothing on every run of the commands
    (:func:`bcg_diffusion.quiet_known_messages`, which ``import bcg_diffusion`` already called; again is a no-op)."""
    bcg_diffusion.quiet_known_messages()
