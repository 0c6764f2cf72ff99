"""One rank of the context-parallel checks: BCG under diffusers' context parallelism vs eager CP.

Launched through torchrun by ``tests/library/test_context_parallel_one_gpu.py`` (two ranks on one
GPU, gloo: ``--one-gpu``), ``tests/library/test_context_parallel_gpu.py`` (one GPU per rank, NCCL),
``tests/integrations/test_parallel_cpu.py`` (gloo on the CPU) or by hand, with NVLink multicast off::

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        python -m torch.distributed.run --standalone --nproc_per_node 2 tests/cp_worker.py \\
        --one-gpu --report-dir /tmp/cp

Every rank builds the same models (same seed). A case is ``family:mode[:variant]``:

- no variant: two tiny transformers per rank, one eager CP (the reference), one the same under
  ``bcg_diffusion.accelerate_transformer``; both get the same calls (shape changes, a LoRA load
  after capture). ``bcg_first``: accelerated before ``enable_parallelism``.
- ``pipe``: two tiny pipelines (``pipelines.build_pipeline``) under ``accelerate_pipeline``: whole
  generations (two transformer calls per step), a shape change, a LoRA load, TaylorSeer.
- ``refusals``: what must be refused under CP (FirstBlockCache, MagCache, ``compile=True``,
  ``ulysses_anything``), and whether it is.
- ``disagree``: the ranks get different inputs once: every rank must raise ``RankDisagreementError``
  before any collective, and the next equal call must work.
- ``fault``: rank ``--fault-rank`` raises inside its collectives in call ``--fault-call``; what
  each rank raised, in which call, and how long it took. It ends the job (run it alone, last).

``--size full`` (transformer cases only) builds full-size transformers once per rank: the reference
outputs are computed eagerly first, then the same model is accelerated (no LoRA).

``--torch-cases`` runs cases first, over torch's own functional collectives and without
``--pretend-cuda`` (the harness and the pretence are installed after them): one launch checks both
paths (``tests/integrations/test_parallel_cpu.py``); they are reported as ``torch/<case>``.

Each rank writes ``rank<N>.json`` into ``--report-dir``: per case, the calls whose outputs were not
bitwise equal, BCG's stats and lockstep counters, and a digest of the reference outputs. Importing
this module has no side effects (CPU tests import it).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import random
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cp_harness

MULTICAST_OFF = cp_harness.MULTICAST_OFF
FAMILIES = ("flux", "wan")
MODES = ("ulysses", "ring")
VARIANTS = ("", "bcg_first", "pipe", "refusals", "disagree", "fault")
# Ring attention merges partial results with their log-sum-exp; diffusers' "native" backend returns
# none, so ring runs on torch's flash SDPA (bf16/fp16, no mask: Flux and Wan pass none).
BACKENDS = {"ulysses": "native", "ring": "_native_flash"}
ORDER_CASE = "flux:ulysses:bcg_first"  # accelerate first, then enable context parallelism
MAIN_CASES = tuple(f"{f}:{m}" for f in FAMILIES for m in MODES)
ALL_CASES = MAIN_CASES + (ORDER_CASE,)
PIPE_CASES = ("flux:ulysses:pipe", "wan:ring:pipe")
CHECK_CASES = ("flux:ulysses:refusals", "flux:ulysses:disagree")
FAULT_CASE = "flux:ulysses:fault"
LORA_TARGETS = ["to_q", "to_k", "to_v"]
LORA_AT_CALL = 6  # after a capture, a replay and a shape change
PIPE_STEPS = 4
PROMPT = "a red fox jumping over a frozen river at dawn"

# Input shapes, each divisible by 2 in the split sequence dimension. Flux: (batch, latent rows, latent
# cols, text tokens); its text is split too. Wan: (batch, frames, height, width, text tokens), patch 1x2x2.
SHAPES = {
    "flux": [(1, 4, 4, 8), (1, 4, 6, 8), (2, 4, 4, 8)],
    "wan": [(1, 3, 8, 8, 8), (1, 3, 8, 12, 8), (2, 5, 8, 8, 8)],
}
FULL_SHAPES = {  # Flux 1024x1024 and 1024x768; Wan 480x832 with 33 and 17 frames
    "flux": [(1, 64, 64, 512), (1, 64, 48, 512)],
    "wan": [(1, 9, 60, 104, 512), (1, 5, 60, 104, 512)],
}
PIPE_GENERATIONS = ("base", "shape", "lora", "taylorseer")
PIPE_WIDER = {"flux": 96, "wan": 48}  # the shape change: tiny width 64 -> 96 (Flux), 32 -> 48 (Wan)


def launch_command(report_dir: str | os.PathLike, *worker_args: str, nproc: int = 2) -> list[str]:
    """The torchrun command line for ``nproc`` ranks of this worker (run it with :func:`launch_env`)."""
    return cp_harness.torchrun_command(Path(__file__).resolve(), "--report-dir", str(report_dir), *worker_args, nproc=nproc)


def launch_env(base: dict | None = None) -> dict:
    """``base`` (default: this process's environment) with NVLink multicast off and the repository importable."""
    return cp_harness.launch_env(base)


def call_schedule(family: str, calls: int, size: str = "tiny") -> list[tuple[int, ...]]:
    """The shape of every call: the first shape three times (capture, replays), the second twice
    (a shape change after capture), the first again, then a seeded mix of all of them."""
    shapes = SHAPES[family] if size == "tiny" else FULL_SHAPES[family]
    start = [shapes[0]] * 3 + [shapes[1]] * 2 + [shapes[0]]
    rng = random.Random(0)
    rest = [rng.choice(shapes) for _ in range(max(0, calls - len(start)))]
    return (start + rest)[:calls]


def make_inputs(family: str, shape: tuple[int, ...], seed: int, device: Any, dtype: Any, config: Any = None) -> dict:
    """The transformer's keyword arguments for one call (the same on every rank for one seed);
    widths from ``config`` (the model's config), tiny widths without one."""
    import torch

    g = torch.Generator(device).manual_seed(seed)

    def width(name: str, tiny: int) -> int:
        return int(getattr(config, name)) if config is not None else tiny

    def randn(*size):
        return torch.randn(*size, generator=g, device=device, dtype=torch.float32).to(dtype)

    if family == "flux":
        batch, rows, cols, text = shape
        ids = torch.zeros(rows, cols, 3, device=device)
        ids[..., 1] = torch.arange(rows, device=device)[:, None]
        ids[..., 2] = torch.arange(cols, device=device)[None, :]
        return dict(
            hidden_states=randn(batch, rows * cols, width("in_channels", 64)),
            encoder_hidden_states=randn(batch, text, width("joint_attention_dim", 32)),
            pooled_projections=randn(batch, width("pooled_projection_dim", 32)),
            timestep=torch.rand(batch, generator=g, device=device).to(dtype),
            guidance=torch.full((batch,), 3.5, device=device, dtype=dtype),
            img_ids=ids.reshape(rows * cols, 3),
            txt_ids=torch.zeros(text, 3, device=device),
            return_dict=False,  # diffusers' root split hook refuses a dict output under context parallelism
        )
    batch, frames, height, width_, text = shape
    return dict(
        hidden_states=randn(batch, width("in_channels", 16), frames, height, width_),
        encoder_hidden_states=randn(batch, text, width("text_dim", 32)),
        timestep=torch.randint(0, 1000, (batch,), generator=g, device=device).to(dtype),
        return_dict=False,
    )


def build_transformer(family: str, seed: int, device: Any, dtype: Any, size: str = "tiny"):
    """The family's transformer at ``size`` with random weights drawn from ``seed`` (equal on every
    rank), constructed in ``dtype`` (a full-size model never exists in fp32)."""
    import torch

    import bcg_pipelines as pipelines

    spec = pipelines.get_family(family)
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype if dtype.is_floating_point else old)
    try:
        with torch.device(device):
            model = spec.transformer_class(**spec.size(size).transformer)
    finally:
        torch.set_default_dtype(old)
    for tensor in [*model.parameters(), *model.buffers()]:  # as pipelines.build does: every floating tensor
        if tensor.is_floating_point() and tensor.dtype != dtype:
            tensor.data = tensor.data.to(dtype)
    return model.eval().requires_grad_(False)


