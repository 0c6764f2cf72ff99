"""The server's second part: the speed stack on the built model, in order: ``--offload``'s block streaming or
quantization (the plan refuses both together), the LoRA adapters (before BCG and compile touch the transformer),
the attention backend, the step cache, compile, BCG (:mod:`bcg_diffusion.toolkit.stack` applies the layers). A
layer that cannot be applied raises :class:`~bcg_diffusion.toolkit.options.Failure`.

BCG keeps at least as many captured keys as the warm-up may capture (:func:`graphs_to_keep`): with the library's
default (8) a warm-up of more keys evicted its own first keys, and requests at those warmed sizes captured again
while serving.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from bcg_diffusion import BCGConfig
from bcg_diffusion.toolkit.offload_option import stream_transformers
from bcg_diffusion.toolkit.options import Failure
from bcg_diffusion.toolkit.speedups import speed_up
from bcg_diffusion.toolkit.stack import apply_speed_layers, quantize_layer

from ..adapters.bank import attach_adapters
from ..server_plan import ServerPlan, prog
from ..startup_warmup import most_warmup_keys, warms_default_size
from .model import BuiltModel

__all__ = ["SpedUp", "graphs_to_keep", "speed_up_model", "stack_line"]


@dataclass(frozen=True)
class SpedUp:
    """What the stack left: the adapter ``bank`` (``None`` without adapters), ``before_call`` (run before every
    pipeline call: a step cache's reset; ``None``: nothing) and the ``notes`` that say what was done, the stack's
    first."""

    bank: Any = None
    before_call: Callable[[], None] | None = None
    notes: list[str] = field(default_factory=list)


def speed_up_model(built: BuiltModel, plan: ServerPlan) -> SpedUp:
    """Apply the plan's stack to ``built.pipe``, in order (see the module's docstring)."""
    pipe, spec = built.pipe, built.spec
    notes = [stack_line(plan)] + stream_offloaded(pipe, plan) + quantize_layer(pipe, plan.stack)  # one or none
    bank = attach_adapters(pipe, plan.adapters, plan.catalog, prog())
    if bank is not None:
        notes.append(f"LoRA adapters: {', '.join(bank.names)} (hot-swap rank {bank.target_rank}, {bank.gpu_slots} kept "
                     "on the device)")
    applied = apply_speed_layers(pipe, plan.stack, spec.name if spec is not None else None, built.default_steps)
    keep, why = graphs_to_keep(plan)
    on_cuda = plan.model.device.type == "cuda"
    notes += applied.notes + speed_up(pipe, compile=False, bcg=plan.bcg, on_cuda=on_cuda, max_graphs=keep)
    if plan.bcg and on_cuda and why is not None:  # without CUDA nothing is captured
        notes.append(why)
    return SpedUp(bank, applied.before_call, notes)  # the step cache's reset: an image depends on its request alone


def graphs_to_keep(plan: ServerPlan) -> tuple[int | None, str | None]:
    """BCG's ``max_graphs`` for the server and the line that says why: the most keys its warm-up may capture
    (:func:`~..startup_warmup.most_warmup_keys`) where that is above the library's default (``None`` and no line
    otherwise, and without a warm-up)."""
    sizes = len(plan.warmup) or (1 if warms_default_size(plan.warmup, plan.stack) else 0)
    adapters = bool(plan.catalog.adapters)
    most = most_warmup_keys(sizes, plan.requests.max_n, plan.batching.rows > 1, adapters)
    default = BCGConfig.max_graphs
    if most <= default:
        return None, None
    return most, (f"BCG keeps up to {most} graph keys (the library's default is {default}): the warm-up may capture "
                  f"that many ({sizes} size(s) x ({'the batch shape and ' if plan.batching.rows > 1 else ''}n = 1 .. "
                  f"{plan.requests.max_n}){' x 2 (adapter slot on and off)' if adapters else ''}), and a warmed key "
                  "evicted would capture again while serving")


def stack_line(plan: ServerPlan) -> str:
    """The start-up line that names the stack: ``stack: fp8 + cache dbcache + compile, with BCG``."""
    bcg = "with BCG" if plan.bcg else "without BCG (eager)"
    return f"stack: {plan.stack.describe()}, {bcg}"


def stream_offloaded(pipe, plan: ServerPlan) -> list[str]:
    """``--offload K``: the transformer streams its blocks through K device slots; the note to print."""
    offload = plan.model.offload
    if offload is None:
        return []
    try:
        return [stream_transformers(pipe, offload, plan.model.device)]
    except Exception as exc:  # noqa: BLE001 - e.g. AccelerationError (too many slots, no room under the cap)
        raise Failure(1, f"error: --offload {offload}: {type(exc).__name__}: {exc}") from exc
