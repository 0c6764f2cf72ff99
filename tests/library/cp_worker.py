"""One rank of the context-parallel check: BCG under diffusers' context parallelism vs eager CP.

Launched by ``tests/library/test_context_parallel_gpu.py`` (or by hand) through torchrun, one process per
GPU, with NCCL's NVLink multicast off::

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        python -m torch.distributed.run --standalone --nproc_per_node 2 tests/library/cp_worker.py --report-dir /tmp/cp

Every rank builds the same tiny transformers (same seed) twice for each case: one runs eager
context parallelism (the reference), the other the same under ``bcg_diffusion.accelerate_transformer``.
Both get the same calls (shape changes, a LoRA load after capture). Each rank writes
``rank<N>.json`` into ``--report-dir``: per case, the calls whose outputs were not bitwise equal,
BCG's stats (hits, captures, fallbacks) and a digest of all outputs (equal on every rank, since
the gathered output is the whole result).

Importing this module has no side effects (a CPU test imports it). ``--device cpu`` runs a smoke
version over gloo. diffusers computes ``rank % torch.accelerator.device_count()``, which is 0
without an accelerator, so the worker patches that count to 1 in this mode. BCG is a no-op on
the CPU, so this mode checks the worker itself, not BCG.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import random
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
FAMILIES = ("flux", "wan")
MODES = ("ulysses", "ring")
# Ring attention merges partial results with their log-sum-exp; diffusers' "native" backend returns
# none, so ring runs on torch's flash SDPA (bf16/fp16, no mask: Flux and Wan pass none).
BACKENDS = {"ulysses": "native", "ring": "_native_flash"}
ORDER_CASE = "flux:ulysses:bcg_first"  # accelerate first, then enable context parallelism
ALL_CASES = tuple(f"{f}:{m}" for f in FAMILIES for m in MODES) + (ORDER_CASE,)
LORA_TARGETS = ["to_q", "to_k", "to_v"]
LORA_AT_CALL = 6  # after a capture, a replay and a shape change

# Input shapes, each divisible by 2 in the split sequence dimension. Flux: (batch, latent rows, latent
# cols, text tokens); its text is split too. Wan: (batch, frames, height, width, text tokens), patch 1x2x2.
SHAPES = {
    "flux": [(1, 4, 4, 8), (1, 4, 6, 8), (2, 4, 4, 8)],
    "wan": [(1, 3, 8, 8, 8), (1, 3, 8, 12, 8), (2, 5, 8, 8, 8)],
}


def launch_command(report_dir: str | os.PathLike, *worker_args: str, nproc: int = 2) -> list[str]:
    """The torchrun command line for ``nproc`` ranks of this worker (run it with :func:`launch_env`)."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
        str(Path(__file__).resolve()), "--report-dir", str(report_dir), *worker_args,
    ]


def launch_env(base: dict | None = None) -> dict:
    """``base`` (default: this process's environment) with NVLink multicast off and the repository
    importable."""
    env = dict(os.environ if base is None else base)
    env.update(MULTICAST_OFF)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def call_schedule(family: str, calls: int) -> list[tuple[int, ...]]:
    """The shape of every call: the first shape three times (capture, replays), the second twice
    (a shape change after capture), the first again, then a seeded mix of all of them."""
    shapes = SHAPES[family]
    start = [shapes[0]] * 3 + [shapes[1]] * 2 + [shapes[0]]
    rng = random.Random(0)
    rest = [rng.choice(shapes) for _ in range(max(0, calls - len(start)))]
    return (start + rest)[:calls]


def make_inputs(family: str, shape: tuple[int, ...], seed: int, device: Any, dtype: Any) -> dict:
    """The transformer's keyword arguments for one call (the same on every rank for one seed)."""
    import torch

    g = torch.Generator(device).manual_seed(seed)

    def randn(*size):
        return torch.randn(*size, generator=g, device=device, dtype=torch.float32).to(dtype)

    if family == "flux":
        batch, rows, cols, text = shape
        ids = torch.zeros(rows, cols, 3, device=device)
        ids[..., 1] = torch.arange(rows, device=device)[:, None]
        ids[..., 2] = torch.arange(cols, device=device)[None, :]
        return dict(
            hidden_states=randn(batch, rows * cols, 64),
            encoder_hidden_states=randn(batch, text, 32),
            pooled_projections=randn(batch, 32),
            timestep=torch.rand(batch, generator=g, device=device).to(dtype),
            guidance=torch.full((batch,), 3.5, device=device, dtype=dtype),
            img_ids=ids.reshape(rows * cols, 3),
            txt_ids=torch.zeros(text, 3, device=device),
            return_dict=False,  # diffusers' root split hook refuses a dict output under context parallelism
        )
    batch, frames, height, width, text = shape
    return dict(
        hidden_states=randn(batch, 16, frames, height, width),
        encoder_hidden_states=randn(batch, text, 32),
        timestep=torch.randint(0, 1000, (batch,), generator=g, device=device).to(dtype),
        return_dict=False,
    )


def build_transformer(family: str, seed: int, device: Any, dtype: Any):
    """The family's tiny transformer with random weights drawn from ``seed`` (equal on every rank)."""
    import torch

    import bcg_pipelines as pipelines

    spec = pipelines.get_family(family)
    torch.manual_seed(seed)
    with torch.device(device):
        model = spec.transformer_class(**spec.size("tiny").transformer)
    for tensor in [*model.parameters(), *model.buffers()]:  # as pipelines.build does: every floating tensor
        if tensor.is_floating_point():
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