_meshes: dict = {}


def _mesh(mode: str, device_type: str):
    """One device mesh per mode, shared by all models (each mesh costs its own communicators)."""
    from torch.distributed.device_mesh import init_device_mesh

    if mode not in _meshes:
        shape = (1, 2) if mode == "ulysses" else (2, 1)
        _meshes[mode] = init_device_mesh(device_type, shape, mesh_dim_names=("ring", "ulysses"))
    return _meshes[mode]


def enable_context_parallel(model, mode: str, backend: str, **extra: Any) -> None:
    from diffusers import ContextParallelConfig

    model.set_attention_backend(backend)
    degree = {"ulysses_degree": 2} if mode == "ulysses" else {"ring_degree": 2}
    device_type = next(model.parameters()).device.type
    model.enable_parallelism(config=ContextParallelConfig(**degree, **extra, mesh=_mesh(mode, device_type)))


def add_lora(model, seed: int) -> None:
    """A random (non-zero) LoRA adapter on the attention projections, equal on every rank."""
    import torch
    from peft import LoraConfig

    torch.manual_seed(seed)
    model.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=LORA_TARGETS, init_lora_weights=False))


def _digest_update(digest: Any, tensor: Any) -> None:
    import torch

    digest.update(str(tuple(tensor.shape)).encode())
    digest.update(tensor.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())


