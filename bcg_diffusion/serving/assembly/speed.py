"""The server's second part: the speed stack on the built model, in order: ``--offload``'s block streaming or
quantization (the plan refuses both together), the LoRA adapters (before BCG and compile touch the transformer),
the attention backend, the step cache, compile, BCG (:mod:`bcg_diffusion.toolkit.stack` applies the layers). A
layer that cannot be applied raises :class:`~bcg_diffusion.toolkit.options.Failure`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from bcg_diffusion.toolkit.offload_option import stream_transformers
from bcg_diffusion.toolkit.options import Failure
from bcg_diffusion.toolkit.speedups import speed_up
from bcg_diffusion.toolkit.stack import apply_speed_layers, quantize_layer

from ..adapters.bank import attach_adapters
from ..server_plan import ServerPlan, prog
from .model import BuiltModel

__all__ = ["SpedUp", "speed_up_model", "stack_line"]


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
    notes += applied.notes + speed_up(pipe, compile=False, bcg=plan.bcg, on_cuda=plan.model.device.type == "cuda")
    return SpedUp(bank, applied.before_call, notes)  # the step cache's reset: an image depends on its request alone


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
