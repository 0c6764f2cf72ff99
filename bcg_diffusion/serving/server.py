"""Serve one diffusers DiT pipeline over HTTP with the OpenAI images API, eagerly or with BCG.

``POST /v1/images/generations`` (``prompt``, ``n``, ``size`` "WxH", ``response_format`` "b64_json", plus
``num_inference_steps``, ``guidance_scale``, ``seed``, ``negative_prompt``) answers
``{"created": ..., "data": [{"b64_json": <PNG>}]}``; ``GET /stats`` and ``GET /health``. One worker
thread runs the pipeline, one call at a time; bad requests get a 400 before any pipeline work. With
``--api-key`` (or ``BCG_API_KEY``) every route but ``/health`` needs ``Authorization: Bearer <key>``. Needs
the ``serve`` extra (``pip install -e ".[serve]"``). See ``docs/serving.md``.

Examples::

    python scripts/serve.py                                    # tiny Flux on 127.0.0.1:8000, seconds on a CPU
    python scripts/serve.py --model pixart --size full --no-resolution-binning --bcg --warmup 512x512
    python scripts/serve.py --model flux --size full --bcg --compile --warmup 512x512,1024x1024 --port 0
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import ipaddress
import logging
import os
import re
import socket
import sys
import time
from typing import Any

import torch

import bcg_diffusion
import bcg_pipelines as pipelines
from bcg_diffusion.toolkit.choices import MAX_STEPS
from bcg_diffusion.toolkit.options import (
    Failure,
    add_model_options,
    check_binning_flag,
    choose_device,
    command_name,
    family_or_checkpoint,
    offline_hint,
    quiet_known_messages,
)
from bcg_diffusion.toolkit.speedups import quiet_library_warnings, regional_compile

from .listen import LISTENING_PREFIX, bind_socket, serve  # uvicorn only once serving
from .replica_options import add_replica_arguments  # no Ray

SERVE_EXTRA_MODULES = ("fastapi", "uvicorn", "starlette", "pydantic", "httpx")
try:
    from .adapter_options import add_lora_options, attach_adapters, lora_specs, warm_adapters
    from .app import ServerState, create_app
    from .batching import DEFAULT_WINDOW_MS, DEFAULT_WORK_LIMIT, BatchPolicy, BatchShapes, BatchStats, RequestBatcher
    from .granularity import pixel_granularity
    from .requests import RequestError, RequestLimits, RequestPlanner, parse_size
    from .startup_warmup import run_warmup
    from .worker import ImageGenerator, PipelineWorker, ServerCounters, parse_injection
except ModuleNotFoundError as exc:  # the serve extra is not installed
    if exc.name not in SERVE_EXTRA_MODULES:
        raise
    MISSING_SERVE_EXTRA: str | None = f"{exc}; install the server's packages with: pip install -e \".[serve]\""
    DEFAULT_WINDOW_MS, DEFAULT_WORK_LIMIT = 500.0, 1 << 21  # --help still shows them (batching.py owns them)
else:
    MISSING_SERVE_EXTRA = None

logger = logging.getLogger("serve")

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
CHECKPOINT_DEFAULT_SIZE = (1024, 1024)
CHECKPOINT_DEFAULT_STEPS = 28
#: The environment variable that holds the API key when --api-key is not given (vLLM's VLLM_API_KEY, here).
API_KEY_VARIABLE = "BCG_API_KEY"
#: An API key: visible ASCII, no spaces (it travels as ``Authorization: Bearer <key>``).
API_KEY_PATTERN = re.compile(r"[!-~]+")


def prog() -> str:
    """The command's name in usage and error lines: ``bcg-serve`` when run as that, else ``serve.py``."""
    return command_name("serve.py", "bcg-serve")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog(),
        description="Serve one diffusers DiT pipeline with the OpenAI images API (POST /v1/images/generations), "
        "eagerly or with breakable CUDA graphs. GET /stats and GET /health. See docs/serving.md.",
    )
    add_model_options(p, DEFAULT_MODEL, which="; image families only")
    g = p.add_argument_group("speed")
    g.add_argument("--bcg", action="store_true", help="replay each denoising step as breakable CUDA graphs")
    g.add_argument("--compile", action="store_true",
                   help="regional torch.compile of the transformer's repeated blocks (as generate.py --compile; "
                   "combines with --bcg)")
    g.add_argument("--warmup", default=None, metavar="WxH[,WxH...]",
                   help="sizes to run once before listening, e.g. 512x512,1024x1024 (bcg_diffusion.warmup where it "
                   "exists, else one 2-step call per size)")
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
    g = p.add_argument_group("batching (docs/serving.md#batching)")
    g.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH, metavar="ROWS",
                   help="run requests that can share a pipeline call (same size, steps, guidance, adapter, ...) as one "
                   "call of exactly ROWS images (filler rows pad it, so an image never depends on its batch); "
                   f"1: no batching, one call per request (default: {DEFAULT_MAX_BATCH})")
    g.add_argument("--batch-window-ms", type=float, default=DEFAULT_WINDOW_MS, metavar="MS",
                   help="the longest a request waits for others to join its batch; a batch runs earlier once full or "
                   f"once every client of the previous call is back (default: {DEFAULT_WINDOW_MS:g})")
    g.add_argument("--batch-work-limit", type=int, default=DEFAULT_WORK_LIMIT, metavar="N",
                   help="sizes whose latent tokens x hidden size x CFG rows is above N are compute-bound and run "
                   f"unbatched (default: {DEFAULT_WORK_LIMIT}; 0: batch every size)")
    if MISSING_SERVE_EXTRA is None:
        add_lora_options(p)
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
    add_replica_arguments(p)
    g = p.add_argument_group("testing")
    g.add_argument("--inject", action="append", default=[], metavar="KIND:PROMPT",
                   help="testing only: a request with exactly PROMPT fails inside the pipeline after its first step "
                   "(KIND error: a 500; oom: a torch.OutOfMemoryError, a 503) or sleeps there 2 s (slow); repeatable")
    return p


