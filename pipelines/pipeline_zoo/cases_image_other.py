"""Pipeline zoo cases of image pipelines outside the known families: AuraFlow, CogView 3/4, DiT, Hunyuan-DiT, Bria,
aMUSEd, VQ-Diffusion, Ovis-Image and HiDream-I1.

Transformers take the transformer zoo's tiny configs (:mod:`bcg_pipelines.zoo`) where their text and latent widths fit
the tiny encoders (32 wide) and VAEs built here; the others are written here with the same sizes. Images are 64 px.
"""

from __future__ import annotations

from typing import Any

import torch

from ..zoo import cases_image as zoo_image
from .case import PipelineCase
from .media import Media
from .parts import Parts

__all__ = ["CASES"]

SIZE = 64
PROMPT = "a red fox in the snow"


def _t5(parts: Parts, name: str = "text_encoder", tokenizer: str = "tokenizer", kind: str = "t5",
        max_length: int = 512) -> dict[str, Any]:
    tok = parts.tokenizer("t5", max_length)
    return {tokenizer: tok, name: parts.text_encoder(name, kind, f"{kind}_tiny", tok)}


def _clip(parts: Parts, name: str = "text_encoder", tokenizer: str = "tokenizer", projection: bool = False,
          **overrides: Any) -> dict[str, Any]:
    tok = parts.tokenizer("clip", 77)
    kind = "clip_proj" if projection else "clip"
    return {tokenizer: tok, name: parts.text_encoder(name, kind, "clip_tiny", tok, **overrides)}


def _text(**extra: Any) -> dict[str, Any]:
    return {"prompt": PROMPT, "negative_prompt": "blurry", "height": SIZE, "width": SIZE, "output_type": "latent",
            **extra}


# -- AuraFlow, Bria, CogView ---------------------------------------------------------------------------------
def _auraflow(parts: Parts) -> dict[str, Any]:
    return {**_t5(parts, kind="umt5"), "vae": parts.kl_vae(4),
            "transformer": parts.model("transformer", "AuraFlowTransformer2DModel", zoo_image.AURAFLOW),
            "scheduler": parts.scheduler("FlowMatchEulerDiscreteScheduler")}


def _bria(parts: Parts) -> dict[str, Any]:
    return {**_t5(parts), "vae": parts.kl_vae(4),
            "transformer": parts.model("transformer", "BriaTransformer2DModel", zoo_image.BRIA),
            "scheduler": parts.scheduler("FlowMatchEulerDiscreteScheduler")}


def _cogview3(parts: Parts) -> dict[str, Any]:
    config = dict(zoo_image.COGVIEW3PLUS, text_embed_dim=32)
    return {**_t5(parts), "vae": parts.kl_vae(4),
            "transformer": parts.model("transformer", "CogView3PlusTransformer2DModel", config),
            "scheduler": parts.scheduler("CogVideoXDDIMScheduler", timestep_spacing="trailing")}


