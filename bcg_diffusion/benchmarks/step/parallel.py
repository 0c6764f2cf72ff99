"""Context-parallel cases (``family:...:cpN``, ring: ``cpNr``): the launch check, the ranks, per-rank results.

Such a case runs under ``torchrun --nproc_per_node N scripts/bench_step.py --cases ...`` (or under
``--processes K``, which launches torchrun itself), one GPU per rank. Every rank builds the same pipeline
with the same seed and records the same step inputs; each mode's module is a fresh weight-sharing copy of
the transformer with diffusers context parallelism enabled on it (:func:`prepare_module`: Ulysses, or ring
with the attention backend :data:`RING_BACKEND`, since native SDPA returns no log-sum-exp). Every rank times
its own transformer calls with CUDA events; rank 0 gathers the results (``all_gather_object``) and reports
per mode the **slowest rank's** median (:func:`combine_ranks`), and only rank 0 writes files.

Ranks must make the same calls in the same order, or a collective waits forever: the calls per round and
the time-budget decision are rank 0's, broadcast to all (:meth:`Ranks.agree`), and ``--setup-timeout`` is
not applied (a timeout on one rank would leave the others in a collective).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, Mapping, MutableMapping

import torch

from bcg_diffusion.toolkit.speedups import enable_context_parallel, set_attention_backend

#: NVLink multicast off wherever a program starts (docs/multi-gpu.md), unless the user set the variable.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
RING_BACKEND = "_native_cudnn"  # ring attention needs the log-sum-exp, which diffusers' native backend lacks
SCRIPT = "scripts/bench_step.py"


def multicast_off(environ: MutableMapping[str, str] = os.environ) -> list[str]:
    """Set :data:`MULTICAST_OFF` where unset; return the names it set."""
    set_now = [k for k in MULTICAST_OFF if k not in environ]
    for key in set_now:
        environ[key] = MULTICAST_OFF[key]
    return set_now


def cp_degree(cases) -> int | None:
    """The context-parallel degree of the run's cases (``None``: none is context parallel)."""
    degrees = {c.cp for c in cases if c.cp}
    return max(degrees) if degrees else None


def launch_command(cases, degree: int) -> str:
    return f"torchrun --nproc_per_node {degree} {SCRIPT} --cases {','.join(c.label for c in cases)} ..."


def mix_problem(cases) -> str | None:
    """Why these cases cannot share one launch (``None`` if they can)."""
    cp = [c for c in cases if c.cp]
    if not cp:
        return None
    if len({c.cp for c in cp}) > 1:
        return ("cases with different context-parallel degrees (" + ", ".join(c.label for c in cp) + ") need one "
                "launch each")
    single = [c for c in cases if not c.cp]
    if single:
        return (f"context-parallel cases ({', '.join(c.label for c in cp)}) and one-GPU cases "
                f"({', '.join(c.label for c in single)}) cannot share a launch; run them separately")
    return None


def launch_problem(cases, environ: Mapping[str, str] = os.environ) -> str | None:
    """Why this process cannot run ``cases`` as launched (``None`` if it can): a cp case needs exactly its
    degree of ranks (torchrun's ``WORLD_SIZE``), and a launch of several ranks needs cp cases."""
    problem = mix_problem(cases)
    if problem:
        return problem
    world = int(environ.get("WORLD_SIZE", "1") or 1)
    degree = cp_degree(cases)
    if degree is None:
        if world > 1:
            return (f"this launch has {world} ranks (WORLD_SIZE={world}) but no case is context parallel; name the "
                    f"degree in the case (e.g. flux:full:1024x1024:b1:cp{world}) or run without torchrun")
        return None
    if world != degree:
        how = "this process was not started by torchrun" if "WORLD_SIZE" not in environ else f"WORLD_SIZE={world}"
        return (f"context parallelism of degree {degree} needs {degree} ranks, one GPU each ({how}); launch it with "
                f"`{launch_command([c for c in cases if c.cp], degree)}` (or add --processes K, which launches "
                "torchrun itself)")
    return None


