"""Python around the model that decides per call on the host, as users write it (TeaCache-style
patches, hooks, closures, custom processors), for the CPU and GPU tests of what a replay assumes.
Each ``apply_*`` changes one model; apply it to the accelerated model and to its eager twin."""

from __future__ import annotations

import contextlib
import itertools

import torch
from diffusers import FluxTransformer2DModel
from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

import bcg_pipelines as pipelines


def tiny_flux(device: str = "cpu", seed: int = 0) -> FluxTransformer2DModel:
    torch.manual_seed(seed)
    with torch.device(device):
        return FluxTransformer2DModel(**dict(pipelines.get_family("flux").tiny.transformer)).eval()


def flux_inputs(seed: int, device: str = "cpu") -> dict:
    """Inputs of one call; they differ per ``seed`` (a replay must copy them in)."""
    g = torch.Generator().manual_seed(seed)
    inputs = dict(
        hidden_states=torch.randn(1, 16, 64, generator=g), encoder_hidden_states=torch.randn(1, 8, 32, generator=g),
        pooled_projections=torch.randn(1, 32, generator=g), timestep=torch.tensor([0.5 + 0.01 * seed]),
        img_ids=torch.zeros(16, 3), txt_ids=torch.zeros(8, 3), guidance=torch.tensor([3.5]),
    )
    return {**{k: v.to(device) for k, v in inputs.items()}, "return_dict": False}


def compare(accelerated, twin, calls: int = 6, device: str = "cpu", first_seed: int = 0) -> None:
    """``calls`` calls with changing inputs: each bitwise equal to the twin's."""
    with torch.no_grad():
        for i in range(first_seed, first_seed + calls):
            got, want = accelerated(**flux_inputs(i, device))[0], twin(**flux_inputs(i, device))[0]
            assert torch.equal(got, want), f"call {i} differs from the eager twin"


def apply_reuse_every_other_call(model) -> None:
    """A TeaCache-style patch on the instance: every other call returns the previous output."""
    original = model.forward
    state = {"calls": 0, "last": None}

    def forward(*args, **kwargs):
        state["calls"] += 1
        if state["calls"] % 2 == 0 and state["last"] is not None:
            return (state["last"],)
        out = original(*args, **kwargs)
        state["last"] = out[0]
        return out

    model.forward = forward


def apply_pre_hook_flag(model) -> None:
    """A forward pre-hook on the transformer flips a flag each call; block 0's replaced forward
    reads it and skips the block when it is set."""
    model.register_forward_pre_hook(
        lambda m, args, kwargs: setattr(m, "skip_block", not getattr(m, "skip_block", True)), with_kwargs=True
    )
    block = model.transformer_blocks[0]
    original = block.forward

    def forward(*args, **kwargs):
        if model.skip_block:
            return kwargs["encoder_hidden_states"], kwargs["hidden_states"]
        return original(*args, **kwargs)

    block.forward = forward


def apply_closure_counter(model) -> None:
    """Single block 0's forward in a closure with a counter: every third call halves its output."""
    counter = itertools.count()
    block = model.single_transformer_blocks[0]
    original = block.forward

    def forward(*args, **kwargs):
        out = original(*args, **kwargs)
        return out if next(counter) % 3 else (out[0] * 0.5, out[1])

    block.forward = forward


@contextlib.contextmanager
def teacache_class_patch():
    """``FluxTransformer2DModel.forward`` reassigned (state kept on each module), then put back."""
    original = FluxTransformer2DModel.forward

    def teacache_forward(self, *args, **kwargs):
        self.teacache_calls = getattr(self, "teacache_calls", 0) + 1
        out = original(self, *args, **kwargs)
        return (out[0] * (1.0 if self.teacache_calls % 2 else 0.25),)

    FluxTransformer2DModel.forward = teacache_forward
    try:
        yield
    finally:
        FluxTransformer2DModel.forward = original


class CountingProcessor(FluxAttnProcessor):
    """A user's processor with host state: scales the output on every third call."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __call__(self, attn, *args, **kwargs):
        self.calls += 1
        out = super().__call__(attn, *args, **kwargs)
        factor = 0.5 if self.calls % 3 == 0 else 1.0
        return tuple(o * factor for o in out) if isinstance(out, tuple) else out * factor


def apply_counting_processor(model) -> None:
    model.transformer_blocks[0].attn.set_processor(CountingProcessor())