def _cogview4(parts: Parts, in_channels: int = 4) -> dict[str, Any]:
    tokenizer = parts.tokenizer("qwen2", 1024)
    text_encoder = parts.language_model(
        "text_encoder", "GlmModel", "GlmConfig", tokenizer, hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    config = dict(zoo_image.COGVIEW4, text_embed_dim=32, in_channels=in_channels, out_channels=4)
    return {"tokenizer": tokenizer, "text_encoder": text_encoder, "vae": parts.kl_vae(4),
            "transformer": parts.model("transformer", "CogView4Transformer2DModel", config),
            "scheduler": parts.scheduler("FlowMatchEulerDiscreteScheduler", base_shift=0.25, max_shift=0.75,
                                         base_image_seq_len=256, use_dynamic_shifting=True,
                                         time_shift_type="linear")}


# -- DiT, Hunyuan-DiT ------------------------------------------------------------------------------------------
def _dit(parts: Parts) -> dict[str, Any]:
    return {"transformer": parts.model("transformer", "DiTTransformer2DModel", zoo_image.DIT), "vae": parts.kl_vae(4),
            "scheduler": parts.scheduler("DPMSolverMultistepScheduler"), "id2label": {0: "fox", 1: "cat"}}


HUNYUAN_DIT = dict(sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8,
                   num_attention_heads=2, cross_attention_dim=32, cross_attention_dim_t5=32, pooled_projection_dim=16,
                   hidden_size=16, text_len=77, text_len_t5=256, activation_fn="gelu-approximate")


def _hunyuan_dit(parts: Parts, controlnet: bool = False) -> dict[str, Any]:
    bert = parts.bert_tokenizer(77)
    components = {"tokenizer": bert,
                  "text_encoder": parts.transformers_model(
                      "text_encoder", "BertModel", "BertConfig", vocab_size=len(bert), hidden_size=32,
                      intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=128,
                      pad_token_id=bert.pad_token_id),
                  **_t5(parts, "text_encoder_2", "tokenizer_2", max_length=256), "vae": parts.kl_vae(4),
                  "transformer": parts.model("transformer", "HunyuanDiT2DModel", HUNYUAN_DIT),
                  "scheduler": parts.scheduler("DDPMScheduler"), "safety_checker": None, "feature_extractor": None,
                  "requires_safety_checker": False}
    if controlnet:
        config = {k: v for k, v in HUNYUAN_DIT.items() if k != "num_layers"} | {"transformer_num_layers": 2}
        components["controlnet"] = parts.model("controlnet", "HunyuanDiT2DControlNetModel", config)
    return components


def _hunyuan_dit_call(**extra: Any) -> dict[str, Any]:
    return _text(guidance_scale=5.0, use_resolution_binning=False, original_size=(SIZE, SIZE), **extra)


# -- aMUSEd, VQ-Diffusion ----------------------------------------------------------------------------------------
def _vq(parts: Parts, embeddings: int = 8, **config: Any) -> Any:
    settings = dict(act_fn="silu", block_out_channels=[8], down_block_types=["DownEncoderBlock2D"], in_channels=3,
                    latent_channels=8, layers_per_block=1, norm_num_groups=8, num_vq_embeddings=embeddings,
                    out_channels=3, sample_size=8, up_block_types=["UpDecoderBlock2D"], mid_block_add_attention=False,
                    lookup_from_codebook=True) | config
    return parts.vae("VQModel", settings, name="vqvae")


def _amused(parts: Parts) -> dict[str, Any]:
    # an 8-entry codebook (vocabulary 9: the mask token last) over 8x8 px tokens of a 64 px image
    uvit = dict(hidden_size=32, use_bias=False, hidden_dropout=0.0, cond_embed_dim=32, micro_cond_encode_dim=2,
                micro_cond_embed_dim=10, encoder_hidden_size=32, vocab_size=9, codebook_size=8, in_channels=16,
                block_out_channels=16, num_res_blocks=1, downsample=True, upsample=True, block_num_heads=1,
                num_hidden_layers=1, num_attention_heads=2, attention_dropout=0.0, intermediate_size=32,
                layer_norm_eps=1e-6, ln_elementwise_affine=True)
    return {**_clip(parts, projection=True), "vqvae": _vq(parts),
            "transformer": parts.model("transformer", "UVit2DModel", uvit),
            "scheduler": parts.scheduler("AmusedScheduler", mask_token_id=8)}


def _amused_call(sized: bool = True, **extra: Any) -> dict[str, Any]:
    call = _text(guidance_scale=10.0, **extra)
    del call["output_type"]
    if not sized:  # image-to-image classes take the image's size
        del call["height"], call["width"]
    return call


def _vq_diffusion(parts: Parts) -> dict[str, Any]:
    classes = 8 + 1  # the codebook and the masked class
    transformer = dict(attention_bias=True, cross_attention_dim=32, attention_head_dim=8, num_attention_heads=2,
                       num_vector_embeds=classes, num_embeds_ada_norm=100, norm_num_groups=8, sample_size=8,
                       num_layers=1, activation_fn="geglu-approximate")
    return {**_clip(parts), "vqvae": _vq(parts, lookup_from_codebook=False, vq_embed_dim=8),
            "transformer": parts.model("transformer", "Transformer2DModel", transformer),
            "scheduler": parts.scheduler("VQDiffusionScheduler", num_vec_classes=classes),
            "learned_classifier_free_sampling_embeddings": parts.model(
                "embeddings", _learned_embeddings(), dict(learnable=True, hidden_size=32, length=77))}


def _learned_embeddings() -> type:
    from diffusers.pipelines.deprecated.vq_diffusion.pipeline_vq_diffusion import (
        LearnedClassifierFreeSamplingEmbeddings,
    )

    return LearnedClassifierFreeSamplingEmbeddings


# -- Ovis-Image, HiDream ---------------------------------------------------------------------------------
def _ovis(parts: Parts) -> dict[str, Any]:
    tokenizer = parts.tokenizer("qwen3", 32768)
    text_encoder = parts.text_encoder("text_encoder", "qwen3", "qwen3_tiny", tokenizer)
    return {"tokenizer": tokenizer, "text_encoder": text_encoder, "vae": parts.kl_vae(4),
            "transformer": parts.model("transformer", "OvisImageTransformer2DModel", dict(zoo_image.OVIS)),
            "scheduler": parts.scheduler("FlowMatchEulerDiscreteScheduler")}


def _hidream(parts: Parts) -> dict[str, Any]:
    llama = parts.tokenizer("llama3", 128)
    config = dict(zoo_image.HIDREAM, caption_channels=[32, 32], text_emb_dim=64, llama_layers=(0, 1))
    return {**_clip(parts, projection=True), **_clip(parts, "text_encoder_2", "tokenizer_2", projection=True),
            **_t5(parts, "text_encoder_3", "tokenizer_3"), "tokenizer_4": llama,
            "text_encoder_4": parts.language_model(
                "text_encoder_4", "LlamaForCausalLM", "LlamaConfig", llama, hidden_size=32, intermediate_size=64,
                num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1),
            "vae": parts.kl_vae(4), "transformer": parts.model("transformer", "HiDreamImageTransformer2DModel", config),
            "scheduler": parts.scheduler("FlowMatchEulerDiscreteScheduler")}


def _hidream_size(pipe) -> None:
    # HiDream rescales every request to default_sample_size ** 2 latents (128: 1024 px); 8 latents: 64 px
    pipe.default_sample_size = SIZE // pipe.vae_scale_factor


CASES: list[PipelineCase] = [
    PipelineCase("AuraFlowPipeline", _auraflow, lambda m: _text(guidance_scale=3.5, max_sequence_length=32),
                 note="batched CFG"),
    PipelineCase("BriaPipeline", _bria, lambda m: _text(guidance_scale=5.0, max_sequence_length=32),
                 note="Flux-like packed latents, batched CFG"),
    PipelineCase("CogView3PlusPipeline", _cogview3, lambda m: _text(guidance_scale=5.0, max_sequence_length=32),
                 group="cogview3"),
    PipelineCase("CogView4Pipeline", _cogview4, lambda m: _text(guidance_scale=5.0, max_sequence_length=32),
                 note="two calls per step (CFG)"),
    PipelineCase("CogView4ControlPipeline", lambda p: _cogview4(p, in_channels=8),
                 lambda m: _text(guidance_scale=5.0, max_sequence_length=32, control_image=m.control(SIZE, SIZE)),
                 note="the control image's latents on channels"),
    PipelineCase("DiTPipeline", _dit, lambda m: {"class_labels": [1], "guidance_scale": 4.0, "output_type": "np"},
                 two_outputs=lambda call: {**call, "class_labels": [1, 0]},
                 note="class-conditional, batched CFG; two outputs are two class labels"),
    PipelineCase("HunyuanDiTPipeline", _hunyuan_dit, lambda m: _hunyuan_dit_call(), group="hunyuandit",
                 note="BERT and T5 text, batched CFG, rotary tables built per call"),
    PipelineCase("HunyuanDiTPAGPipeline", _hunyuan_dit, lambda m: _hunyuan_dit_call(pag_scale=3.0),
                 group="hunyuandit"),
    PipelineCase("HunyuanDiTControlNetPipeline", lambda p: _hunyuan_dit(p, controlnet=True),
                 lambda m: _hunyuan_dit_call(control_image=m.control(SIZE, SIZE)), group="hunyuandit"),
    PipelineCase("AmusedPipeline", _amused, lambda m: _amused_call(), group="amused",
                 note="masked token generation (UVit2DModel over VQ codes)"),
    PipelineCase("AmusedImg2ImgPipeline", _amused, lambda m: _amused_call(False, image=m.image(SIZE, SIZE), strength=0.5,
                                                                         num_inference_steps=4), group="amused"),
    PipelineCase("AmusedInpaintPipeline", _amused, lambda m: _amused_call(False, image=m.image(SIZE, SIZE),
                                                                         mask_image=m.mask(SIZE, SIZE)),
                 group="amused"),
    PipelineCase("VQDiffusionPipeline", _vq_diffusion, lambda m: {"prompt": PROMPT, "output_type": "np"},
                 group="vq_diffusion", dtype=torch.float32,
                 note="discrete diffusion over VQ codes, learned CFG embeddings; float32: its __call__ turns the "
                 "decoded image into numpy, which has no bfloat16 (TypeError: Got unsupported ScalarType BFloat16), "
                 "and has no latent output"),
    PipelineCase("OvisImagePipeline", _ovis, lambda m: _text(guidance_scale=5.0, max_sequence_length=32),
                 group="ovis_image"),
    PipelineCase("HiDreamImagePipeline", _hidream, lambda m: _text(guidance_scale=5.0, max_sequence_length=32),
                 group="hidream_image", setup=_hidream_size,
                 note="CLIP-L, CLIP-G, T5 and Llama text; MoE feed-forwards; default_sample_size 8 (64 px)"),
]
