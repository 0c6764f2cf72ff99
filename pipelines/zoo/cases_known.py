"""Zoo cases of the families in :data:`bcg_pipelines.families.FAMILIES`.

Configs are the families' own tiny configs (:mod:`bcg_pipelines.family_specs`); the inputs have the kinds, devices
and layouts each pipeline passes (recorded from the tiny pipelines' first denoising step), with shorter
text sequences.
"""

from __future__ import annotations

from typing import Any

import torch

from .case import InputMaker, ZooCase
from .ids import flux_image_ids, flux_text_ids, grid_ids

__all__ = ["CASES"]


def _tiny(family: str) -> dict[str, Any]:
    from ..registry import get_family

    return dict(get_family(family).tiny.transformer)


def _flux(m: InputMaker) -> dict[str, Any]:
    return {
        "hidden_states": m.randn(1, 16, 64),  # 64 px: 8x8 latents packed in 2x2 patches
        "timestep": m.timestep(1, 1.0),
        "guidance": m.timestep(1, 3.5),
        "pooled_projections": m.randn(1, 32),
        "encoder_hidden_states": m.randn(1, 24, 32),
        "txt_ids": flux_text_ids(m, 24),
        "img_ids": flux_image_ids(m, 4, 4),
        "joint_attention_kwargs": {},
    }


def _sd3(m: InputMaker) -> dict[str, Any]:
    return {  # batched CFG
        "hidden_states": m.randn(2, 16, 8, 8),
        "timestep": m.timestep(2, 1000.0),
        "encoder_hidden_states": m.randn(2, 24, 64),
        "pooled_projections": m.randn(2, 64),
    }


def _pixart(m: InputMaker) -> dict[str, Any]:
    return {
        "hidden_states": m.randn(2, 4, 32, 32),
        "encoder_hidden_states": m.randn(2, 20, 32),
        "encoder_attention_mask": m.mask(2, 20, valid=7),
        "timestep": m.tensor([999, 999]),
        "added_cond_kwargs": {"resolution": None, "aspect_ratio": None},
    }


def _sana(m: InputMaker) -> dict[str, Any]:
    return {
        "hidden_states": m.randn(2, 32, 16, 16),
        "encoder_hidden_states": m.randn(2, 20, 32),
        "encoder_attention_mask": m.mask(2, 20, valid=7),
        "timestep": m.timestep(2, 999.0),
    }


def _wan(m: InputMaker) -> dict[str, Any]:
    return {
        "hidden_states": m.randn(1, 16, 3, 4, 4),  # 9 frames at 32 px
        "timestep": m.tensor([999]),
        "encoder_hidden_states": m.randn(1, 24, 32),
    }


def _qwenimage(m: InputMaker) -> dict[str, Any]:
    return {
        "hidden_states": m.randn(1, 16, 64),
        "timestep": m.timestep(1, 1.0),
        "encoder_hidden_states": m.randn(1, 9, 32),
        "encoder_hidden_states_mask": None,  # the pipeline drops an all-ones mask
        "img_shapes": [[(1, 4, 4)]],
        "attention_kwargs": {},
    }


def _qwenimage_masked(m: InputMaker) -> dict[str, Any]:
    kwargs = _qwenimage(m)
    kwargs["encoder_hidden_states_mask"] = m.mask(1, 9, valid=6)
    return kwargs


def _hunyuanvideo(m: InputMaker) -> dict[str, Any]:
    return {
        "hidden_states": m.randn(1, 16, 3, 4, 4),
        "timestep": m.timestep(1, 1000.0),
        "encoder_hidden_states": m.randn(1, 24, 32),
        "encoder_attention_mask": m.mask(1, 24, valid=9, dtype=m.dtype),
        "pooled_projections": m.randn(1, 32),
        "guidance": m.timestep(1, 6000.0),
    }


def _ltx(m: InputMaker) -> dict[str, Any]:
    return {  # batched CFG; 9 frames at 64 px = 2x2x2 latent tokens
        "hidden_states": m.randn(2, 8, 128),
        "encoder_hidden_states": m.randn(2, 24, 32),
        "timestep": m.timestep(2, 1000.0),
        "encoder_attention_mask": m.mask(2, 24, valid=9, dtype=torch.bool),
        "num_frames": 2,
        "height": 2,
        "width": 2,
        "rope_interpolation_scale": (0.32, 32, 32),
    }