def _stats(model) -> dict:
    import bcg_diffusion as bcg
    from bcg_diffusion import accelerate as acc

    stats = bcg.get_stats(model)
    if not stats.active:
        return {"accelerated": False}
    locksteps = [r.watch.lockstep for r in acc._runners(model) if r.watch.lockstep is not None]
    agreements = [lockstep.agreement for lockstep in locksteps if lockstep.agreement is not None]
    return {
        "accelerated": True,
        "hits": stats.hits,
        "misses": stats.misses,
        "captures": stats.captures,
        "eager_calls": stats.eager_calls,
        "fallbacks": [e.fallback for e in stats.entries if e.fallback],
        "breaks": [e.breaks for e in stats.entries],
        "segments": [e.segments for e in stats.entries],
        "lockstep_calls": sum(lockstep.calls for lockstep in locksteps),
        "agreement_rounds": sum(a.rounds for a in agreements),
        "context_parallel": bool(locksteps),
    }


def _mismatch(record: dict, label: Any, shape: Any, out: Any, reference: Any) -> None:
    import torch

    record["calls"] += 1
    if torch.equal(out, reference):
        return
    record["mismatch_count"] += 1
    if len(record["mismatches"]) < 10:
        diff = (out.float() - reference.float()).abs().max().item() if out.shape == reference.shape else None
        record["mismatches"].append({"call": label, "shape": list(shape), "max_abs_diff": diff,
                                     "out_shape": list(out.shape), "ref_shape": list(reference.shape)})


@dataclass
class Case:
    family: str
    mode: str
    variant: str = ""

    @property
    def bcg_first(self) -> bool:
        return self.variant == "bcg_first"

    @classmethod
    def parse(cls, text: str) -> "Case":
        parts = text.split(":")
        variant = parts[2] if len(parts) == 3 else ""
        if len(parts) not in (2, 3) or parts[0] not in FAMILIES or parts[1] not in MODES or variant not in VARIANTS[1:] + ("",) \
                or (len(parts) == 3 and not variant):
            raise ValueError(
                f"a case is family:mode[:variant] with family in {FAMILIES}, mode in {MODES} and variant in "
                f"{VARIANTS[1:]}, got {text!r}"
            )
        return cls(parts[0], parts[1], variant)


@dataclass
class Run:
    """What every case gets: the device, dtype and options of this launch."""

    device: Any
    dtype: Any
    calls: int
    lora: bool
    size: str
    collectives: Any
    fault_call: int
    fault_rank: int
    rank: int
    config: Any = None  # the BCGConfig of every accelerated model


