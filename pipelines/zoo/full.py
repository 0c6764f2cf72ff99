"""Full-size configs of three zoo transformers without a pipeline builder, and their forward calls at a
launch-bound shape, for a per-call benchmark (``scripts/zoo_bench.py``).

LTX-2 (``LTX2VideoTransformer3DModel``), HunyuanVideo 1.5 (``HunyuanVideo15Transformer3DModel``) and HiDream-I1
(``HiDreamImageTransformer2DModel``) have text encoders of 8-12B parameters, so ``bcg_pipelines`` builds no pipeline
for them; the benchmark times one transformer call. Each :class:`FullCase` holds the **published config** of
the real checkpoint as init kwargs of the diffusers 0.42.1 class (where it came from is said beside it), a
small variant (the same flags and block kinds, small widths and 1-2 blocks of each kind, for CPU tests), and an
input maker that builds the call as the class's pipeline makes it: channel counts, text lengths and widths,
which tensors are on the device, dtypes, strides. Shapes come from the config and a pixel-space ``shape`` dict
(frames, height, width, text lengths, batch), so the small variant runs the same code on the CPU.

Public API::

    FULL_CASES: {"ltx2": FullCase, "hunyuanvideo15": FullCase, "hidream": FullCase}
    get_case(name) -> FullCase                    ValueError naming the known cases
    build_model(case, size, device, dtype, seed)  the model, built on ``device`` in ``dtype`` (seeded)
    case.make_inputs(maker) / case.inputs(size, device, dtype, seed, **shape_overrides)
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from .case import InputMaker, _keep_fp32_modules, _ZeroedEmpty

__all__ = ["FULL_CASES", "FullCase", "SIZES", "build_model", "estimated_parameters", "get_case", "parameter_count",
           "parse_shape_overrides"]

SIZES = ("full", "small")


@dataclass(frozen=True)
class FullCase:
    """One transformer class at its published size, with a pipeline-faithful forward call.

    Attributes:
        name: short name (``ltx2``, ``hunyuanvideo15``, ``hidream``).
        class_name: the class in ``diffusers.models.transformers``.
        checkpoint: the checkpoint whose config ``config`` is.
        config: init kwargs of the published checkpoint (every key the input maker reads is present).
        small_config: the same flags with small widths and few blocks (``config`` updated), for CPU tests.
        shape: pixel-space shape of the call: frames, height, width, text lengths, batch (see each case).
        build_inputs: ``build_inputs(maker, shape) -> kwargs``; shapes derive from ``maker.config`` and ``shape``.
        tokens: ``tokens(config, shape) -> {"latent": n, "text": n, ...}`` per call (all samples of the batch).
        describe: ``describe(config, shape) -> str``, the shape in words (pixels, latents, batch).
        source: where the config came from.
        note: how the pipeline makes this call (what the benchmark reproduces and what it leaves out).
    """

    name: str
    class_name: str
    checkpoint: str
    config: Mapping[str, Any]
    small_config: Mapping[str, Any]
    shape: Mapping[str, Any]
    build_inputs: Callable[[InputMaker, Mapping[str, Any]], dict[str, Any]]
    tokens: Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, int]]
    describe: Callable[[Mapping[str, Any], Mapping[str, Any]], str]
    source: str = ""
    note: str = ""
    small_shape: Mapping[str, Any] = field(default_factory=dict)

    def config_for(self, size: str = "full") -> dict[str, Any]:
        """The init kwargs at ``size`` (``"full"`` or ``"small"``)."""
        if size not in SIZES:
            raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
        return dict(self.config if size == "full" else self.small_config)

    def shape_for(self, size: str = "full", **overrides: Any) -> dict[str, Any]:
        """The call's shape at ``size``, with ``overrides`` (keys of :attr:`shape` only)."""
        unknown = sorted(set(overrides) - set(self.shape))
        if unknown:
            raise ValueError(f"{self.name}: unknown shape keys {', '.join(unknown)}; the keys are "
                             + ", ".join(self.shape))
        shape = dict(self.shape)
        if size == "small":
            shape.update(self.small_shape)
        shape.update(overrides)
        return shape

    def make_inputs(self, maker: InputMaker, shape: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Keyword inputs of one forward (``return_dict=False`` added) for ``maker.config`` at ``shape``
        (default :attr:`shape`)."""
        kwargs = self.build_inputs(maker, dict(self.shape if shape is None else shape))
        kwargs.setdefault("return_dict", False)
        return kwargs

    def inputs(self, size: str = "full", device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
               seed: int = 0, **shape_overrides: Any) -> dict[str, Any]:
        """:meth:`make_inputs` for the config at ``size`` on ``device`` (floating inputs in ``dtype``, seeded)."""
        maker = InputMaker(device, dtype, seed, self.config_for(size))
        return self.make_inputs(maker, self.shape_for(size, **shape_overrides))


def parse_shape_overrides(text: str) -> dict[str, Any]:
    """``"height=512:width=768"`` -> ``{"height": 512, "width": 768}`` (ints, floats or text)."""
    overrides: dict[str, Any] = {}
    for part in filter(None, text.split(":")):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise ValueError(f"shape override {part!r} is not KEY=VALUE")
        for kind in (int, float):
            try:
                overrides[key] = kind(value)
                break
            except ValueError:
                continue
        else:
            overrides[key] = value
    return overrides


def _expanded_timestep(m: InputMaker, value: float, batch: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``t.expand(batch)`` of a scheduler timestep (a 0-d float32 tensor on the device): a stride-0 view."""
    return torch.tensor(value, dtype=dtype, device=m.device).expand(batch)


# -- LTX-2 (19B, video + audio) ------------------------------------------------------------------------
# Lightricks/LTX-2 transformer/config.json (https://huggingface.co/Lightricks/LTX-2/blob/main/transformer/config.json),
# identical to diffusers' scripts/convert_ltx2_to_diffusers.py get_ltx2_transformer_config("2.0") (commit
# 58eb52c). Keys not in the published file are the class defaults of diffusers 0.42.1 (gated_attn, cross_attn_mod,
# perturbed_attn, ff_bias, use_prompt_adaln_single, ... all the LTX-2.0 values); note rope_type "split", not the
# class default "interleaved".
LTX2_FULL = dict(
    in_channels=128, out_channels=128, patch_size=1, patch_size_t=1, num_attention_heads=32, attention_head_dim=128,
    cross_attention_dim=4096, vae_scale_factors=(8, 32, 32), pos_embed_max_pos=20, base_height=2048, base_width=2048,
    gated_attn=False, cross_attn_mod=False, audio_in_channels=128, audio_out_channels=128, audio_patch_size=1,
    audio_patch_size_t=1, audio_num_attention_heads=32, audio_attention_head_dim=64, audio_cross_attention_dim=2048,
    audio_scale_factor=4, audio_pos_embed_max_pos=20, audio_sampling_rate=16000, audio_hop_length=160,
    audio_gated_attn=False, audio_cross_attn_mod=False, num_layers=48, activation_fn="gelu-approximate",
    qk_norm="rms_norm_across_heads", norm_elementwise_affine=False, norm_eps=1e-6, caption_channels=3840,
    attention_bias=True, attention_out_bias=True, rope_theta=10000.0, rope_double_precision=True, causal_offset=1,
    timestep_scale_multiplier=1000, cross_attn_timestep_scale_multiplier=1000, rope_type="split",
    use_prompt_embeddings=True, perturbed_attn=False,
)
LTX2_SMALL = dict(LTX2_FULL, in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=8,
                  cross_attention_dim=16, audio_in_channels=8, audio_out_channels=8, audio_num_attention_heads=2,
                  audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2, caption_channels=16)
# LTX2Pipeline defaults: 24 fps; the Gemma tokenizer pads to 1024 tokens; CFG batches the negative prompt.
LTX2_SHAPE = dict(batch=2, num_frames=9, height=256, width=384, frame_rate=24.0, text_tokens=1024, timestep=1000.0)


def _ltx2_latent_shape(c: Mapping[str, Any], s: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """(latent frames, latent height, latent width, audio latent frames) as LTX2Pipeline computes them."""
    t_ratio, s_ratio = c["vae_scale_factors"][0], c["vae_scale_factors"][1]
    frames = (s["num_frames"] - 1) // t_ratio + 1
    height, width = s["height"] // s_ratio, s["width"] // s_ratio
    # audio: 16 kHz, hop 160, 4x temporal compression of the audio VAE (= audio_scale_factor): 25 latents/s
    per_second = c["audio_sampling_rate"] / c["audio_hop_length"] / float(c["audio_scale_factor"])
    audio_frames = round(s["num_frames"] / s["frame_rate"] * per_second)
    return frames, height, width, audio_frames


def _ltx2_tokens(c: Mapping[str, Any], s: Mapping[str, Any]) -> dict[str, int]:
    frames, height, width, audio = _ltx2_latent_shape(c, s)
    video = (frames // c["patch_size_t"]) * (height // c["patch_size"]) * (width // c["patch_size"])
    return {"video": s["batch"] * video, "audio": s["batch"] * audio, "text": s["batch"] * s["text_tokens"] * 2}


def _ltx2_describe(c: Mapping[str, Any], s: Mapping[str, Any]) -> str:
    frames, height, width, audio = _ltx2_latent_shape(c, s)
    return (f"{s['num_frames']} frames {s['height']}x{s['width']} ({frames}x{height}x{width} latents, "
            f"{audio} audio latents), batch {s['batch']} (CFG), text {s['text_tokens']}")


def _ltx2_rope(c: Mapping[str, Any], modality: str):
    """The transformer's ``rope`` / ``audio_rope`` module as its __init__ builds it (coordinates only)."""
    from diffusers.models.transformers.transformer_ltx2 import LTX2AudioVideoRotaryPosEmbed

    common = dict(theta=c["rope_theta"], causal_offset=c["causal_offset"], modality=modality,
                  double_precision=c["rope_double_precision"], rope_type=c["rope_type"])
    if modality == "video":
        return LTX2AudioVideoRotaryPosEmbed(
            dim=c["num_attention_heads"] * c["attention_head_dim"], patch_size=c["patch_size"],
            patch_size_t=c["patch_size_t"], base_num_frames=c["pos_embed_max_pos"], base_height=c["base_height"],
            base_width=c["base_width"], scale_factors=c["vae_scale_factors"],
            num_attention_heads=c["num_attention_heads"], **common)
    return LTX2AudioVideoRotaryPosEmbed(
        dim=c["audio_num_attention_heads"] * c["audio_attention_head_dim"], patch_size=c["audio_patch_size"],
        patch_size_t=c["audio_patch_size_t"], base_num_frames=c["audio_pos_embed_max_pos"],
        sampling_rate=c["audio_sampling_rate"], hop_length=c["audio_hop_length"],
        scale_factors=[c["audio_scale_factor"]], num_attention_heads=c["audio_num_attention_heads"], **common)


def _ltx2(m: InputMaker, s: Mapping[str, Any]) -> dict[str, Any]:
    """LTX2Pipeline's first (CFG) transformer call of a denoising step (pipeline_ltx2.py, step 7)."""
    c = m.config
    batch, text = s["batch"], s["text_tokens"]
    frames, height, width, audio_frames = _ltx2_latent_shape(c, s)
    video_tokens = _ltx2_tokens(c, s)["video"] // batch
    prompts = batch // 2 if batch % 2 == 0 else batch
    # step 6: coordinates for the un-doubled latents, then repeated for CFG
    video_coords = _ltx2_rope(c, "video").prepare_video_coords(prompts, frames, height, width, m.device,
                                                              fps=s["frame_rate"])
    audio_coords = _ltx2_rope(c, "audio").prepare_audio_coords(prompts, audio_frames, m.device)
    if prompts != batch:
        video_coords = video_coords.repeat((2,) + (1,) * (video_coords.ndim - 1))
        audio_coords = audio_coords.repeat((2,) + (1,) * (audio_coords.ndim - 1))
    timestep = _expanded_timestep(m, s["timestep"], batch)
    # the connectors' output: video and audio text embeddings of caption_channels, and an all-ones int64
    # mask (LTX-2.0's connectors replace padding with learned registers, so every position is valid)
    mask = torch.ones(batch, text, dtype=torch.int64, device=m.device)
    return {
        "hidden_states": m.randn(batch, video_tokens, c["in_channels"]),  # packed [B, F*H*W, C]
        "audio_hidden_states": m.randn(batch, audio_frames, c["audio_in_channels"]),  # packed [B, L, C*mel]
        "encoder_hidden_states": m.randn(batch, text, c["caption_channels"]),
        "audio_encoder_hidden_states": m.randn(batch, text, c["caption_channels"]),
        "timestep": timestep,
        "sigma": timestep,
        "encoder_attention_mask": mask,
        "audio_encoder_attention_mask": mask,
        "num_frames": frames,
        "height": height,
        "width": width,
        "fps": s["frame_rate"],
        "audio_num_frames": audio_frames,
        "video_coords": video_coords,
        "audio_coords": audio_coords,
        "isolate_modalities": False,
        "spatio_temporal_guidance_blocks": None,
        "perturbation_mask": None,
        "use_cross_timestep": True,  # LTX2Pipeline's default (False is "the legacy LTX-2.0 behaviour")
        "attention_kwargs": None,
    }


# -- HunyuanVideo 1.5 (8.3B, 480p text-to-video) -------------------------------------------------------
# hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v: diffusers'
# scripts/convert_hunyuan_video1_5_to_diffusers.py (commit 58eb52c) builds its transformer as
# HunyuanVideo15Transformer3DModel(target_size=640, task_type="i2v") (TRANSFORMER_CONFIGS["480p_t2v"]; task_type is
# read by neither the model nor the t2v pipeline), every other argument the class default, which matches
# tencent/HunyuanVideo-1.5's transformer config (hidden 2048 = 16 heads x 128, 54 double blocks, mlp ratio 4,
# rope (16, 56, 56) theta 256, Qwen2.5-VL 3584, ByT5 1472, SigLIP 1152; in_channels 65 = 32 latents + 32
# condition latents + 1 mask).
HUNYUAN_VIDEO15_FULL = dict(
    in_channels=65, out_channels=32, num_attention_heads=16, attention_head_dim=128, num_layers=54,
    num_refiner_layers=2, mlp_ratio=4.0, patch_size=1, patch_size_t=1, qk_norm="rms_norm", text_embed_dim=3584,
    text_embed_2_dim=1472, image_embed_dim=1152, rope_theta=256.0, rope_axes_dim=(16, 56, 56), target_size=640,
    task_type="i2v", use_meanflow=False,
)
HUNYUAN_VIDEO15_SMALL = dict(HUNYUAN_VIDEO15_FULL, num_attention_heads=2, attention_head_dim=8, num_layers=2,
                             num_refiner_layers=1, text_embed_dim=16, text_embed_2_dim=8, image_embed_dim=12,
                             rope_axes_dim=(2, 2, 4))
# HunyuanVideo15Pipeline: VAE 16x spatial, 4x temporal; Qwen2.5-VL prompt padded to 1000 tokens (after the
# 108-token template crop); ByT5 256 tokens, all-zero with a zero mask for a prompt without quoted text; 729 zero
# SigLIP tokens (t2v). CFG runs through the guider as two batch-1 calls.
HUNYUAN_VIDEO15_SHAPE = dict(batch=1, num_frames=9, height=240, width=416, text_tokens=1000, text_valid=64,
                             glyph_tokens=256, glyph_valid=0, image_tokens=729, timestep=1000.0)
_HV15_SPATIAL, _HV15_TEMPORAL = 16, 4


def _hv15_latent_shape(c: Mapping[str, Any], s: Mapping[str, Any]) -> tuple[int, int, int]:
    return (s["num_frames"] - 1) // _HV15_TEMPORAL + 1, s["height"] // _HV15_SPATIAL, s["width"] // _HV15_SPATIAL


def _hv15_tokens(c: Mapping[str, Any], s: Mapping[str, Any]) -> dict[str, int]:
    frames, height, width = _hv15_latent_shape(c, s)
    video = (frames // c["patch_size_t"]) * (height // c["patch_size"]) * (width // c["patch_size"])
    return {"video": s["batch"] * video,
            "text": s["batch"] * (s["text_tokens"] + s["glyph_tokens"] + s["image_tokens"])}


def _hv15_describe(c: Mapping[str, Any], s: Mapping[str, Any]) -> str:
    frames, height, width = _hv15_latent_shape(c, s)
    return (f"{s['num_frames']} frames {s['height']}x{s['width']} ({frames}x{height}x{width} latents), batch "
            f"{s['batch']} (CFG as 2 calls), text {s['text_tokens']}+{s['glyph_tokens']}+{s['image_tokens']}")


def _hunyuan_video15(m: InputMaker, s: Mapping[str, Any]) -> dict[str, Any]:
    """HunyuanVideo15Pipeline's conditional transformer call (pipeline_hunyuan_video1_5.py, step 7)."""
    c = m.config
    batch = s["batch"]
    frames, height, width = _hv15_latent_shape(c, s)
    latent_channels = c["out_channels"]
    cond_channels = c["in_channels"] - latent_channels - 1
    latents = m.randn(batch, latent_channels, frames, height, width)
    condition = m.zeros(batch, cond_channels, frames, height, width)  # t2v: zero condition latents ...
    mask = m.zeros(batch, 1, frames, height, width)  # ... and a zero mask
    return {
        "hidden_states": torch.cat([latents, condition, mask], dim=1),
        "image_embeds": m.zeros(batch, s["image_tokens"], c["image_embed_dim"]),
        # t.expand(B).to(latent dtype): a contiguous copy in the latents' dtype
        "timestep": _expanded_timestep(m, s["timestep"], batch).to(m.dtype),
        "encoder_hidden_states": m.randn(batch, s["text_tokens"], c["text_embed_dim"]),
        "encoder_attention_mask": m.mask(batch, s["text_tokens"], valid=s["text_valid"]),
        "encoder_hidden_states_2": (m.zeros(batch, s["glyph_tokens"], c["text_embed_2_dim"]) if s["glyph_valid"] == 0
                                    else m.randn(batch, s["glyph_tokens"], c["text_embed_2_dim"])),
        "encoder_attention_mask_2": m.mask(batch, s["glyph_tokens"], valid=s["glyph_valid"]),
        "attention_kwargs": None,
    }


# -- HiDream-I1 (17B, MoE) -------------------------------------------------------------------------------
# HiDream-ai/HiDream-I1-Full transformer config, as written by the diffusers HiDream conversion script
# (hlky/diffusers scripts/convert_hidream_to_diffusers.py, "python ... --original_state_dict_repo_id
# HiDream-ai/HiDream-I1-Full"); the same values are in HiDream-I1-Dev's diffusers config (e.g. the repack
# https://huggingface.co/deAPI-ai/hidreami1dev/blob/main/transformer/config.json, force_inference_output false).
# llama_layers: Llama-3.1-8B hidden states 0-31 for blocks 0-31, then layer 31 for the last 16 blocks.
HIDREAM_FULL = dict(
    patch_size=2, in_channels=16, out_channels=16, num_layers=16, num_single_layers=32, attention_head_dim=128,
    num_attention_heads=20, caption_channels=(4096, 4096), text_emb_dim=2048, num_routed_experts=4,
    num_activated_experts=2, axes_dims_rope=(64, 32, 32), max_resolution=(128, 128),
    llama_layers=tuple(list(range(32)) + [31] * 16), force_inference_output=False,
)
HIDREAM_SMALL = dict(HIDREAM_FULL, num_layers=1, num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
                     caption_channels=(16, 8), text_emb_dim=12, axes_dims_rope=(8, 4, 4), llama_layers=(0, 1, 1))
# HiDreamImagePipeline: VAE 8x; T5 and Llama prompts padded to 128 tokens; pooled = CLIP-L 768 + CLIP-G 1280;
# Llama states stacked as (layers, B, T, D); CFG batches the negative prompt (Llama along dim 1).
HIDREAM_SHAPE = dict(batch=2, height=512, width=512, text_tokens=128, timestep=999.0)
_HIDREAM_VAE = 8


def _hidream_latent_shape(c: Mapping[str, Any], s: Mapping[str, Any]) -> tuple[int, int]:
    return s["height"] // _HIDREAM_VAE, s["width"] // _HIDREAM_VAE


def _hidream_tokens(c: Mapping[str, Any], s: Mapping[str, Any]) -> dict[str, int]:
    height, width = _hidream_latent_shape(c, s)
    image = (height // c["patch_size"]) * (width // c["patch_size"])
    # double blocks: T5 + Llama (last) + Llama (block's layer); single blocks add one more Llama layer each
    return {"image": s["batch"] * image, "text": s["batch"] * 3 * s["text_tokens"]}


def _hidream_describe(c: Mapping[str, Any], s: Mapping[str, Any]) -> str:
    height, width = _hidream_latent_shape(c, s)
    return (f"{s['height']}x{s['width']} ({c['in_channels']}x{height}x{width} latents), batch {s['batch']} (CFG), "
            f"text {s['text_tokens']} T5 + {s['text_tokens']} Llama")


def _hidream(m: InputMaker, s: Mapping[str, Any]) -> dict[str, Any]:
    """HiDreamImagePipeline's transformer call of a denoising step (pipeline_hidream_image.py, step 6)."""
    c = m.config
    batch, text = s["batch"], s["text_tokens"]
    height, width = _hidream_latent_shape(c, s)
    t5_dim, llama_dim = c["caption_channels"]
    llama_layers = max(c["llama_layers"]) + 1  # outputs.hidden_states[1:] of the Llama, stacked
    return {
        "hidden_states": m.randn(batch, c["in_channels"], height, width),
        "timesteps": _expanded_timestep(m, s["timestep"], batch),
        "encoder_hidden_states_t5": m.randn(batch, text, t5_dim),
        "encoder_hidden_states_llama3": m.randn(llama_layers, batch, text, llama_dim),
        "pooled_embeds": m.randn(batch, c["text_emb_dim"]),
        "attention_kwargs": None,
    }


FULL_CASES: dict[str, FullCase] = {
    "ltx2": FullCase(
        name="ltx2", class_name="LTX2VideoTransformer3DModel", checkpoint="Lightricks/LTX-2 (19B)",
        config=LTX2_FULL, small_config=LTX2_SMALL, shape=LTX2_SHAPE, small_shape=dict(text_tokens=64),
        build_inputs=_ltx2, tokens=_ltx2_tokens, describe=_ltx2_describe,
        source="Lightricks/LTX-2 transformer/config.json = diffusers scripts/convert_ltx2_to_diffusers.py (2.0)",
        note="the CFG call (batch 2) with the coords LTX2Pipeline computes before the loop; the pipeline's "
             "default STG and modality-isolation calls (batch 1 each) are not timed"),
    "hunyuanvideo15": FullCase(
        name="hunyuanvideo15", class_name="HunyuanVideo15Transformer3DModel",
        checkpoint="hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v (8.3B)",
        config=HUNYUAN_VIDEO15_FULL, small_config=HUNYUAN_VIDEO15_SMALL, shape=HUNYUAN_VIDEO15_SHAPE,
        small_shape=dict(text_tokens=40, text_valid=12, glyph_tokens=16, image_tokens=9),
        build_inputs=_hunyuan_video15, tokens=_hv15_tokens, describe=_hv15_describe,
        source="diffusers scripts/convert_hunyuan_video1_5_to_diffusers.py TRANSFORMER_CONFIGS['480p_t2v'] + "
               "class defaults (= tencent/HunyuanVideo-1.5 config)",
        note="text-to-video: zero condition latents, mask and SigLIP tokens; 64 valid of 1000 prompt tokens, no "
             "glyph text; every text token still enters all 54 blocks (masked)"),
    "hidream": FullCase(
        name="hidream", class_name="HiDreamImageTransformer2DModel", checkpoint="HiDream-ai/HiDream-I1-Full (17B)",
        config=HIDREAM_FULL, small_config=HIDREAM_SMALL, shape=HIDREAM_SHAPE, small_shape=dict(text_tokens=16),
        build_inputs=_hidream, tokens=_hidream_tokens, describe=_hidream_describe,
        source="HiDream-I1-Full config via the diffusers HiDream conversion script (hlky/diffusers); "
               "= HiDream-I1-Dev diffusers config",
        note="512 px, a launch-bound shape: HiDreamImagePipeline itself rescales every requested size to about "
             "1024x1024 (S_max = 1024^2), so its own calls have 4x the image tokens"),
}


def get_case(name: str) -> FullCase:
    """The case named ``name``; ``ValueError`` naming the known cases otherwise."""
    if name not in FULL_CASES:
        raise ValueError(f"no full-size zoo case {name!r}; the known cases are: {', '.join(FULL_CASES)}")
    return FULL_CASES[name]


def _transformer_class(class_name: str) -> type:
    """The class from ``diffusers`` (imports only its module, unlike the zoo catalog's full scan)."""
    import diffusers

    cls = getattr(diffusers, class_name, None)
    if cls is None:
        raise LookupError(f"diffusers has no class {class_name} (diffusers 0.42.1 has it)")
    return cls


def _fill_zero_parameters(model: torch.nn.Module, seed: int) -> None:
    """Parameters that the class initialises to all zeros get small seeded random values on their own
    device (as :func:`bcg_pipelines.zoo.case._fill_zero_parameters`, without a CPU round trip)."""
    generators: dict[torch.device, torch.Generator] = {}
    with torch.no_grad():
        for param in model.parameters():
            if param.numel() and param.is_floating_point() and not param.any():
                gen = generators.setdefault(param.device, torch.Generator(param.device).manual_seed(seed))
                noise = torch.randn(param.shape, generator=gen, device=param.device, dtype=torch.float32) * 0.02
                param.copy_(noise.to(param.dtype))


def build_model(case: FullCase | str, size: str = "full", device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.nn.Module:
    """The model of ``case`` at ``size`` with random weights, constructed directly on ``device`` in ``dtype``
    (``bcg_pipelines.build``'s way: no CPU initialisation of billions of parameters), seeded, in eval mode with
    gradients off. Parameters left uninitialised by the class start as zeros, and parameters that are all zero
    after init get small random values, so every layer shapes the output. The class's
    ``_keep_in_fp32_modules`` (none of the three has any) are kept in float32 as ``from_pretrained`` does."""
    from ..build import _construct_on, _place

    case = get_case(case) if isinstance(case, str) else case
    config = case.config_for(size)
    cls = _transformer_class(case.class_name)
    device = torch.device(device)
    with _construct_on(device, dtype, seed, f"zoo_full:{case.name}"), _ZeroedEmpty():
        model = cls(**config)
    model = _place(model, device, dtype)
    _keep_fp32_modules(model, dtype)
    _fill_zero_parameters(model, seed + 1)
    return model


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _check_signatures() -> list[str]:
    """Config keys that the installed class does not take (empty on diffusers 0.42.1); for tests."""
    problems = []
    for case in FULL_CASES.values():
        params = inspect.signature(_transformer_class(case.class_name).__init__).parameters
        for size in SIZES:
            problems += [f"{case.name}:{size}:{key}" for key in case.config_for(size) if key not in params]
    return problems


def estimated_parameters(case: FullCase) -> float:
    """Billions of parameters of the full config, counted on the meta device (no memory)."""
    with torch.device("meta"):
        model = _transformer_class(case.class_name)(**case.config_for("full"))
    return parameter_count(model) / 1e9