def _cogvideox(m: InputMaker) -> dict[str, Any]:
    return {  # the text is always padded to max_text_seq_length (226)
        "hidden_states": m.randn(2, 3, 16, 4, 4),
        "encoder_hidden_states": m.randn(2, 226, 32),
        "timestep": m.tensor([999, 999]),
        "image_rotary_emb": None,
    }


def _lumina2(m: InputMaker) -> dict[str, Any]:
    return {
        "hidden_states": m.randn(1, 16, 8, 8),
        "timestep": m.timestep(1, 0.5),
        "encoder_hidden_states": m.randn(1, 24, 32),
        "encoder_attention_mask": m.mask(1, 24, valid=9),
    }


def _zimage(m: InputMaker) -> dict[str, Any]:
    return {  # lists of per-sample tensors: (C, F, H, W) latents, (T, D) caption features
        "x": [m.randn(16, 1, 8, 8)],
        "t": m.timestep(1, 0.5),
        "cap_feats": [m.randn(12, 32)],
    }


def _chroma(m: InputMaker) -> dict[str, Any]:
    text = 24
    return {
        "hidden_states": m.randn(1, 16, 64),
        "timestep": m.timestep(1, 1.0),
        "encoder_hidden_states": m.randn(1, text, 32),
        "txt_ids": flux_text_ids(m, text),
        "img_ids": flux_image_ids(m, 4, 4),
        # text padding mask, then ones for the 16 image tokens
        "attention_mask": torch.cat([m.mask(1, text, valid=9, dtype=m.dtype), m.ones(1, 16)], dim=1),
        "joint_attention_kwargs": {},
    }


def _flux2(m: InputMaker) -> dict[str, Any]:
    return {
        "hidden_states": m.randn(1, 16, 128),
        "timestep": m.timestep(1, 1.0),
        "guidance": m.timestep(1, 4.0),
        "encoder_hidden_states": m.randn(1, 24, 48),
        "txt_ids": grid_ids(m, (1, 1, 1, 24), batch=1),
        "img_ids": grid_ids(m, (1, 4, 4, 1), batch=1),
    }


CASES: list[ZooCase] = [
    ZooCase("FluxTransformer2DModel", _tiny("flux"), _flux, family="flux"),
    ZooCase("SD3Transformer2DModel", _tiny("sd3"), _sd3, family="sd3"),
    ZooCase("PixArtTransformer2DModel", _tiny("pixart"), _pixart, family="pixart"),
    ZooCase("SanaTransformer2DModel", _tiny("sana"), _sana, family="sana"),
    ZooCase("WanTransformer3DModel", _tiny("wan"), _wan, family="wan"),
    ZooCase("QwenImageTransformer2DModel", _tiny("qwenimage"), _qwenimage, family="qwenimage"),
    ZooCase(
        "QwenImageTransformer2DModel",
        _tiny("qwenimage"),
        _qwenimage_masked,
        variant="text_mask",
        family="qwenimage",
        note="a padded text mask: compute_text_seq_len_from_mask runs (an eager function of the family)",
    ),
    ZooCase("HunyuanVideoTransformer3DModel", _tiny("hunyuanvideo"), _hunyuanvideo, family="hunyuanvideo"),
    ZooCase("LTXVideoTransformer3DModel", _tiny("ltx"), _ltx, family="ltx"),
    ZooCase("CogVideoXTransformer3DModel", _tiny("cogvideox"), _cogvideox, family="cogvideox"),
    ZooCase("Lumina2Transformer2DModel", _tiny("lumina2"), _lumina2, family="lumina2"),
    ZooCase("ZImageTransformer2DModel", _tiny("zimage"), _zimage, family="zimage"),
    ZooCase("ChromaTransformer2DModel", _tiny("chroma"), _chroma, family="chroma"),
    ZooCase("Flux2Transformer2DModel", _tiny("flux2"), _flux2, family="flux2"),
]