def parse_size_option(text: str, name: str, parser: argparse.ArgumentParser) -> tuple[int, int]:
    try:
        return parse_size(text, param=name)
    except RequestError as exc:
        parser.error(exc.message)


def api_key(args, parser: argparse.ArgumentParser) -> str | None:
    """The API key: ``--api-key``, else :data:`API_KEY_VARIABLE` (empty means none); ``parser.error`` for a key
    that cannot travel in a header."""
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_VARIABLE) or None
    if key is not None and not API_KEY_PATTERN.fullmatch(key):
        source = "--api-key" if args.api_key is not None else API_KEY_VARIABLE
        parser.error(f"{source}: an API key is visible ASCII characters without spaces (it is sent as "
                     "'Authorization: Bearer <key>')")
    return key


def check_arguments(args, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """``parser.error`` (exit 2) for bad options; returns the parsed sizes, injections and the API key."""
    for name in ("max_pixels", "max_steps", "max_n", "max_queue", "steps", "max_batch"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1 (got {value})")
    if args.steps is not None and args.steps > args.max_steps:
        parser.error(f"--steps {args.steps} is above --max-steps {args.max_steps}: a request without "
                     "num_inference_steps would be refused; lower --steps or raise --max-steps")
    if args.batch_window_ms < 0 or args.batch_work_limit < 0:
        parser.error("--batch-window-ms and --batch-work-limit must be >= 0")
    if args.served_model_name is not None and not 0 < len(args.served_model_name) <= 256:
        parser.error("--served-model-name must have 1 .. 256 characters")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be in 0 .. 65535 (got {args.port})")
    warmup = ([parse_size_option(s.strip(), "--warmup", parser) for s in args.warmup.split(",")]
              if args.warmup else [])
    default_size = (parse_size_option(args.default_size.strip(), "--default-size", parser)
                    if args.default_size else None)
    injections = {}
    for text in args.inject:
        try:
            kind, prompt = parse_injection(text)
        except ValueError as exc:
            parser.error(str(exc))
        injections[prompt] = kind
    return {"warmup": warmup, "default_size": default_size, "injections": injections, "api_key": api_key(args, parser),
            "adapters": lora_specs(args, parser)}


def is_loopback(host: str) -> bool:
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host).is_loopback
    return host == "localhost"


def check_image_family(spec, parser: argparse.ArgumentParser) -> None:
    if spec is not None and spec.is_video:
        images = [n for n in pipelines.list_families() if not pipelines.get_family(n).is_video]
        parser.error(f"--model {spec.name} makes videos; serve.py serves images (the OpenAI images API): "
                     f"choose one of {', '.join(images)}")


def precheck_family(spec, args, parser: argparse.ArgumentParser) -> None:
    """``parser.error`` for what a family cannot do, before anything is built: a default step count above
    ``--max-steps``, ``--no-resolution-binning`` on a pipeline that does not bin (as ``generate.py``); a
    checkpoint's are checked once it is loaded."""
    if spec is None:
        return
    if args.steps is None and spec.default_steps > args.max_steps:
        parser.error(f"{spec.name}'s default of {spec.default_steps} steps is above --max-steps {args.max_steps}: a "
                     "request without num_inference_steps would be refused; give --steps or raise --max-steps")
    if args.no_resolution_binning:
        check_binning_flag(spec, parser)


def precheck_sizes(spec, sizes: list[tuple[int, int]], args, parser: argparse.ArgumentParser) -> None:
    """``parser.error`` for a --warmup or --default-size the family cannot make, before anything is built
    (a checkpoint's sizes are checked once it is loaded)."""
    for width, height in sizes:
        if spec is not None and (width % spec.spatial_multiple or height % spec.spatial_multiple):
            parser.error(f"size {width}x{height}: width and height must be positive multiples of "
                         f"{spec.spatial_multiple} for {spec.name} (VAE scale factor x patch size)")
        if width * height > args.max_pixels:
            parser.error(f"size {width}x{height} has {width * height} pixels, above --max-pixels {args.max_pixels}")


def build(args, spec, device: torch.device, dtype: torch.dtype):
    """The pipeline (random weights of a family, or a checkpoint), and its family (``None`` if unknown)."""
    try:
        if spec is not None:
            return pipelines.build_pipeline(spec.name, size=args.size, device=device, dtype=dtype, seed=0), spec
        pipe = pipelines.load_pipeline(args.model, device=device, dtype=dtype)
    except Exception as exc:  # noqa: BLE001 - a failed build is reported, not a traceback
        hint = offline_hint(args.model, exc) if spec is None else None
        raise Failure(1, f"error: {hint}" if hint else f"error: could not build {args.model}: {type(exc).__name__}: "
                      f"{exc}") from exc
    pipe.set_progress_bar_config(disable=True)
    try:
        spec = pipelines.family_of(pipe)
    except ValueError:
        spec = None
    if spec is not None and spec.is_video:
        raise Failure(2, f"{prog()}: error: {args.model} is a {spec.name} pipeline, which makes videos; serve.py "
                      "serves images")
    if args.no_resolution_binning and "use_resolution_binning" not in pipelines.call_parameters(pipe):
        raise Failure(2, f"{prog()}: error: --no-resolution-binning: {type(pipe).__name__} does not bin resolutions "
                      "(its __call__ takes no use_resolution_binning), so it already runs the asked size; leave the "
                      "flag out")
    return pipe, spec


def speed_up(pipe, args, device: torch.device) -> list[str]:
    """``--compile`` then ``--bcg`` (BCG captures the compiled kernels); the notes to print."""
    notes = []
    if args.compile:
        try:
            notes.append(regional_compile(pipe.transformer))
        except Exception as exc:  # noqa: BLE001
            raise Failure(1, f"error: --compile: {type(exc).__name__}: {exc}") from exc
    if args.bcg:
        try:
            with contextlib.nullcontext() if device.type == "cuda" else quiet_library_warnings():
                bcg_diffusion.accelerate_pipeline(pipe)
        except Exception as exc:  # noqa: BLE001 - e.g. AccelerationError
            raise Failure(1, f"error: BCG could not be applied: {type(exc).__name__}: {exc}") from exc
        notes.append("BCG on" if device.type == "cuda" else
                     "note: BCG needs a CUDA GPU and none is in use here, so every call runs eagerly")
    return notes


def default_steps(pipe, spec, args) -> int:
    if args.steps is not None:
        return args.steps
    if spec is not None:
        return spec.default_steps
    param = pipelines.call_parameters(pipe).get("num_inference_steps")
    value = getattr(param, "default", None)
    return value if isinstance(value, int) and value > 0 else CHECKPOINT_DEFAULT_STEPS


def model_size(args) -> str:
    """The model size whose defaults apply: ``--size`` for random weights; ``full`` for a checkpoint (the published
    model)."""
    return args.size if args.model in pipelines.list_families() else "full"


def served_model_name(args) -> str:
    """The base model's id: ``--served-model-name``, else ``--model`` as given."""
    return args.served_model_name or args.model


def make_planner(pipe, spec, args, default_size) -> RequestPlanner:
    g = pixel_granularity(pipe, spec.spatial_multiple if spec is not None else None)
    limits = RequestLimits(granularity=g, max_pixels=args.max_pixels, max_steps=args.max_steps, max_n=args.max_n)
    size = model_size(args)
    if default_size is None:
        default_size = ((spec.size(size).width, spec.size(size).height) if spec is not None
                        else CHECKPOINT_DEFAULT_SIZE)
    planner = RequestPlanner(pipe, spec, size, limits,
                             default_width=default_size[0], default_height=default_size[1],
                             default_steps=default_steps(pipe, spec, args),
                             resolution_binning=not args.no_resolution_binning,
                             model_id=served_model_name(args))
    try:
        planner.default_job(*default_size)
    except RequestError as exc:
        raise Failure(2, f"{prog()}: error: the default request is invalid: {exc.message}") from exc
    return planner


def batching_setup(pipe, planner: RequestPlanner, args, sizes: list[tuple[int, int]]) -> BatchShapes | None:
    """The batch shapes of ``--max-batch`` > 1 (``None`` for 1), with the lines that say, per warmed size (or the
    default size), whether its calls are batched; ``n`` is capped at ``--max-batch`` (a request must fit a batch)."""
    if args.max_batch <= 1:
        return None
    if not planner.takes_batch:
        print(f"  batching: off: {type(pipe).__name__} makes one image per call (no images-per-prompt argument)",
              flush=True)
        return None
    policy = BatchPolicy(args.max_batch, args.batch_window_ms / 1000.0, args.batch_work_limit)
    shapes = BatchShapes(pipe, policy, planner.limits.granularity)
    if planner.limits.max_n > args.max_batch:
        print(f"  batching: n is capped at --max-batch {args.max_batch} (was --max-n {planner.limits.max_n})", flush=True)
        planner.limits = dataclasses.replace(planner.limits, max_n=args.max_batch)
    print(f"  batching: up to {args.max_batch} images per call, window {args.batch_window_ms:g} ms; every batched "
          f"call runs {args.max_batch} rows (a lone request pays for a full batch)", flush=True)
    for width, height in sizes or [(planner.default_width, planner.default_height)]:
        print(f"    {shapes.describe(width, height, planner.default_job(width, height).call)}", flush=True)
    return shapes


def warm_up(worker: PipelineWorker, generator: ImageGenerator, planner: RequestPlanner,
            sizes: list[tuple[int, int]], shapes: BatchShapes | None = None) -> dict[str, Any]:
    """Run the warm-up on the worker thread; print its report; its summary for ``/stats``."""
    if not sizes:
        return {"sizes": [], "total_s": 0.0, "captures": 0, "method": None}
    method = "bcg_diffusion.warmup" if hasattr(bcg_diffusion, "warmup") else "server (2-step calls)"
    print(f"warming up {', '.join(f'{w}x{h}' for w, h in sizes)} (WxH; {method}) ...", flush=True)
    try:
        report = worker.submit(lambda: run_warmup(generator, planner, sizes, shapes)).result()
    except RequestError as exc:
        raise Failure(2, f"{prog()}: error: --warmup: {exc.message}") from exc
    except Exception as exc:  # noqa: BLE001
        raise Failure(1, f"error: warm-up failed: {type(exc).__name__}: {exc}") from exc
    print(str(report), flush=True)
    return {"sizes": [f"{w}x{h}" for w, h in sizes], "total_s": round(float(report.total_s), 3),
            "captures": int(report.captures), "method": method}


def server_info(args, spec, pipe, device, dtype, planner: RequestPlanner, warmup: dict,
                api_key_required: bool = False) -> dict[str, Any]:
    return {
        "model": args.model, "model_ids": planner.model_ids(), "family": spec.name if spec is not None else None,
        "size": args.size if args.model in pipelines.list_families() else "checkpoint",
        "pipeline": type(pipe).__name__, "device": str(device), "dtype": pipelines.dtype_name(dtype),
        "bcg": bool(args.bcg) and device.type == "cuda", "bcg_requested": bool(args.bcg), "compile": bool(args.compile),
        "granularity": planner.limits.granularity, "max_pixels": planner.limits.max_pixels,
        "max_steps": planner.limits.max_steps, "max_n": planner.limits.max_n if planner.takes_batch else 1,
        "max_queue": args.max_queue, "default_size": f"{planner.default_width}x{planner.default_height}",
        "default_steps": planner.default_steps, "max_batch": args.max_batch,
        "resolution_binning": (not args.no_resolution_binning) if planner.takes_binning else None,
        "warmup": warmup, "api_key_required": api_key_required, "torch": torch.__version__,
        "bcg_diffusion": bcg_diffusion.__version__,
    }


def reserve_port(host: str, port: int) -> socket.socket:
    """Bind (not listen) now, so a port in use fails before the build; connections are refused until listening."""
    try:
        return bind_socket(host, port, listen=False)
    except OSError as exc:
        raise Failure(2, f"{prog()}: error: cannot bind {host}:{port}: {exc}") from exc


def announce(url: str) -> None:
    print(f"{LISTENING_PREFIX}{url}", flush=True)


def start(args, parser) -> int:
    options = check_arguments(args, parser)
    if not is_loopback(args.host) and options["api_key"] is None:
        print(f"warning: --host {args.host}: the server is reachable from other machines and requires no API key; "
              f"give it one with --api-key or {API_KEY_VARIABLE}", file=sys.stderr)
    device = choose_device(args, parser)
    dtype = pipelines.resolve_dtype(args.dtype, device)
    spec = family_or_checkpoint(args.model, parser)
    check_image_family(spec, parser)
    precheck_family(spec, args, parser)
    precheck_sizes(spec, options["warmup"] + ([options["default_size"]] if options["default_size"] else []), args,
                   parser)
    if spec is not None and args.size == "full" and device.type != "cuda" and not args.yes:
        parser.error(f"--size full without CUDA builds the published {spec.title} on the CPU (tens of GiB, minutes "
                     "per step); pass --yes to build it anyway")
    sock = reserve_port(args.host, args.port)
    try:
        print(f"building {args.model} ({args.size if spec is not None else 'weights'}) on {device} in "
              f"{pipelines.dtype_name(dtype)} ...", flush=True)
        t0 = time.perf_counter()
        pipe, spec = build(args, spec, device, dtype)
        adapters = attach_adapters(pipe, options["adapters"], args, served_model_name(args), prog())  # before BCG
        notes = speed_up(pipe, args, device)
        planner = make_planner(pipe, spec, args, options["default_size"])
        if adapters is not None:
            planner.adapter_ids = tuple(adapters.names)
            notes.append(f"LoRA adapters: {', '.join(adapters.names)} (hot-swap rank {adapters.target_rank}, "
                         f"{adapters.gpu_slots} kept on the device)")
        print(f"built in {time.perf_counter() - t0:.1f} s; sizes in multiples of {planner.limits.granularity} px, "
              f"default {planner.default_width}x{planner.default_height} (WxH), {planner.default_steps} steps", flush=True)
        for note in notes:
            print(f"  {note}", flush=True)
        if planner.takes_binning and not args.no_resolution_binning:
            print(f"  note: {type(pipe).__name__} snaps sizes to its aspect-ratio bins and resizes the result "
                  "(--no-resolution-binning turns that off)", flush=True)
        shapes = batching_setup(pipe, planner, args, options["warmup"])
        counters = ServerCounters()
        worker = PipelineWorker()
        generator = ImageGenerator(pipe, device, counters, options["injections"])
        warmup = warm_up(worker, generator, planner, options["warmup"], shapes)
        warm_adapters(adapters, worker, generator, lambda: warm_up(worker, generator, planner, options["warmup"], shapes))
        info = server_info(args, spec, pipe, device, dtype, planner, warmup, options["api_key"] is not None)
        batcher = (RequestBatcher(worker, generator.generate_batch, shapes, BatchStats(shapes.policy))
                   if shapes is not None else None)
        app = create_app(ServerState(planner, worker, generator, counters, info, args.max_queue,
                                     api_key=options["api_key"], batcher=batcher))
        serve(app, sock, announce)
        if batcher is not None:
            batcher.stop()
        worker.stop()
    finally:
        sock.close()
    return 0


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