def enable_context_parallel(model, mode: str, backend: str) -> None:
    from diffusers import ContextParallelConfig

    model.set_attention_backend(backend)
    degree = {"ulysses_degree": 2} if mode == "ulysses" else {"ring_degree": 2}
    device_type = next(model.parameters()).device.type
    model.enable_parallelism(config=ContextParallelConfig(**degree, mesh=_mesh(mode, device_type)))


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

    stats = bcg.get_stats(model)
    if stats is None:
        return {"accelerated": False}
    return {
        "accelerated": True,
        "hits": stats.hits,
        "misses": stats.misses,
        "captures": stats.captures,
        "eager_calls": stats.eager_calls,
        "fallbacks": [e.fallback for e in stats.entries if e.fallback],
        "breaks": [e.breaks for e in stats.entries],
    }


@dataclass
class Case:
    family: str
    mode: str
    bcg_first: bool = False

    @classmethod
    def parse(cls, text: str) -> "Case":
        parts = text.split(":")
        if len(parts) not in (2, 3) or parts[0] not in FAMILIES or parts[1] not in MODES or parts[2:] not in ([], ["bcg_first"]):
            raise ValueError(f"a case is family:mode[:bcg_first] with family in {FAMILIES} and mode in {MODES}, got {text!r}")
        return cls(parts[0], parts[1], parts[2:] == ["bcg_first"])


def run_case(case: Case, calls: int, device: Any, dtype: Any, lora: bool, seed: int = 0) -> dict:
    """Eager CP and BCG CP side by side on the same calls; what differed and what BCG did."""
    import torch

    import bcg_diffusion as bcg

    backend = BACKENDS[case.mode]
    record: dict = {"mismatches": [], "mismatch_count": 0, "calls": 0, "lora": None, "gather_output_type": None}
    eager = build_transformer(case.family, seed, device, dtype)
    enable_context_parallel(eager, case.mode, backend)
    seen_types: list[str] = []
    eager.proj_out.register_forward_hook(lambda m, a, out: seen_types.append(type(out).__name__))
    accelerated = build_transformer(case.family, seed, device, dtype)
    try:
        if case.bcg_first:
            bcg.accelerate_transformer(accelerated)
            enable_context_parallel(accelerated, case.mode, backend)
        else:
            enable_context_parallel(accelerated, case.mode, backend)
            bcg.accelerate_transformer(accelerated)
    except bcg.AccelerationError as exc:  # a clear refusal of this order is an accepted outcome
        record["refused"] = f"{type(exc).__name__}: {exc}"
        return record
    digest = hashlib.sha256()
    for index, shape in enumerate(call_schedule(case.family, calls)):
        inputs = make_inputs(case.family, shape, seed=index, device=device, dtype=dtype)
        if index == LORA_AT_CALL and lora:
            with torch.no_grad():
                before = eager(**inputs)[0].clone()
            add_lora(eager, seed + 1)
            add_lora(accelerated, seed + 1)
            with torch.no_grad():
                record["lora_changed_output"] = not torch.equal(before, eager(**inputs)[0])
            record["lora"] = f"added before call {index}"
        with torch.no_grad():
            reference = eager(**inputs)[0]
            out = accelerated(**inputs)[0]
        record["calls"] += 1
        if not torch.equal(out, reference):
            record["mismatch_count"] += 1
        if not torch.equal(out, reference) and len(record["mismatches"]) < 10:
            diff = (out.float() - reference.float()).abs().max().item() if out.shape == reference.shape else None
            record["mismatches"].append({"call": index, "shape": list(shape), "max_abs_diff": diff,
                                         "out_shape": list(out.shape), "ref_shape": list(reference.shape)})
        _digest_update(digest, reference)
    record["digest"] = digest.hexdigest()
    record["gather_output_type"] = sorted(set(seen_types))
    record["stats"] = _stats(accelerated)
    return record


def _check_environment(device_type: str) -> None:
    if device_type != "cuda":
        return
    wrong = {k: os.environ.get(k) for k, v in MULTICAST_OFF.items() if os.environ.get(k) != v}
    if wrong:
        raise SystemExit(
            f"cp_worker: NVLink multicast must be off for every launch; set {MULTICAST_OFF} (found {wrong})"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report-dir", required=True, help="folder for rank<N>.json")
    parser.add_argument("--cases", default=",".join(ALL_CASES), help=f"comma-separated; default {','.join(ALL_CASES)}")
    parser.add_argument("--calls", type=int, default=100, help="calls per case (default 100)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--no-lora", action="store_true", help="skip the LoRA load")
    parser.add_argument("--collective-timeout-s", type=float, default=120.0,
                        help="a collective that waits longer fails (NCCL watchdog / gloo timeout) instead of hanging")
    args = parser.parse_args(argv)
    cases = [Case.parse(c) for c in args.cases.split(",") if c]
    _check_environment(args.device)

    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    timeout = datetime.timedelta(seconds=args.collective_timeout_s)
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:
        device = torch.device("cpu")
        torch.accelerator.device_count = lambda: 1  # smoke mode only: see the module docstring
        dist.init_process_group("gloo", timeout=timeout)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    lora = not args.no_lora
    lora_note = None
    if lora:
        try:
            import peft  # noqa: F401
        except ImportError:
            lora, lora_note = False, "peft is not installed"

    import diffusers

    report: dict = {"rank": rank, "world_size": world, "torch": torch.__version__, "diffusers": diffusers.__version__,
                    "device": str(device), "lora_skipped": lora_note, "cases": {}}
    for case_text, case in zip(args.cases.split(","), cases):
        try:
            report["cases"][case_text] = run_case(case, args.calls, device, dtype, lora)
        except Exception:  # noqa: BLE001 - recorded; the other rank fails the same way or times out
            report["cases"][case_text] = {"error": traceback.format_exc()}
        dist.barrier()
    out_dir = Path(args.report_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank{rank}.json").write_text(json.dumps(report, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
