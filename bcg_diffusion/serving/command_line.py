"""``bcg-serve``'s command line: every option group, and the logging ``--log-level`` sets. Nothing heavy is imported
(``--help`` and a mistyped option answer at once); :mod:`.server_plan` reads the options into a plan. The Ray Serve
replicas parse their server's options with the same parser (:mod:`.replicas.state`).
"""

from __future__ import annotations

import argparse
import logging
import sys

from bcg_diffusion.toolkit.choices import MAX_BATCH, MAX_STEPS
from bcg_diffusion.toolkit.numbers import finite_float
from bcg_diffusion.toolkit.offload_option import DEFAULT_SLOTS, OFFLOAD_HELP
from bcg_diffusion.toolkit.options import add_model_options
from bcg_diffusion.toolkit.stack_options import add_stack_options

from .adapters.options import add_lora_options  # light: the adapters are imported where they are loaded
from .batching.stepping.config import POLICIES  # no diffusers
from .http.listen import API_KEY_VARIABLE, LISTENING_PREFIX  # uvicorn only once serving
from .serve_defaults import DEFAULT_TARGET_ONGOING_REQUESTS, DEFAULT_WINDOW_MS, DEFAULT_WORK_LIMIT, prog

__all__ = ["DEFAULT_HOST", "DEFAULT_MAX_BATCH", "DEFAULT_MAX_N", "DEFAULT_MAX_PIXELS", "DEFAULT_MAX_QUEUE",
           "DEFAULT_MAX_STEPS", "DEFAULT_MODEL", "DEFAULT_PORT", "REPLICA_FLAGS", "build_parser", "configure_logging"]

DEFAULT_MODEL = "flux"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_PIXELS = 2048 * 1024
DEFAULT_MAX_STEPS = MAX_STEPS  # as bcg-generate's --steps
DEFAULT_MAX_N = 4
DEFAULT_MAX_QUEUE = 64
#: --max-batch: off by default (a lone request would pay for a full batch, and batched images differ from unbatched
#: ones: another batch shape); docs/serving.md#batching says when to turn it on.
DEFAULT_MAX_BATCH = 1
#: The flags of the replicas' group (each takes a value; :mod:`.replicas.options` reads them).
REPLICA_FLAGS = ("--replicas", "--max-replicas", "--target-ongoing-requests", "--gpus-per-replica")


def build_parser() -> argparse.ArgumentParser:
    """``bcg-serve``'s parser: model, speed, requests, batching, adapters, server and replicas."""
    p = argparse.ArgumentParser(
        prog=prog(),
        description="Serve one diffusers DiT pipeline with the OpenAI images API (POST /v1/images/generations), "
        "eagerly or with breakable CUDA graphs. GET /stats and GET /health. See docs/serving.md.",
    )
    add_model_options(p, DEFAULT_MODEL, which="; image families only")
    add_speed_options(p)
    add_request_options(p)
    add_batching_options(p)
    add_lora_options(p)
    add_server_options(p)
    add_replica_options(p)
    return p


def add_speed_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speed")
    g.add_argument("--bcg", action="store_true", help="replay each denoising step as breakable CUDA graphs")
    add_stack_options(g)  # --quant, --cache, --compile, --compile-cache, --attention-backend: as bcg-generate's
    g.add_argument("--offload", type=int, nargs="?", const=DEFAULT_SLOTS, default=None, metavar="K", help=OFFLOAD_HELP)
    g.add_argument("--warmup", default=None, metavar="WxH[,WxH...]",
                   help="sizes to run once before listening, e.g. 512x512,1024x1024 (one 2-step bcg_diffusion.warmup "
                   "call per size, as its requests would call the pipeline; with --cache, calls of the default step "
                   "count, so that the cached steps' paths are warmed too). With --compile or --cache and no "
                   "--warmup, the default size is warmed")


def add_request_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("requests")
    g.add_argument("--default-size", default=None, metavar="WxH",
                   help="size of a request without one (default: the family's for --size; 1024x1024 for a checkpoint)")
    g.add_argument("--steps", type=int, default=None,
                   help="num_inference_steps of a request without one (default: the family's)")
    g.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS,
                   help=f"largest width x height a request may ask for (default: {DEFAULT_MAX_PIXELS})")
    g.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS,
                   help=f"largest num_inference_steps (default: {DEFAULT_MAX_STEPS})")
    g.add_argument("--max-n", type=int, default=DEFAULT_MAX_N, help=f"largest n (default: {DEFAULT_MAX_N})")
    g.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE,
                   help=f"requests waiting or running at once; more get a 503 (default: {DEFAULT_MAX_QUEUE})")
    g.add_argument("--served-model-name", default=None, metavar="ID",
                   help="the base model's id in GET /v1/models and in a request's model field (default: --model as "
                   "given); a request without model, or with this id, gets the base model; any other unknown id a 404")
    g.add_argument("--no-resolution-binning", action="store_true",
                   help="pass use_resolution_binning=False wherever the pipeline takes it (PixArt, Sana): the "
                   "transformer then runs the size asked for, not the nearest aspect-ratio bin")