# -- transformer cases -------------------------------------------------------------------------
def run_case(case: Case, run: Run, seed: int = 0) -> dict:
    """Eager CP and BCG CP side by side on the same calls; what differed and what BCG did."""
    if run.size == "full":
        return run_full_case(case, run, seed)
    import torch

    import bcg_diffusion as bcg

    backend = BACKENDS[case.mode]
    record: dict = {"mismatches": [], "mismatch_count": 0, "calls": 0, "lora": None, "gather_output_type": None}
    start = time.monotonic()
    eager = build_transformer(case.family, seed, run.device, run.dtype)
    enable_context_parallel(eager, case.mode, backend)
    seen_types: list[str] = []
    eager.proj_out.register_forward_hook(lambda m, a, out: seen_types.append(type(out).__name__))
    accelerated = build_transformer(case.family, seed, run.device, run.dtype)
    try:
        if case.bcg_first:
            bcg.accelerate_transformer(accelerated, run.config)
            enable_context_parallel(accelerated, case.mode, backend)
        else:
            enable_context_parallel(accelerated, case.mode, backend)
            bcg.accelerate_transformer(accelerated, run.config)
    except bcg.AccelerationError as exc:  # a clear refusal of this order is an accepted outcome
        record["refused"] = f"{type(exc).__name__}: {exc}"
        return record
    digest = hashlib.sha256()
    for index, shape in enumerate(call_schedule(case.family, run.calls)):
        inputs = make_inputs(case.family, shape, seed=index, device=run.device, dtype=run.dtype)
        if index == LORA_AT_CALL and run.lora:
            with torch.no_grad():
                before = eager(**inputs)[0].clone()
            add_lora(eager, seed + 1)
            add_lora(accelerated, seed + 1)
            with torch.no_grad():
                record["lora_changed_output"] = not torch.equal(before, eager(**inputs)[0])
            record["lora"] = f"added before call {index}"
            record["stats_at_lora"] = _stats(accelerated)
        with torch.no_grad():
            reference = eager(**inputs)[0]
            out = accelerated(**inputs)[0]
        _mismatch(record, index, shape, out, reference)
        _digest_update(digest, reference)
    record["digest"] = digest.hexdigest()
    record["gather_output_type"] = sorted(set(seen_types))
    record["stats"] = _stats(accelerated)
    record["seconds"] = time.monotonic() - start
    bcg.remove_acceleration(accelerated)
    return record


def run_full_case(case: Case, run: Run, seed: int = 0) -> dict:
    """Full size, one model per rank: eager CP outputs first, then the same model under BCG."""
    import torch

    import bcg_diffusion as bcg

    record: dict = {"mismatches": [], "mismatch_count": 0, "calls": 0, "lora": None, "size": "full"}
    start = time.monotonic()
    model = build_transformer(case.family, seed, run.device, run.dtype, size="full")
    enable_context_parallel(model, case.mode, BACKENDS[case.mode])
    schedule = call_schedule(case.family, run.calls, size="full")
    digest = hashlib.sha256()
    references = []
    eager_seconds = time.monotonic()
    for index, shape in enumerate(schedule):
        inputs = make_inputs(case.family, shape, seed=index, device=run.device, dtype=run.dtype, config=model.config)
        with torch.no_grad():
            references.append(model(**inputs)[0].clone())
        _digest_update(digest, references[-1])
    record["eager_seconds"] = time.monotonic() - eager_seconds
    bcg.accelerate_transformer(model, run.config)
    for index, shape in enumerate(schedule):
        inputs = make_inputs(case.family, shape, seed=index, device=run.device, dtype=run.dtype, config=model.config)
        with torch.no_grad():
            out = model(**inputs)[0]
        _mismatch(record, index, shape, out, references[index])
    record["digest"] = digest.hexdigest()
    record["stats"] = _stats(model)
    record["seconds"] = time.monotonic() - start
    bcg.remove_acceleration(model)
    del model, references
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return record


# -- pipeline case -----------------------------------------------------------------------------
def pipe_kwargs(family: str, device: Any, seed: int, **overrides: Any) -> dict:
    """The keyword arguments of one tiny generation (two transformer calls per step)."""
    import torch

    import bcg_pipelines as pipelines

    spec = pipelines.get_family(family)
    kwargs = dict(spec.call_kwargs)
    kwargs.update(prompt=PROMPT, num_inference_steps=PIPE_STEPS, height=spec.tiny.height, width=spec.tiny.width,
                  generator=torch.Generator(device).manual_seed(seed), output_type="latent")
    if spec.tiny.num_frames:
        kwargs["num_frames"] = spec.tiny.num_frames
    if family == "flux":
        kwargs.update(negative_prompt=" ", true_cfg_scale=2.0)  # true CFG: two transformer calls per step
    kwargs.update(overrides)
    return kwargs


