"""Pipeline zoo cases of pipelines whose text encoder is a vision-language model with a Qwen2-VL processor:
Kandinsky 5 and 6 (Qwen2.5-VL and CLIP) and LongCat-Image (Qwen2.5-VL).

The tokenizer is the local Qwen tokenizer with Qwen's vision tokens, the processor a Qwen2-VL one over it (see
:meth:`~bcg_pipelines.pipeline_zoo.parts.Parts.vl_processor`), the encoder a Qwen2.5-VL of width 32 whose vision
token ids match.
"""

from __future__ import annotations

from typing import Any

from ..zoo import cases_video as zoo_video
from .case import PipelineCase
from .media import Media
from .parts import QWEN_VL_CHAT_TEMPLATE, Parts

__all__ = ["CASES"]

PROMPT = "a red fox in the snow"


def _qwen_vl(parts: Parts) -> tuple[Any, Any, Any]:
    tokenizer = parts.vl_tokenizer("qwen2")
    tokenizer.chat_template = QWEN_VL_CHAT_TEMPLATE
    return tokenizer, parts.vl_processor(tokenizer), parts.qwen25_vl("text_encoder", tokenizer)


# -- Kandinsky 5 ------------------------------------------------------------------------------------------------
def _kandinsky5(parts: Parts, video: bool, visual_cond: bool = False) -> dict[str, Any]:
    _, processor, text_encoder = _qwen_vl(parts)
    clip_tokenizer = parts.tokenizer("clip", 77)
    vae = parts.family("hunyuanvideo")["vae"] if video else parts.kl_vae(16)
    config = dict(zoo_video.KANDINSKY5, in_text_dim=32, in_text_dim2=32, visual_cond=visual_cond)
    return {"tokenizer": processor, "text_encoder": text_encoder, "tokenizer_2": clip_tokenizer,
            "text_encoder_2": parts.text_encoder("text_encoder_2", "clip", "clip_tiny", clip_tokenizer),
            "vae": vae, "transformer": parts.model("transformer", "Kandinsky5Transformer3DModel", config),
            "scheduler": parts.scheduler("FlowMatchEulerDiscreteScheduler", shift=5.0)}


def _k5_call(size: int = 64, **extra: Any) -> dict[str, Any]:
    return {"prompt": PROMPT, "negative_prompt": "blurry", "height": size, "width": size, "guidance_scale": 5.0,
            "max_sequence_length": 32, "output_type": "latent", **extra}


def _k5_sizes(pipe) -> None:
    # the image pipelines snap every request to their list of resolutions (640-1408 px)
    pipe.resolutions = [(64, 64)]


# -- LongCat-Image ------------------------------------------------------------------------------------------------
def _longcat(parts: Parts) -> dict[str, Any]:
    tokenizer, processor, text_encoder = _qwen_vl(parts)
    from ..zoo import cases_image as zoo_image

    # the pipelines hard-code 16 latent channels (the Flux VAE's, with its shift and scale): 64 packed channels
    vae = parts.kl_vae(16, scaling_factor=0.3611, shift_factor=0.1159)
    config = dict(zoo_image.LONGCAT_IMAGE, in_channels=64)
    return {"tokenizer": tokenizer, "text_processor": processor, "text_encoder": text_encoder, "vae": vae,
            "transformer": parts.model("transformer", "LongCatImageTransformer2DModel", config),
            "scheduler": parts.scheduler("FlowMatchEulerDiscreteScheduler")}


CASES: list[PipelineCase] = [
    PipelineCase("Kandinsky5T2IPipeline", lambda p: _kandinsky5(p, False), lambda m: _k5_call(), setup=_k5_sizes,
                 note="Qwen2.5-VL and CLIP text, two calls per step (CFG); resolutions [(64, 64)]"),
    PipelineCase("Kandinsky5I2IPipeline", lambda p: _kandinsky5(p, False, visual_cond=True),
                 lambda m: _k5_call(image=m.image(64, 64), max_sequence_length=256), setup=_k5_sizes,
                 note="the image's latents and a mask as visual condition, the image through the VL encoder"),
    PipelineCase("Kandinsky5T2VPipeline", lambda p: _kandinsky5(p, True), lambda m: _k5_call(32, num_frames=5)),
    # 17 frames: after the loop the first 4 latent frames are renormalised to the next ones (NaN with fewer than 5)
    PipelineCase("Kandinsky5I2VPipeline", lambda p: _kandinsky5(p, True, visual_cond=True),
                 lambda m: _k5_call(32, num_frames=17, image=m.image(32, 32)),
                 note="17 frames (5 latent frames: the first 4 are renormalised to the following ones)"),
    PipelineCase("LongCatImagePipeline", _longcat,
                 lambda m: {"prompt": PROMPT, "negative_prompt": "blurry", "height": 64, "width": 64,
                            "guidance_scale": 4.5, "enable_prompt_rewrite": False, "output_type": "latent"},
                 note="the prompt's characters in quotes tokenized one by one; CFG renormalisation"),
    PipelineCase("LongCatImageEditPipeline", _longcat,
                 lambda m: {"prompt": PROMPT, "negative_prompt": "blurry", "image": m.image(64, 64),
                            "guidance_scale": 4.5, "output_type": "latent"},
                 note="the image through the VL encoder and as latent tokens"),
]


# -- Kandinsky 6 (text/image to video and audio) ---------------------------------------------------------------------
def _kandinsky6(parts: Parts) -> dict[str, Any]:
    components = _kandinsky5(parts, True)  # the same text encoders and HunyuanVideo VAE
    config = dict(zoo_video.KANDINSKY6, in_visual_dim=16, out_visual_dim=16, in_text_dim=32, in_text_dim2=32,
                  visual_cond=True, visual_token_type_num_embeddings=2)
    components["transformer"] = parts.model("transformer", "Kandinsky6Transformer3DModel", config)
    return components


CASES += [
    PipelineCase("Kandinsky6TI2VAPipeline", _kandinsky6,
                 lambda m: _k5_call(32, num_frames=5, image=m.image(32, 32), sample_audio=False),
                 note="image-conditioned video; the audio stream off (its MMAudio VAE and vocoder are optional)"),
]