def add_batching_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("batching (docs/serving.md#batching)")
    g.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH, metavar="ROWS",
                   help="run requests that can share a pipeline call (same size, steps, guidance, adapter, ...) as one "
                   "call of exactly ROWS images (filler rows pad it, so an image never depends on its batch); "
                   f"1: no batching, one call per request (default: {DEFAULT_MAX_BATCH}; at most {MAX_BATCH})")
    g.add_argument("--batch-window-ms", type=finite_float, default=DEFAULT_WINDOW_MS, metavar="MS",
                   help="the longest a request waits for others to join its batch; a batch runs earlier once full or "
                   f"once every client of the previous call is back (default: {DEFAULT_WINDOW_MS:g})")
    g.add_argument("--batch-work-limit", type=int, default=DEFAULT_WORK_LIMIT, metavar="N",
                   help="sizes whose latent tokens x hidden size x CFG rows is above N are compute-bound and run "
                   f"unbatched (default: {DEFAULT_WORK_LIMIT}; 0: batch every size)")
    g.add_argument("--batching", choices=("request", "step"), default="request",
                   help="how --max-batch ROWS batches: request (one pipeline call per batch of requests, formed in a "
                   "window) or step (a running batch of ROWS slots per size: requests join at every denoising step "
                   "and leave when done; docs/serving.md#step-batching). Default: request")
    g.add_argument("--step-policy", choices=POLICIES, default=None,
                   help="--batching step: which size's running batch takes the next step: round_robin (each in "
                   "turn, the default) or oldest_first (the one holding the oldest request)")


def add_server_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server")
    g.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to listen on (default: {DEFAULT_HOST}; anything else is reachable from other "
                   "machines: give it an API key)")
    g.add_argument("--api-key", default=None, metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' on every route but /health (a 401 otherwise; the OpenAI "
                   f"client sends its api_key so). Default: the environment variable {API_KEY_VARIABLE}, if set; "
                   "else no key. The variable keeps the key out of the process list")
    g.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port (default: {DEFAULT_PORT}; 0: a free port, printed as '{LISTENING_PREFIX}URL')")
    g.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info",
                   help="log level of the server's own log on stderr (default: info)")


def add_replica_options(parser: argparse.ArgumentParser) -> None:
    """The ``replicas (Ray Serve)`` option group of ``bcg-serve``; without ``--replicas`` the server is one
    process and Ray is not imported."""
    g = parser.add_argument_group("replicas (Ray Serve; needs the ray extra: pip install -e \".[serve,ray]\")")
    g.add_argument("--replicas", type=int, default=None, metavar="N",
                   help="run N replicas of this server on a local Ray instance behind Ray Serve's HTTP proxy, one "
                   "per GPU on CUDA (default: one process, no Ray); see docs/serving.md")
    g.add_argument("--max-replicas", type=int, default=None, metavar="M",
                   help="autoscale between --replicas and M replicas by ongoing requests (default: a fixed count)")
    g.add_argument("--target-ongoing-requests", type=finite_float, default=None, metavar="R",
                   help="with --max-replicas: the requests waiting or running per replica the autoscaler aims at "
                   f"(default: {DEFAULT_TARGET_ONGOING_REQUESTS:g})")
    g.add_argument("--gpus-per-replica", type=finite_float, default=None, metavar="G",
                   help="GPUs Ray reserves for each replica (default: 1 on CUDA, 0 on the CPU)")


def configure_logging(level_name: str) -> None:
    """The server's own log (``serve`` and ``bcg_diffusion.serving``) at ``--log-level`` on stderr; the library's
    and the pipelines' at WARNING (their INFO lines repeat what the server prints: the build, the warm-up
    report), unless ``--log-level debug``."""
    level = getattr(logging, level_name.upper())
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    library = logging.DEBUG if level <= logging.DEBUG else max(level, logging.WARNING)
    for name in ("bcg_diffusion", "bcg_pipelines"):
        logging.getLogger(name).setLevel(library)
    logging.getLogger("bcg_diffusion.serving").setLevel(level)
