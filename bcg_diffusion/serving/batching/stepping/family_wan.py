"""Wan 2.1's text-to-video denoising loop (``WanPipeline.__call__`` of diffusers 0.42) in prepare / step / finish
parts: UMT5 prompts, CFG as two calls (conditional, then unconditional), UniPC (multistep: history per video),
float32 latents, the causal 3D VAE decode. Wan 2.2's two experts (``boundary_ratio``) and per-token timesteps
(``expand_timesteps``) are refused."""

from __future__ import annotations

from typing import Any

import torch

from .config import StepError
from .loop import FamilyLoop
from .rows import RunningBatch

__all__ = ["WanLoop"]

TEXT = ("encoder_hidden_states",)


class WanLoop(FamilyLoop):
    """Wan 2.1 text-to-video (``WanPipeline``)."""

    pipeline_names = ("WanPipeline",)
    honoured = frozenset({"negative_prompt", "guidance_scale", "height", "width", "num_frames", "max_sequence_length"})
    count_key = "num_videos_per_prompt"

    def resolve(self, args: dict[str, Any]) -> None:
        pipe = self.pipe
        if pipe.config.boundary_ratio is not None or pipe.config.expand_timesteps or pipe.transformer is None:
            raise StepError("step batching runs Wan 2.1 (one transformer, one timestep per video); this pipeline has "
                            "Wan 2.2's two experts or per-token timesteps")
        try:
            pipe.check_inputs(args["prompt"], args["negative_prompt"], args["height"], args["width"])
        except ValueError as exc:
            raise StepError(str(exc)) from None
        frames, temporal = args["num_frames"], pipe.vae_scale_factor_temporal
        if frames % temporal != 1:
            frames = frames // temporal * temporal + 1
        patch = pipe.transformer.config.patch_size
        height_multiple, width_multiple = pipe.vae_scale_factor_spatial * patch[1], pipe.vae_scale_factor_spatial * patch[2]
        args.update(num_frames=max(frames, 1), height=args["height"] // height_multiple * height_multiple,
                    width=args["width"] // width_multiple * width_multiple, cfg=args["guidance_scale"] > 1.0)

    def key(self, args: dict[str, Any]) -> tuple:
        return ("wan", args["height"], args["width"], args["num_frames"], args["cfg"], args["max_sequence_length"])

    def encode(self, args: dict[str, Any], with_uncond: bool = True):
        cfg = args["cfg"] and with_uncond
        embeds, neg_embeds = self.pipe.encode_prompt(prompt=self.encode_texts(args["prompt"]),
                                                     negative_prompt=self.encode_texts(args["negative_prompt"]),
                                                     do_classifier_free_guidance=cfg, num_videos_per_prompt=1,
                                                     max_sequence_length=args["max_sequence_length"], device=self.device)
        dtype = self.pipe.transformer.dtype
        cond = {TEXT[0]: self.first(embeds).to(dtype)}
        uncond = {TEXT[0]: self.first(neg_embeds).to(dtype)} if cfg else None
        return cond, uncond

    def initial_latents(self, args, generators, cond) -> torch.Tensor:
        return self.pipe.prepare_latents(len(generators), self.pipe.transformer.config.in_channels, args["height"],
                                         args["width"], args["num_frames"], torch.float32, self.device, generators)

    def schedule(self, scheduler, args, latents) -> torch.Tensor:
        scheduler.set_timesteps(args["num_inference_steps"], device=self.device)
        scheduler.set_begin_index(0)
        return scheduler.timesteps

    def predict(self, batch: RunningBatch) -> list[torch.Tensor | None]:
        rows = batch.members()
        transformer = self.pipe.transformer
        latents = self.batch_latents(rows).to(transformer.dtype)
        timestep = self.batch_timesteps(rows)
        cond = batch.assembled("cond", lambda: self.joined(rows, "cond", TEXT))
        with transformer.cache_context("cond"):
            out = transformer(hidden_states=latents, timestep=timestep, attention_kwargs=None, return_dict=False,
                              **cond)[0]
        if batch.filler.uncond is None:
            return self.unguided(batch, out)
        uncond = batch.assembled("uncond", lambda: self.joined(rows, "uncond", TEXT))
        with transformer.cache_context("uncond"):
            neg = transformer(hidden_states=latents, timestep=timestep, attention_kwargs=None, return_dict=False,
                              **uncond)[0]
        return self.guided(batch, neg, out)

    def decode(self, args, latents) -> torch.Tensor:
        vae = self.pipe.vae
        latents = latents.to(vae.dtype)
        mean = torch.tensor(vae.config.latents_mean).view(1, vae.config.z_dim, 1, 1, 1).to(latents.device, latents.dtype)
        std = 1.0 / torch.tensor(vae.config.latents_std).view(1, vae.config.z_dim, 1, 1, 1).to(latents.device,
                                                                                              latents.dtype)
        return vae.decode(latents / std + mean, return_dict=False)[0]

    def postprocess(self, args: dict[str, Any], decoded: torch.Tensor) -> list[Any]:
        return list(self.pipe.video_processor.postprocess_video(decoded, output_type=args["output_type"]))
