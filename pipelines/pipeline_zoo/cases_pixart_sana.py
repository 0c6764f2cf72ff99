"""Pipeline zoo cases of PixArt-alpha/Sigma and Sana (``pixart_alpha``, ``sana``, ``pag``, ControlNet, Sprint).

Components are the ``pixart`` and ``sana`` families' tiny ones. Resolution binning is off, so the tiny models run
at the size asked for (64 px; PixArt's 8x VAE gives 8x8 latents, Sana's 32x DC-AE 2x2 latents).
"""

from __future__ import annotations

from typing import Any

from ..registry import get_family
from .case import PipelineCase
from .media import Media
from .parts import Parts

__all__ = ["CASES"]

PIXART_SIZE = 64
SANA_SIZE = 128
_SANA_CONTROLNET_KEYS = ("in_channels", "out_channels", "num_attention_heads", "attention_head_dim",
                         "num_cross_attention_heads", "cross_attention_head_dim", "cross_attention_dim",
                         "caption_channels", "mlp_ratio", "sample_size", "patch_size")


def _text(size: int, **extra: Any) -> dict[str, Any]:
    return {"prompt": "a red fox in the snow", "height": size, "width": size, "guidance_scale": 4.5,
            "use_resolution_binning": False, "max_sequence_length": 32, "output_type": "latent", **extra}


def _pixart_text(m: Media, **extra: Any) -> dict[str, Any]:
    return _text(PIXART_SIZE, clean_caption=False, **extra)


def _sana_text(m: Media, **extra: Any) -> dict[str, Any]:
    return _text(SANA_SIZE, complex_human_instruction=None, **extra)


def _sana_controlnet(parts: Parts) -> dict[str, Any]:
    components = parts.family("sana")
    tiny = get_family("sana").tiny.transformer
    config = {key: tiny[key] for key in _SANA_CONTROLNET_KEYS} | {"num_layers": 1}
    components["controlnet"] = parts.model("controlnet", "SanaControlNetModel", config)
    return components


def _sana_sprint(parts: Parts) -> dict[str, Any]:
    # Sana Sprint: guidance embedded, RMS norm over all heads of q/k, the SCM scheduler (trigflow)
    components = parts.family("sana", dict(guidance_embeds=True, qk_norm="rms_norm_across_heads"))
    components["scheduler"] = parts.scheduler("SCMScheduler")
    return components


CASES: list[PipelineCase] = [
    PipelineCase("PixArtAlphaPipeline", lambda p: p.family("pixart"), _pixart_text, group="pixart_alpha"),
    PipelineCase("PixArtSigmaPipeline", lambda p: p.family("pixart"), _pixart_text, group="pixart_alpha",
                 note="batched CFG; the legacy callback (no callback_on_step_end)"),
    PipelineCase("PixArtSigmaPAGPipeline", lambda p: p.family("pixart"), lambda m: _pixart_text(m, pag_scale=3.0),
                 group="pixart_alpha", note="perturbed-attention guidance: a batch of 3 per step"),
    PipelineCase("SanaPipeline", lambda p: p.family("sana"), _sana_text),
    PipelineCase("SanaPAGPipeline", lambda p: p.family("sana"), lambda m: _sana_text(m, pag_scale=3.0), group="sana"),
    PipelineCase("SanaControlNetPipeline", _sana_controlnet,
                 lambda m: _sana_text(m, control_image=m.control(SANA_SIZE, SANA_SIZE))),
    PipelineCase("SanaSprintPipeline", _sana_sprint, lambda m: _sana_text(m, num_inference_steps=2),
                 note="guidance-distilled, two SCM steps"),
    PipelineCase("SanaSprintImg2ImgPipeline", _sana_sprint,
                 lambda m: _sana_text(m, image=m.image(SANA_SIZE, SANA_SIZE), strength=0.8, num_inference_steps=2)),
]
