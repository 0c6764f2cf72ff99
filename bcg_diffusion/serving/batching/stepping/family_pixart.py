"""PixArt-Sigma's denoising loop (``PixArtSigmaPipeline.__call__`` of diffusers 0.42) in prepare / step / finish
parts: a T5 prompt with its attention mask, classifier-free guidance as one batch (unconditional rows first),
DPM-Solver++ (multistep: history per image), the learned-sigma channels dropped, resolution binning."""

from __future__ import annotations

from typing import Any

import torch
from diffusers.pipelines.pixart_alpha.pipeline_pixart_alpha import (
    ASPECT_RATIO_256_BIN,
    ASPECT_RATIO_512_BIN,
    ASPECT_RATIO_1024_BIN,
)
from diffusers.pipelines.pixart_alpha.pipeline_pixart_sigma import ASPECT_RATIO_2048_BIN

from .config import StepError
from .loop import FamilyLoop
from .rows import Row, RunningBatch

__all__ = ["MaskedTextLoop", "PixArtLoop"]

TEXT = ("encoder_hidden_states", "encoder_attention_mask")


class MaskedTextLoop(FamilyLoop):
    """What PixArt-Sigma and Sana share: one masked text encoding per branch, CFG batched as
    ``[unconditional rows, conditional rows]``, learned-sigma channels, resolution binning by sample size."""

    bins: dict[int, dict] = {}

    def resolve(self, args: dict[str, Any]) -> None:
        config = self.pipe.transformer.config
        height = args["height"] or config.sample_size * self.pipe.vae_scale_factor
        width = args["width"] or config.sample_size * self.pipe.vae_scale_factor
        args["orig_size"] = (height, width)
        if args["use_resolution_binning"]:
            if config.sample_size not in self.bins:
                raise StepError(f"resolution binning knows no bins for sample size {config.sample_size}")
            height, width = self.pipe.image_processor.classify_height_width_bin(height, width,
                                                                                ratios=self.bins[config.sample_size])
        args.update(height=height, width=width, cfg=args["guidance_scale"] > 1.0)
        try:
            self.check_inputs(args)
        except ValueError as exc:
            raise StepError(str(exc)) from None

    def key(self, args: dict[str, Any]) -> tuple:
        return (type(self).__name__, args["height"], args["width"], args["cfg"], args["max_sequence_length"])

    #: What a negative prompt's encoding reads besides the text encoders (:meth:`FamilyLoop.uncond_key`).
    uncond_args = ("negative_prompt", "max_sequence_length", "clean_caption")

    def encode(self, args: dict[str, Any], with_uncond: bool = True):
        cfg = args["cfg"] and with_uncond
        embeds, mask, neg_embeds, neg_mask = self.encode_prompt(args, cfg)
        cond = {TEXT[0]: self.first(embeds), TEXT[1]: self.first(mask)}
        uncond = {TEXT[0]: self.first(neg_embeds), TEXT[1]: self.first(neg_mask)} if cfg else None
        return cond, uncond

    def step_kwargs(self, scheduler, generator, args: dict[str, Any]) -> dict[str, Any]:
        return self.pipe.prepare_extra_step_kwargs(generator, args["eta"])

    def predict(self, batch: RunningBatch) -> list[torch.Tensor | None]:
        rows = batch.members()
        cfg = batch.filler.uncond is not None
        text = batch.assembled("text", lambda: self.text_inputs(rows, TEXT, cfg))
        latents, timesteps = self.model_input(rows)
        if cfg:
            latents, timesteps = torch.cat([latents, latents]), torch.cat([timesteps, timesteps])
        out = self.transformer_call(latents, timesteps, text)
        learned_sigma = self.pipe.transformer.config.out_channels // 2 == self.pipe.transformer.config.in_channels
        after = (lambda pred: pred.chunk(2, dim=1)[0]) if learned_sigma else None
        if not cfg:
            return self.unguided(batch, out, after)
        uncond, cond = out.chunk(2)
        return self.guided(batch, uncond, cond, after)

    def postprocess(self, args: dict[str, Any], decoded: torch.Tensor) -> list[Any]:
        if args["use_resolution_binning"]:
            height, width = args["orig_size"]
            decoded = self.pipe.image_processor.resize_and_crop_tensor(decoded, width, height)
        return super().postprocess(args, decoded)


class PixArtLoop(MaskedTextLoop):
    """PixArt-Sigma (``PixArtSigmaPipeline``)."""

    pipeline_names = ("PixArtSigmaPipeline",)
    honoured = frozenset({"negative_prompt", "guidance_scale", "height", "width", "eta", "clean_caption",
                          "use_resolution_binning", "max_sequence_length"})
    bins = {256: ASPECT_RATIO_2048_BIN, 128: ASPECT_RATIO_1024_BIN, 64: ASPECT_RATIO_512_BIN, 32: ASPECT_RATIO_256_BIN}

    def check_inputs(self, args: dict[str, Any]) -> None:
        self.pipe.check_inputs(args["prompt"], args["height"], args["width"], args["negative_prompt"], 1)

    def encode_prompt(self, args: dict[str, Any], cfg: bool):
        return self.pipe.encode_prompt(self.encode_texts(args["prompt"]), cfg,
                                       negative_prompt=self.encode_texts(args["negative_prompt"]),
                                       num_images_per_prompt=1, device=self.device, clean_caption=args["clean_caption"],
                                       max_sequence_length=args["max_sequence_length"])

    def initial_latents(self, args, generators, cond) -> torch.Tensor:
        return self.pipe.prepare_latents(len(generators), self.pipe.transformer.config.in_channels, args["height"],
                                         args["width"], cond[TEXT[0]].dtype, self.device, generators)

    def schedule(self, scheduler, args, latents) -> torch.Tensor:
        scheduler.set_timesteps(args["num_inference_steps"], device=self.device)
        return scheduler.timesteps

    def model_input(self, rows: list[Row]) -> tuple[torch.Tensor, torch.Tensor]:
        """The latents (each row scaled by its own scheduler, where that is not the identity) and timesteps."""
        latents, timesteps = self.batch_latents(rows), self.batch_timesteps(rows)
        views = list(latents.split(1))
        scaled = [v if r.scheduler is None else r.scheduler.scale_model_input(v, r.t) for r, v in zip(rows, views)]
        if any(s is not v for s, v in zip(scaled, views)):
            latents = torch.cat(scaled)
        return latents, timesteps

    def transformer_call(self, latents, timesteps, text) -> torch.Tensor:
        return self.pipe.transformer(latents, timestep=timesteps, added_cond_kwargs={"resolution": None,
                                                                                     "aspect_ratio": None},
                                     return_dict=False, **text)[0]

    def decode(self, args, latents) -> torch.Tensor:
        vae = self.pipe.vae
        return vae.decode(latents.to(vae.dtype) / vae.config.scaling_factor, return_dict=False)[0]