class Ranks:
    """The ranks of this launch. This base is the one-process stand-in: rank 0 of 1, agreeing with itself."""

    rank, world, local_rank = 0, 1, 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def agree(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (each must call this at the same point)."""
        return value

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order, on every rank."""
        return [value]

    def describe(self) -> dict[str, Any] | None:
        return None

    def close(self) -> None:
        pass


class TorchRanks(Ranks):
    """The ranks of a torchrun launch, through ``torch.distributed`` (NCCL on CUDA, else gloo)."""

    def __init__(self, cuda: bool, timeout_s: float = 1800.0):
        import torch.distributed as dist

        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if cuda:
            torch.cuda.set_device(self.local_rank)
        self.backend = "nccl" if cuda else "gloo"
        dist.init_process_group(self.backend, timeout=timedelta(seconds=timeout_s),
                                **({"device_id": torch.device("cuda", self.local_rank)} if cuda else {}))
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def agree(self, value: Any) -> Any:
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, value)
        return out

    def describe(self) -> dict[str, Any]:
        return {"world_size": self.world, "backend": self.backend,
                "multicast_env": {k: os.environ.get(k) for k in MULTICAST_OFF}}

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def prepare_module(module: torch.nn.Module, case) -> tuple[torch.nn.Module, list[str]]:
    """Enable ``case``'s context parallelism on ``module`` (a fresh copy: diffusers refuses a second
    ``enable_parallelism``); return it and notes."""
    notes = []
    if case.cp_ring:
        notes.append(set_attention_backend(module, RING_BACKEND))
    notes.append(enable_context_parallel(module, case.cp_kind, case.cp))
    return module, notes


def _failed(results: list[dict[str, Any]]) -> tuple[int, dict[str, Any]] | None:
    for rank, res in enumerate(results):
        if res.get("status") != "ok" or "median_ms" not in res:
            return rank, res
    return None


def combine_ranks(per_rank: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """One result per mode from every rank's results (in rank order): the slowest rank's numbers, with
    ``per_rank_median_ms``, ``slowest_rank``, equality to eager on every rank and each rank's eager GPU-busy
    fraction. A mode that failed on any rank reports that rank's status and reason."""
    combined: dict[str, dict[str, Any]] = {}
    names = list(dict.fromkeys(name for results in per_rank for name in results))
    for name in names:
        results = [r.get(name, {"status": "error", "reason": "no result on this rank"}) for r in per_rank]
        failed = _failed(results)
        if failed is not None:
            rank, res = failed
            out = dict(res)
            if len({(r.get("status"), r.get("reason")) for r in results}) > 1:  # the ranks disagree: say which
                out["reason"] = f"rank {rank}: {res.get('reason', res.get('status'))}"
            combined[name] = out
            continue
        medians = [r["median_ms"] for r in results]
        slowest = max(range(len(results)), key=medians.__getitem__)
        out = dict(results[slowest], per_rank_median_ms=medians, slowest_rank=slowest)
        out["notes"] = list(out.get("notes", [])) + [
            f"slowest of {len(results)} ranks: rank {slowest} (per-rank medians "
            + ", ".join(f"{m:.2f}" for m in medians) + " ms)"]
        if any("bitwise_equal_to_eager" in r for r in results):
            out["bitwise_equal_to_eager"] = all(r.get("bitwise_equal_to_eager") for r in results)
            out["max_abs_diff_vs_eager"] = max(r.get("max_abs_diff_vs_eager") or 0.0 for r in results)
        profiles = [r.get("profile") for r in results]
        if any(profiles):
            out["per_rank_profile"] = profiles
            out["per_rank_gpu_busy_fraction"] = [(p or {}).get("gpu_busy_fraction") for p in profiles]
        combined[name] = out
    return combined
