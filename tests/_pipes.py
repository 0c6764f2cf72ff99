"""Shared helpers of the GPU tests: tiny pipelines and whole-generation calls."""

import contextlib

import torch

import bcg_pipelines as pipelines
from bcg_diffusion.toolkit.cache_option import cache_config, enable_cache

PROMPT = "a red fox jumping over a frozen river at dawn"


def build(family, seed=0, dtype=torch.float32, device="cuda"):
    return pipelines.build_pipeline(family, size="tiny", device=device, dtype=dtype, seed=seed)


def cfg_mode(family):
    """How CFG runs in these tests: Flux and QwenImage with a negative prompt (two calls)."""
    return "two_calls" if family == "flux" else pipelines.get_family(family).cfg_mode


def transformer_calls(family, steps):
    """Transformer calls one generation of :func:`run` makes (two per step where CFG is two calls)."""
    return steps * (2 if cfg_mode(family) == "two_calls" else 1)


def call_kwargs(family, steps=3, seed=0, prompt=PROMPT, device="cuda", **overrides):
    spec = pipelines.get_family(family)
    kwargs = dict(spec.call_kwargs)
    kwargs.update(
        prompt=prompt,
        num_inference_steps=steps,
        height=spec.tiny.height,
        width=spec.tiny.width,
        generator=torch.Generator(device).manual_seed(seed),
        output_type="latent",
    )
    if spec.tiny.num_frames:
        kwargs["num_frames"] = spec.tiny.num_frames
    if family == "flux":
        kwargs.update(negative_prompt=" ", true_cfg_scale=2.0)  # true CFG: two transformer calls per step
    kwargs.update(overrides)
    return kwargs


def run(pipe, family, **kw):
    """One whole generation; the final latents (a fresh tensor)."""
    context = contextlib.nullcontext()
    if cfg_mode(family) == "batched" and hasattr(pipe.transformer, "cache_context"):
        context = pipe.transformer.cache_context("batched")  # stateful caches need a context name
    with torch.no_grad(), context:
        out = pipe(**call_kwargs(family, device=pipe.device.type, **kw))
    result = out[0]
    return result.clone() if isinstance(result, torch.Tensor) else torch.as_tensor(result)


def with_cache(pipe, family, text, steps):
    enable_cache(pipe.transformer, cache_config(text, pipe, family, steps, cfg_mode(family)))
    return pipe


def tiny_flux_transformer(seed=0, device="cpu"):
    """The tiny Flux transformer of ``pipelines`` (random weights from ``seed``), in eval mode."""
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(seed)
    return FluxTransformer2DModel(**dict(pipelines.get_family("flux").tiny.transformer)).to(device).eval()


def flux_inputs(seed=1, timestep=0.5, device="cpu"):
    """Keyword arguments of one call of :func:`tiny_flux_transformer` (16 image tokens, 8 text tokens),
    drawn from ``seed``; ``timestep=None`` draws the timestep too."""
    g = torch.Generator().manual_seed(seed)
    inputs = dict(
        hidden_states=torch.randn(1, 16, 64, generator=g),
        encoder_hidden_states=torch.randn(1, 8, 32, generator=g),
        pooled_projections=torch.randn(1, 32, generator=g),
        timestep=torch.rand(1, generator=g) if timestep is None else torch.tensor([timestep]),
        img_ids=torch.zeros(16, 3),
        txt_ids=torch.zeros(8, 3),
        guidance=torch.tensor([3.5]),
    )
    return {**{k: v.to(device) for k, v in inputs.items()}, "return_dict": False}
