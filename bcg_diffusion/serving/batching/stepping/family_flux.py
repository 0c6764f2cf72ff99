"""Flux.1's denoising loop (``FluxPipeline.__call__`` of diffusers 0.42) in prepare / step / finish parts: CLIP
pooled and T5 prompts, packed latents with their position ids, the guidance embedding per row (guidance-distilled
models), true CFG (a second call with the negative prompt, ``true_cfg_scale``) where asked, flow-matching Euler
with the resolution-dependent shift."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from diffusers.pipelines.flux.pipeline_flux import calculate_shift

from .config import StepError
from .loop import FamilyLoop
from .rows import Row, RunningBatch

__all__ = ["FluxLoop"]

TEXT = ("encoder_hidden_states", "pooled_projections")


class FluxLoop(FamilyLoop):
    """Flux.1 (``FluxPipeline``)."""

    pipeline_names = ("FluxPipeline",)
    honoured = frozenset({"negative_prompt", "guidance_scale", "true_cfg_scale", "height", "width",
                          "max_sequence_length"})

    def resolve(self, args: dict[str, Any]) -> None:
        size = self.pipe.default_sample_size * self.pipe.vae_scale_factor
        args.update(height=args["height"] or size, width=args["width"] or size)
        args["cfg"] = args["true_cfg_scale"] > 1 and args["negative_prompt"] is not None
        try:
            self.pipe.check_inputs(args["prompt"], None, args["height"], args["width"],
                                   negative_prompt=args["negative_prompt"],
                                   max_sequence_length=args["max_sequence_length"])
        except ValueError as exc:
            raise StepError(str(exc)) from None

    def key(self, args: dict[str, Any]) -> tuple:
        return ("flux", args["height"], args["width"], args["cfg"], args["max_sequence_length"])

    def guidance(self, args: dict[str, Any]) -> float:
        return float(args["true_cfg_scale"])  # the second call's scale; the distilled guidance is embedded

    def _encode_one(self, text: str, args: dict[str, Any]) -> dict[str, torch.Tensor]:
        embeds, pooled, text_ids = self.pipe.encode_prompt(prompt=self.encode_texts(text), prompt_2=None,
                                                           device=self.device, num_images_per_prompt=1,
                                                           max_sequence_length=args["max_sequence_length"],
                                                           lora_scale=None)
        return {TEXT[0]: self.first(embeds), TEXT[1]: self.first(pooled), "txt_ids": text_ids}

    def encode(self, args: dict[str, Any], with_uncond: bool = True):
        cond = self._encode_one(args["prompt"], args)
        cond["guidance"] = torch.full([1], args["guidance_scale"], device=self.device, dtype=torch.float32)
        uncond = self._encode_one(args["negative_prompt"], args) if args["cfg"] and with_uncond else None
        return cond, uncond

    def initial_latents(self, args, generators, cond) -> torch.Tensor:
        latents, image_ids = self.pipe.prepare_latents(len(generators), self.pipe.transformer.config.in_channels // 4,
                                                       args["height"], args["width"], cond[TEXT[0]].dtype, self.device,
                                                       generators)
        cond["img_ids"] = image_ids
        return latents

    def schedule(self, scheduler, args, latents) -> torch.Tensor:
        steps = args["num_inference_steps"]
        sigmas = None if scheduler.config.get("use_flow_sigmas", False) else np.linspace(1.0, 1 / steps, steps)
        config = scheduler.config
        mu = calculate_shift(latents.shape[1], config.get("base_image_seq_len", 256),
                             config.get("max_image_seq_len", 4096), config.get("base_shift", 0.5),
                             config.get("max_shift", 1.15))
        if sigmas is None:
            scheduler.set_timesteps(steps, device=self.device, mu=mu)
        else:
            scheduler.set_timesteps(sigmas=sigmas, device=self.device, mu=mu)
        scheduler.set_begin_index(0)
        return scheduler.timesteps

    def branch_inputs(self, rows: list[Row], part: str) -> dict[str, Any]:
        inputs = self.joined(rows, part, TEXT)
        first = getattr(rows[0], part)
        inputs.update(txt_ids=first["txt_ids"], img_ids=rows[0].cond["img_ids"])
        if self.pipe.transformer.config.guidance_embeds:
            inputs["guidance"] = torch.cat([r.cond["guidance"] for r in rows])
        else:
            inputs["guidance"] = None
        return inputs

    def predict(self, batch: RunningBatch) -> list[torch.Tensor | None]:
        rows = batch.members()
        latents = self.batch_latents(rows)
        timestep = self.batch_timesteps(rows).to(latents.dtype) / 1000
        cond = batch.assembled("cond", lambda: self.branch_inputs(rows, "cond"))
        with self.pipe.transformer.cache_context("cond"):
            out = self.pipe.transformer(hidden_states=latents, timestep=timestep, joint_attention_kwargs={},
                                        return_dict=False, **cond)[0]
        if batch.filler.uncond is None:
            return self.unguided(batch, out)
        uncond = batch.assembled("uncond", lambda: self.branch_inputs(rows, "uncond"))
        with self.pipe.transformer.cache_context("uncond"):
            neg = self.pipe.transformer(hidden_states=latents, timestep=timestep, joint_attention_kwargs={},
                                        return_dict=False, **uncond)[0]
        return self.guided(batch, neg, out)

    def decode(self, args, latents) -> torch.Tensor:
        vae = self.pipe.vae
        latents = self.pipe._unpack_latents(latents, args["height"], args["width"], self.pipe.vae_scale_factor)
        latents = (latents / vae.config.scaling_factor) + vae.config.shift_factor
        return vae.decode(latents, return_dict=False)[0]