def run_pipe_case(case: Case, run: Run, seed: int = 0) -> dict:
    """Two pipelines per rank, eager CP and BCG CP (accelerate_pipeline): whole generations."""
    import torch

    import bcg_diffusion as bcg
    import bcg_pipelines as pipelines
    from bcg_diffusion.toolkit.cache_option import cache_config, enable_cache

    record: dict = {"mismatches": [], "mismatch_count": 0, "calls": 0, "generations": []}
    start = time.monotonic()
    pipes = []
    for _ in range(2):
        pipe = pipelines.build_pipeline(case.family, size="tiny", device=run.device, dtype=run.dtype, seed=seed)
        enable_context_parallel(pipe.transformer, case.mode, BACKENDS[case.mode])
        pipes.append(pipe)
    eager, accelerated = pipes
    bcg.accelerate_pipeline(accelerated, run.config)
    digest = hashlib.sha256()
    for number, label in enumerate(PIPE_GENERATIONS):
        if label == "lora" and not run.lora:
            continue
        if label == "lora":
            for pipe in pipes:
                add_lora(pipe.transformer, seed + 1)
        if label == "taylorseer":
            for pipe in pipes:
                enable_cache(pipe.transformer, cache_config("taylorseer", pipe, case.family, PIPE_STEPS, "two_calls"))
        overrides = {"width": PIPE_WIDER[case.family]} if label == "shape" else {}
        outs = []
        for pipe in pipes:
            with torch.no_grad():
                result = pipe(**pipe_kwargs(case.family, run.device.type, seed + number, **overrides))[0]
            outs.append(result.clone() if isinstance(result, torch.Tensor) else torch.as_tensor(result))
        _mismatch(record, label, list(outs[0].shape), outs[1], outs[0])
        _digest_update(digest, outs[0])
        record["generations"].append(label)
    record["digest"] = digest.hexdigest()
    record["stats"] = _stats(accelerated.transformer)
    record["seconds"] = time.monotonic() - start
    bcg.remove_acceleration(accelerated)
    return record


# -- what must be refused; different inputs; a fault ------------------------------------------
def run_refusals(case: Case, run: Run, seed: int = 0) -> dict:
    """Each set-up that must be refused under CP: the error, or ``None`` where it was accepted."""
    import torch

    import bcg_diffusion as bcg
    from diffusers.hooks import FirstBlockCacheConfig, MagCacheConfig

    backend = BACKENDS[case.mode]
    results: dict = {}

    def attempt(label: str, before: Any = None, config: Any = None, after: Any = None, **cp_extra: Any) -> None:
        model = build_transformer(case.family, seed, run.device, run.dtype)
        enable_context_parallel(model, case.mode, backend, **cp_extra)
        try:
            if before is not None:
                before(model)
            bcg.accelerate_transformer(model, config or run.config)
            if after is not None:
                after(model)
                inputs = make_inputs(case.family, SHAPES[case.family][0], seed=0, device=run.device, dtype=run.dtype)
                with torch.no_grad():
                    model(**inputs)
        except bcg.AccelerationError as exc:
            results[label] = f"{type(exc).__name__}: {exc}"
        else:
            results[label] = None
        finally:
            bcg.remove_acceleration(model)

    def fbc(model: Any) -> None:
        model.enable_cache(FirstBlockCacheConfig(threshold=0.5))

    def magcache(model: Any) -> None:
        model.enable_cache(MagCacheConfig(threshold=0.06, num_inference_steps=4, mag_ratios=[1.0] * 4, retention_ratio=0.0))

    attempt("first_block_cache", before=fbc)
    attempt("mag_cache", before=magcache)
    attempt("first_block_cache_after_accelerating", after=fbc)
    attempt("compile", config=dataclasses.replace(run.config, compile=True))
    if case.mode == "ulysses":
        attempt("ulysses_anything", ulysses_anything=True)
    return {"refusals": results}


