"""Sana's denoising loop (``SanaPipeline.__call__`` of diffusers 0.42) in prepare / step / finish parts: Gemma
prompts (with the pipeline's complex human instruction) and masks, CFG as one batch, float32 latents, the
timestep scale, the DC-AE decode, resolution binning."""

from __future__ import annotations

from typing import Any

import torch
from diffusers.pipelines.pixart_alpha.pipeline_pixart_alpha import ASPECT_RATIO_512_BIN, ASPECT_RATIO_1024_BIN
from diffusers.pipelines.pixart_alpha.pipeline_pixart_sigma import ASPECT_RATIO_2048_BIN
from diffusers.pipelines.sana.pipeline_sana import ASPECT_RATIO_4096_BIN

from .family_pixart import TEXT, MaskedTextLoop
from .rows import Row

__all__ = ["SanaLoop"]


class SanaLoop(MaskedTextLoop):
    """Sana (``SanaPipeline``)."""

    pipeline_names = ("SanaPipeline",)
    honoured = frozenset({"negative_prompt", "guidance_scale", "height", "width", "eta", "clean_caption",
                          "use_resolution_binning", "max_sequence_length", "complex_human_instruction"})
    bins = {128: ASPECT_RATIO_4096_BIN, 64: ASPECT_RATIO_2048_BIN, 32: ASPECT_RATIO_1024_BIN, 16: ASPECT_RATIO_512_BIN}

    def check_inputs(self, args: dict[str, Any]) -> None:
        self.pipe.check_inputs(args["prompt"], args["height"], args["width"], None, args["negative_prompt"])

    def encode_prompt(self, args: dict[str, Any], cfg: bool):
        return self.pipe.encode_prompt(self.encode_texts(args["prompt"]), cfg,
                                       negative_prompt=self.encode_texts(args["negative_prompt"]),
                                       num_images_per_prompt=1, device=self.device, clean_caption=args["clean_caption"],
                                       max_sequence_length=args["max_sequence_length"],
                                       complex_human_instruction=args["complex_human_instruction"], lora_scale=None)

    def initial_latents(self, args, generators, cond) -> torch.Tensor:
        return self.pipe.prepare_latents(len(generators), self.pipe.transformer.config.in_channels, args["height"],
                                         args["width"], torch.float32, self.device, generators)

    def schedule(self, scheduler, args, latents) -> torch.Tensor:
        scheduler.set_timesteps(args["num_inference_steps"], device=self.device)
        return scheduler.timesteps

    def model_input(self, rows: list[Row]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.batch_latents(rows), self.batch_timesteps(rows)

    def transformer_call(self, latents, timesteps, text) -> torch.Tensor:
        transformer = self.pipe.transformer
        dtype = transformer.dtype
        out = transformer(latents.to(dtype=dtype), encoder_hidden_states=text[TEXT[0]].to(dtype=dtype),
                          encoder_attention_mask=text[TEXT[1]], timestep=timesteps * transformer.config.timestep_scale,
                          return_dict=False, attention_kwargs=None)[0]
        return out.float()

    def decode(self, args, latents) -> torch.Tensor:
        vae = self.pipe.vae
        latents = latents.to(vae.dtype)
        return vae.decode(latents / vae.config.scaling_factor, return_dict=False)[0]
