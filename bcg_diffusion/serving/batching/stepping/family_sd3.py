"""Stable Diffusion 3 / 3.5's denoising loop (``StableDiffusion3Pipeline.__call__`` of diffusers 0.42) in prepare /
step / finish parts: CLIP-L, CLIP-G and T5 prompts with pooled projections, CFG as one batch (unconditional rows
first), flow-matching Euler (with the resolution-dependent shift where the scheduler asks for it)."""

from __future__ import annotations

from typing import Any

import torch
from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import calculate_shift

from .config import StepError
from .loop import FamilyLoop
from .rows import RunningBatch

__all__ = ["SD3Loop"]

TEXT = ("encoder_hidden_states", "pooled_projections")


class SD3Loop(FamilyLoop):
    """SD3 and SD3.5 (``StableDiffusion3Pipeline``)."""

    pipeline_names = ("StableDiffusion3Pipeline",)
    honoured = frozenset({"negative_prompt", "guidance_scale", "height", "width", "max_sequence_length"})

    def resolve(self, args: dict[str, Any]) -> None:
        size = self.pipe.default_sample_size * self.pipe.vae_scale_factor
        args.update(height=args["height"] or size, width=args["width"] or size, cfg=args["guidance_scale"] > 1)
        try:
            self.pipe.check_inputs(args["prompt"], None, None, args["height"], args["width"],
                                   negative_prompt=args["negative_prompt"],
                                   max_sequence_length=args["max_sequence_length"])
        except ValueError as exc:
            raise StepError(str(exc)) from None

    def key(self, args: dict[str, Any]) -> tuple:
        return ("sd3", args["height"], args["width"], args["cfg"], args["max_sequence_length"])

    def encode(self, args: dict[str, Any], with_uncond: bool = True):
        cfg = args["cfg"] and with_uncond
        embeds, neg_embeds, pooled, neg_pooled = self.pipe.encode_prompt(
            prompt=self.encode_texts(args["prompt"]), prompt_2=None, prompt_3=None,
            negative_prompt=self.encode_texts(args["negative_prompt"]), do_classifier_free_guidance=cfg,
            device=self.device, clip_skip=None, num_images_per_prompt=1,
            max_sequence_length=args["max_sequence_length"], lora_scale=None)
        cond = {TEXT[0]: self.first(embeds), TEXT[1]: self.first(pooled)}
        uncond = {TEXT[0]: self.first(neg_embeds), TEXT[1]: self.first(neg_pooled)} if cfg else None
        return cond, uncond

    def initial_latents(self, args, generators, cond) -> torch.Tensor:
        return self.pipe.prepare_latents(len(generators), self.pipe.transformer.config.in_channels, args["height"],
                                         args["width"], cond[TEXT[0]].dtype, self.device, generators)

    def schedule(self, scheduler, args, latents) -> torch.Tensor:
        kwargs = {}
        if scheduler.config.get("use_dynamic_shifting", None):
            patch = self.pipe.transformer.config.patch_size
            seq_len = (latents.shape[2] // patch) * (latents.shape[3] // patch)
            config = scheduler.config
            kwargs["mu"] = calculate_shift(seq_len, config.get("base_image_seq_len", 256),
                                           config.get("max_image_seq_len", 4096), config.get("base_shift", 0.5),
                                           config.get("max_shift", 1.16))
        scheduler.set_timesteps(args["num_inference_steps"], device=self.device, **kwargs)
        return scheduler.timesteps

    def predict(self, batch: RunningBatch) -> list[torch.Tensor | None]:
        rows = batch.members()
        cfg = batch.filler.uncond is not None
        text = batch.assembled("text", lambda: self.text_inputs(rows, TEXT, cfg))
        latents, timesteps = self.batch_latents(rows), self.batch_timesteps(rows)
        if cfg:
            latents, timesteps = torch.cat([latents, latents]), torch.cat([timesteps, timesteps])
        out = self.pipe.transformer(hidden_states=latents, timestep=timesteps, joint_attention_kwargs=None,
                                    return_dict=False, **text)[0]
        if not cfg:
            return self.unguided(batch, out)
        uncond, cond = out.chunk(2)
        return self.guided(batch, uncond, cond)

    def decode(self, args, latents) -> torch.Tensor:
        vae = self.pipe.vae
        return vae.decode((latents / vae.config.scaling_factor) + vae.config.shift_factor, return_dict=False)[0]