def run_disagree(case: Case, run: Run, seed: int = 0) -> dict:
    """Rank 1 gets a longer text once: every rank must raise before any collective; then an equal
    call must work and match eager CP."""
    import torch

    import bcg_diffusion as bcg

    backend = BACKENDS[case.mode]
    eager = build_transformer(case.family, seed, run.device, run.dtype)
    enable_context_parallel(eager, case.mode, backend)
    model = build_transformer(case.family, seed, run.device, run.dtype)
    enable_context_parallel(model, case.mode, backend)
    bcg.accelerate_transformer(model, run.config)
    shape = SHAPES[case.family][0]
    other = (*shape[:-1], shape[-1] + 4) if run.rank == 1 else shape
    record: dict = {}
    before = run.collectives.count if run.collectives is not None else None
    try:
        with torch.no_grad():
            model(**make_inputs(case.family, other, seed=0, device=run.device, dtype=run.dtype))
        record["first"] = None
    except Exception as exc:  # noqa: BLE001 - the test looks at which error
        record["first"] = {"type": type(exc).__name__, "message": str(exc)}
    if before is not None:
        record["collectives_in_first"] = run.collectives.count - before
    inputs = make_inputs(case.family, shape, seed=1, device=run.device, dtype=run.dtype)
    with torch.no_grad():
        out = model(**inputs)[0]
        reference = eager(**inputs)[0]
    record["second_equal"] = bool(torch.equal(out, reference))
    record["stats"] = _stats(model)
    bcg.remove_acceleration(model)
    return record


def run_fault(case: Case, run: Run, seed: int = 0) -> dict:
    """Rank ``fault_rank`` raises in its third collective of call ``fault_call``; what each rank saw."""
    import torch

    import bcg_diffusion as bcg

    if run.collectives is None:
        raise RuntimeError("the fault case needs the harness collectives (--collectives harness or observe)")
    model = build_transformer(case.family, seed, run.device, run.dtype)
    enable_context_parallel(model, case.mode, BACKENDS[case.mode])
    bcg.accelerate_transformer(model, run.config)
    record: dict = {"fault_rank": run.fault_rank, "fault_call": run.fault_call, "raised": None}
    shape = SHAPES[case.family][0]
    fault_started = None
    for index in range(run.fault_call + 3):  # the calls after the fault: a rank that did not stop in it stops there
        inputs = make_inputs(case.family, shape, seed=index, device=run.device, dtype=run.dtype)
        if index == run.fault_call:
            fault_started = time.monotonic()
            if run.rank == run.fault_rank:
                run.collectives.arm_fault(after=3)
        try:
            with torch.no_grad():
                model(**inputs)  # no synchronisation after the fault: a hung collective would block it
        except Exception as exc:  # noqa: BLE001 - the test looks at which error
            record["raised"] = {
                "type": type(exc).__name__,
                "message": str(exc),
                "notes": list(getattr(exc, "__notes__", [])),
                "rank": getattr(exc, "rank", None),
                "where": getattr(exc, "where", None),
                "call": index,
                "seconds_after_fault_call_began": time.monotonic() - fault_started if fault_started else None,
            }
            break
    record["stats"] = {"lockstep_calls": bcg.accelerate._runners(model)[0].watch.lockstep.calls}
    return record


RUNNERS = {"": run_case, "bcg_first": run_case, "pipe": run_pipe_case, "refusals": run_refusals,
           "disagree": run_disagree, "fault": run_fault}


def _check_environment(kind: str) -> None:
    if kind == "cpu":
        return
    wrong = {k: os.environ.get(k) for k, v in MULTICAST_OFF.items() if os.environ.get(k) != v}
    if wrong:
        raise SystemExit(
            f"cp_worker: NVLink multicast must be off for every launch; set {MULTICAST_OFF} (found {wrong})"
        )


