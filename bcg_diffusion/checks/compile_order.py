"""Does it matter where torch.compile first compiles: in an eager call, or inside BCG's first accelerated call?

Why: with ``--compile``, two eager servers give the same images, an eager and a BCG server do not (0 of 4 at
Flux.1-dev 1024 px), while in one process the same stacks are bitwise equal with and without graphs (the stack
benchmark, which compiles in an eager call first): docs/serving.md, "The speed stack". An eager server compiles in
its warm-up's eager call, a BCG server inside its accelerated transformer's first call. This check runs each
``--orders`` in a child process of its own (its own compile state; one compile cache on the machine, as two servers
share it, so a later child loads what the first compiled: ``--fresh-caches`` gives each child empty caches of its own),
the speed stack's compile layer (regional compile, the library's attention op) on one pipeline, and
saves the latents of its calls (``--images``: also their decoded images, what the servers return, and every
step's latents, so that two calls that part are found at the step where they part):

- ``eager_first``: an eager call (E), then ``accelerate_pipeline`` and two calls (B, B2);
- ``bcg_first``: ``accelerate_pipeline``, two calls (B, B2), ``remove_acceleration``, an eager call (E);
- ``warm_first``: as a BCG server starts: ``accelerate_pipeline``, ``bcg_diffusion.warmup`` of the size (2 steps),
  then B, B2, ``remove_acceleration``, E;
- ``eager_warm_first``: the warm-up without acceleration, E, then accelerated B, B2 (a BCG server that compiled in
  an eager warm-up first);
- ``eager_only``: as an eager server: the warm-up and two calls (E, E2), never accelerated.

An order given twice in ``--orders`` runs twice (``ORDER#2``, a control: the same steps in another process). Each
child's output goes to ``child_LABEL.log`` in ``--out``, and its report says how many graphs it compiled and how many
it loaded from torch.compile's on-disk caches (``compile_caches``).

Every call and warm-up runs under ``torch.inference_mode()``, as the servers' (``--no-inference-mode``: under
``torch.no_grad()``, as the stack benchmark's and this check's first run, 2026-12-07 15:33, which found the four orders
bitwise equal at Flux.1-dev 1024 px, 4 steps). Then every saved output of every order is compared bitwise with every
other; ``compile_order.json`` and ``.md`` in ``--out``. ``--no-compile`` leaves the compile layer out (the CPU test's plumbing).

    python -m bcg_diffusion.checks.compile_order --family flux --size full --height 1024 --width 1024 --steps 4 --out DIR
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bcg_diffusion.toolkit.numbers import finite_float

ORDERS = ("eager_first", "bcg_first", "warm_first", "eager_warm_first", "eager_only")
ENV_SHOWN = ("TORCHINDUCTOR_DETERMINISTIC", "CUBLAS_WORKSPACE_CONFIG")  # settings that choose kernels, in the report


def _call(pipe: Any, args: argparse.Namespace, info: dict[str, Any], tag: str) -> dict[str, Any]:
    """One call; its outputs by name: ``tag`` the final latents, and with ``--images`` also ``tag.image``, the decoded
    image, and ``tag.steps``, the latents after every step (taken at each step's callback, so all come from the same
    call; :func:`compare` names the first step at which two calls part)."""
    import torch

    from bcg_diffusion.toolkit.stack import compiled_graphs

    steps: list[Any] = []

    def keep_latents(_pipe, _step, _timestep, callback_kwargs):  # a copy on the device: no host sync per step
        steps.append(callback_kwargs["latents"].detach().clone())
        return callback_kwargs

    extra = {"output_type": "pt", "callback_on_step_end": keep_latents} if args.images else {"output_type": "latent"}
    started = time.perf_counter()
    with grad_mode(args):
        out = pipe(prompt="a red fox in the snow", height=args.height, width=args.width,
                   num_inference_steps=args.steps, **extra,
                   generator=torch.Generator(pipe.device.type).manual_seed(args.seed))
    if pipe.device.type == "cuda":
        torch.cuda.synchronize()
    info[tag] = {"s": round(time.perf_counter() - started, 3), "compiled_graphs": compiled_graphs()}
    if args.images:
        every = torch.stack(steps).cpu()
        return {tag: every[-1], f"{tag}.image": out[0].detach().cpu().clone(), f"{tag}.steps": every}
    return {tag: out[0].detach().cpu().clone()}


def grad_mode(args: argparse.Namespace):
    """The grad mode of every call: ``torch.inference_mode()`` as the servers' (``--inference-mode``), else
    ``torch.no_grad()`` (as the stack benchmark's)."""
    import torch

    return torch.inference_mode() if args.inference_mode else torch.no_grad()


def run_order(args: argparse.Namespace) -> dict[str, Any]:
    """In this process: build, compile, run ``args.child``'s order; the latents by call and what happened. With
    ``--in-thread`` the warm-up and the calls run on one other thread, as a server's worker runs them, while the build,
    compile and ``accelerate_pipeline`` stay on the main thread, as a server's start-up does them."""
    import bcg_pipelines as pipelines
    from bcg_diffusion.toolkit.stack import compile_layer

    pipe = pipelines.build_pipeline(args.family, size=args.size, device=args.device, seed=0)
    pipe.set_progress_bar_config(disable=True)
    run = OrderRun(pipe, args, {"order": args.child, "in_thread": args.in_thread})
    if args.compile:
        run.info["compile"], _ = compile_layer(pipe.transformer)
    try:
        run.play(args.child)
    finally:
        run.close()
    run.info["compile_caches"] = cache_counters()
    return {"info": run.info, "outputs": run.outputs}


def cache_counters() -> dict[str, int]:
    """torch.compile's on-disk cache counters of this process (Inductor's FX graph cache and AOTAutograd's: hits,
    misses, ...): whether an order compiled its graphs or loaded what an earlier child compiled."""
    from torch._dynamo.utils import counters

    return {f"{group}.{name}": count for group in ("inductor", "aot_autograd") for name, count in counters[group].items()
            if "cache" in name}


def labels(orders: list[str]) -> list[str]:
    """A name per child: the order, and ``ORDER#k`` for its k-th repeat (an order run twice is a control: same
    steps, a second process)."""
    seen: dict[str, int] = {}
    named = []
    for order in orders:
        seen[order] = seen.get(order, 0) + 1
        named.append(order if seen[order] == 1 else f"{order}#{seen[order]}")
    return named


class OrderRun:
    """One order's pipeline, what it records (``info``, ``outputs``) and the thread its calls run on."""

    def __init__(self, pipe: Any, args: argparse.Namespace, info: dict[str, Any]):
        import concurrent.futures

        self.pipe, self.args, self.info = pipe, args, info
        self.outputs: dict[str, Any] = {}
        self.worker = (concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="worker") if args.in_thread
                       else None)

    def play(self, order: str) -> None:
        """The order's steps (see the module's docstring)."""
        import bcg_diffusion

        if order == "eager_only":  # an eager server: its warm-up, then its calls
            self.warm()
            self.call("E")
            self.call("E2")
            return
        if order in ("eager_first", "eager_warm_first"):
            if order == "eager_warm_first":
                self.warm()
            self.call("E")
            self.accelerated()
            return
        if order == "warm_first":  # the server keeps what its warm-up captured
            bcg_diffusion.accelerate_pipeline(self.pipe)
            self.warm()
        self.accelerated(already=order == "warm_first")
        bcg_diffusion.remove_acceleration(self.pipe)
        self.call("E")

    def on_worker(self, fn):
        return fn() if self.worker is None else self.worker.submit(fn).result()

    def call(self, tag: str) -> None:
        self.outputs.update(self.on_worker(lambda: _call(self.pipe, self.args, self.info, tag)))

    def warm(self) -> None:
        import bcg_diffusion

        def run():
            with grad_mode(self.args):
                return bcg_diffusion.warmup(self.pipe, [dict(height=self.args.height, width=self.args.width)],
                                            num_inference_steps=2)
        self.info["warmup"] = str(self.on_worker(run))[:300]

    def accelerated(self, already: bool = False) -> None:
        import bcg_diffusion

        if not already:
            bcg_diffusion.accelerate_pipeline(self.pipe)
        self.call("B")
        self.call("B2")
        stats = bcg_diffusion.get_stats(self.pipe)
        self.info["bcg"] = None if stats is None else {n: getattr(stats, n) for n in ("hits", "captures", "eager_calls")}

    def close(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()


def output_kind(name: str) -> str:
    """``image``, ``steps`` (every step's latents) or ``latents``, from an output's name."""
    suffix = name.rsplit(".", 1)[-1]
    return suffix if suffix in ("image", "steps") else "latents"


def compare(saved: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every output against every other of its kind (:func:`output_kind`), across and within orders: which are
    bitwise equal, the largest absolute difference of those that are not, and for every step's latents the first step
    (0-based) at which they differ."""
    import torch

    named = [(f"{order}.{tag}", t) for order, result in saved.items() for tag, t in result["outputs"].items()]
    pairs = [(a, x, b, y) for (a, x), (b, y) in itertools.combinations(named, 2) if output_kind(a) == output_kind(b)]

    def pair(a: str, x, b: str, y) -> dict[str, Any]:
        if torch.equal(x, y):
            return {"a": a, "b": b, "equal": True}
        found = {"a": a, "b": b, "equal": False, "max_abs": float((x.float() - y.float()).abs().max())}
        if output_kind(a) == "steps" and x.shape == y.shape:
            found["first_step"] = next(i for i in range(len(x)) if not torch.equal(x[i], y[i]))
        return found

    return [pair(*p) for p in pairs]


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# Compile order: {report['family']} {report['size']} {report['height']}x{report['width']}, "
             f"{report['steps']} steps, compile {'on' if report['compile'] else 'off'}, "
             f"{'inference mode' if report.get('inference_mode') else 'no_grad'}"
             f"{', latents and images' if report.get('images') else ''}"
             f"{', each order compiling by itself (fresh caches)' if report.get('fresh_caches') else ''}"
             f"{', calls on a worker thread' if report.get('in_thread') else ''}", "",
             f"{report['date']}, commit `{report['commit']}`, environment {report.get('env') or 'as is'}.", "", "| a | b | bitwise equal |", "|---|---|---|"]
    lines += [f"| {c['a']} | {c['b']} | {_verdict(c)} |" for c in report["comparisons"]]
    lines += ["", "## Per order", ""] + [f"- {o}: {json.dumps(i, default=str)}" for o, i in report["orders"].items()]
    return "\n".join(lines) + "\n"


def _verdict(pair: dict[str, Any]) -> str:
    if pair["equal"]:
        return "yes"
    first = f", first at step {pair['first_step']}" if "first_step" in pair else ""
    return f"NO (max abs {pair['max_abs']:.3g}{first})"


def child_environment(order: str, args: argparse.Namespace) -> dict[str, str] | None:
    """The environment of the child named ``order`` (an order, or ``ORDER#k``): this process's (``None``), or with
    ``--fresh-caches`` one in which Inductor's and Triton's on-disk caches are empty folders of its own under
    ``--out``, so the child compiles by itself instead of loading what an earlier child compiled."""
    if not args.fresh_caches:
        return None
    caches = args.out / f"caches_{order}"
    return {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"), "TRITON_CACHE_DIR": str(caches / "triton")}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bcg_diffusion.checks.compile_order",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="flux", help="a bcg_pipelines family (default flux)")
    parser.add_argument("--size", default="full", choices=("tiny", "full"), help="default full")
    parser.add_argument("--height", type=int, default=1024)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=4, help="denoising steps of each call (default 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--orders", default=",".join(ORDERS),
                        help=f"comma-separated, of {', '.join(ORDERS)}; an order given twice runs twice (ORDER#2: a "
                             "control, the same steps in a second process)")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                        help="the speed stack's compile layer (default on)")
    parser.add_argument("--inference-mode", action=argparse.BooleanOptionalAction, default=True,
                        help="calls and warm-up under torch.inference_mode(), as the servers' (default); "
                             "--no-inference-mode: under torch.no_grad(), as the stack benchmark's")
    parser.add_argument("--images", action=argparse.BooleanOptionalAction, default=False,
                        help="also decode each call's image (output_type='pt'), as the servers do, and keep every "
                             "step's latents: images compared beside latents, and where two calls differ the first "
                             "step that differs (default off: final latents only)")
    parser.add_argument("--in-thread", action=argparse.BooleanOptionalAction, default=False,
                        help="the warm-up and the calls on one worker thread, as a server runs them (default off: "
                             "on the main thread)")
    parser.add_argument("--fresh-caches", action=argparse.BooleanOptionalAction, default=False,
                        help="each order's child compiles by itself, with empty Inductor and Triton caches of its own "
                             "(default off: the children share the machine's caches, so later ones load what the "
                             "first compiled, as two servers on one machine may)")
    parser.add_argument("--timeout", type=finite_float, default=300.0, help="seconds per order's child (default 300)")
    parser.add_argument("--out", type=Path, default=Path("outputs"))
    parser.add_argument("--child", choices=ORDERS, help=argparse.SUPPRESS)  # run one order, save to --out
    parser.add_argument("--label", help=argparse.SUPPRESS)  # the child's name (its file): the order, or ORDER#k
    args = parser.parse_args(argv)
    orders = [o for o in args.orders.split(",") if o]
    unknown = [o for o in orders if o not in ORDERS]
    if unknown or not orders:
        parser.error(f"--orders: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(ORDERS)}")
    args.order_list = orders
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child:
        import torch

        torch.save(run_order(args), args.out / f"order_{args.label or args.child}.pt")
        return 0
    import torch

    from .planting import current_commit

    forwarded = ["--family", args.family, "--size", args.size, "--height", str(args.height), "--width",
                 str(args.width), "--steps", str(args.steps), "--seed", str(args.seed), "--out", str(args.out),
                 "--compile" if args.compile else "--no-compile",
                 "--inference-mode" if args.inference_mode else "--no-inference-mode",
                 "--images" if args.images else "--no-images", "--in-thread" if args.in_thread else "--no-in-thread",
                 *(["--device", args.device] if args.device else [])]
    saved, failures = {}, {}
    for order, label in zip(args.order_list, labels(args.order_list)):
        command = [sys.executable, "-m", "bcg_diffusion.checks.compile_order", *forwarded, "--child", order,
                   "--label", label]
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, check=False,
                              env=child_environment(label, args))
        (args.out / f"child_{label}.log").write_text(f"{done.stdout or ''}{done.stderr or ''}")
        if done.returncode != 0:
            failures[label] = (done.stderr or "")[-2000:]
            continue
        saved[label] = torch.load(args.out / f"order_{label}.pt")
    report = {"family": args.family, "size": args.size, "height": args.height, "width": args.width,
              "steps": args.steps, "compile": args.compile, "inference_mode": args.inference_mode,
              "images": args.images, "fresh_caches": args.fresh_caches,
              "in_thread": args.in_thread, "env": {k: os.environ[k] for k in ENV_SHOWN if k in os.environ},
              "commit": current_commit(),
              "date": time.strftime("%Y-%m-%d %H:%M"), "orders": {o: r["info"] for o, r in saved.items()},
              "failures": failures, "comparisons": compare(saved)}
    (args.out / "compile_order.json").write_text(json.dumps(report, indent=1, default=str))
    (args.out / "compile_order.md").write_text(markdown(report))
    unequal = [c for c in report["comparisons"] if not c["equal"]]
    print(f"{len(saved)} orders ran ({len(failures)} failed); {len(unequal)} of {len(report['comparisons'])} pairs "
          f"differ; wrote {args.out / 'compile_order.json'} and .md")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