def _run_cases(cases: list, run: Run, report: dict, out_dir: Path) -> None:
    """Run ``(name, case)`` pairs in order into ``report["cases"][name]``, writing the report after each
    (a timeout leaves the rest); the fault case ends the process."""
    import torch.distributed as dist

    for case_text, case in cases:
        started = time.monotonic()
        try:
            report["cases"][case_text] = RUNNERS[case.variant](case, run)
        except Exception:  # noqa: BLE001 - recorded; the other rank fails the same way or times out
            report["cases"][case_text] = {"error": traceback.format_exc()}
        report["cases"][case_text].setdefault("seconds", time.monotonic() - started)
        print(f"cp_worker rank {run.rank}: {case_text} done in {time.monotonic() - started:.1f} s", flush=True)
        (out_dir / f"rank{run.rank}.json").write_text(json.dumps(report, indent=1))
        if case.variant == "fault":
            sys.stdout.flush()
            os._exit(0)  # a collective of the fault may still be pending: no barrier, no teardown
        dist.barrier()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report-dir", required=True, help="folder for rank<N>.json")
    parser.add_argument("--cases", default=",".join(ALL_CASES), help=f"comma-separated; default {','.join(ALL_CASES)}")
    parser.add_argument("--calls", type=int, default=100, help="calls per transformer case (default 100)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--one-gpu", action="store_true", help="every rank on cuda:0 under gloo (the one-GPU harness)")
    parser.add_argument("--collectives", choices=("auto", "torch", "harness", "observe"), default="auto",
                        help="torch: diffusers' own functional collectives; harness: the harness's stand-ins; observe: "
                             "torch's, counted and guarded by the harness; auto: harness with --one-gpu, else observe")
    parser.add_argument("--pretend-cuda", action="store_true",
                        help="CPU only: accelerate as if CUDA were there (CPU inputs run eagerly, the lockstep runs)")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--size", choices=("tiny", "full"), default="tiny")
    parser.add_argument("--no-lora", action="store_true", help="skip the LoRA load")
    parser.add_argument("--torch-cases", default="",
                        help="comma-separated cases run first, over torch's own collectives and without --pretend-cuda "
                             "(reported as torch/<case>); no fault case")
    parser.add_argument("--fault-call", type=int, default=4)
    parser.add_argument("--fault-rank", type=int, default=1)
    parser.add_argument("--rank-timeout-s", type=float, default=None, help="BCGConfig.rank_timeout_s (default: its own)")
    parser.add_argument("--collective-timeout-s", type=float, default=60.0,
                        help="a collective that waits longer fails (process group and harness timeouts) instead of hanging")
    args = parser.parse_args(argv)
    cases = [(c, Case.parse(c)) for c in args.cases.split(",") if c]
    torch_cases = [(f"torch/{c}", Case.parse(c)) for c in args.torch_cases.split(",") if c]
    if any(case.variant == "fault" for _, case in cases[:-1] + torch_cases):
        raise SystemExit("cp_worker: the fault case ends the job; put it last in --cases (or alone)")
    kind = "cpu" if args.device == "cpu" else ("one-gpu" if args.one_gpu else "nccl")
    _check_environment(kind)

    import torch
    import torch.distributed as dist

    if args.pretend_cuda and kind != "cpu":
        raise SystemExit("cp_worker: --pretend-cuda is for --device cpu")
    device = cp_harness.init_ranks(kind, args.collective_timeout_s)
    rank, world = dist.get_rank(), dist.get_world_size()
    mode = args.collectives if args.collectives != "auto" else ("harness" if kind == "one-gpu" else "observe")
    collectives = None
    if mode != "torch":
        replace = cp_harness.REPLACED if mode == "harness" else ()
        collectives = cp_harness.Collectives(
            cp_harness.HarnessConfig(collective_timeout_s=args.collective_timeout_s, replace=replace), rank)
        if not torch_cases:
            collectives.install()
    import bcg_diffusion as bcg

    config = bcg.BCGConfig() if args.rank_timeout_s is None else bcg.BCGConfig(rank_timeout_s=args.rank_timeout_s)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    lora = not args.no_lora and args.size == "tiny"
    lora_note = None if lora or args.size == "full" else "--no-lora"
    if lora:
        try:
            import peft  # noqa: F401
        except ImportError:
            lora, lora_note = False, "peft is not installed"
    run = Run(device, dtype, args.calls, lora, args.size, collectives, args.fault_call, args.fault_rank, rank, config)

    import diffusers

    import bcg_pipelines  # noqa: F401 - imported before --pretend-cuda: libraries probe CUDA at import

    report: dict = {"rank": rank, "world_size": world, "torch": torch.__version__, "diffusers": diffusers.__version__,
                    "device": str(device), "kind": kind, "collectives": mode, "lora_skipped": lora_note, "cases": {}}
    out_dir = Path(args.report_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if torch_cases:
        _run_cases(torch_cases, dataclasses.replace(run, collectives=None), report, out_dir)
        if collectives is not None:
            collectives.install()
    if args.pretend_cuda:
        torch.cuda.is_available = lambda: True  # the runner is installed; CPU inputs run eagerly through it
        os.environ.pop("BCG_DIFFUSION", None)
    _run_cases(cases, run, report, out_dir)
    (out_dir / f"rank{rank}.json").write_text(json.dumps(report, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
