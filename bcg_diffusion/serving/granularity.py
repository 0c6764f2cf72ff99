"""The pixel granularity of a pipeline: request heights and widths must be multiples of it."""

from __future__ import annotations

import logging
import math

logger = logging.getLogger(__name__)

__all__ = ["derive_granularity", "pixel_granularity"]

#: Pipelines that pack 2x2 latent patches into channels (Flux, Chroma, Qwen-Image, Flux.2) feed the
#: transformer ``4 x`` the VAE's latent channels.
PACKED_CHANNEL_FACTOR = 4


def _vae_spatial_factor(pipe) -> int:
    for name in ("vae_scale_factor_spatial", "vae_spatial_compression_ratio", "vae_scale_factor"):
        value = getattr(pipe, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError(f"{type(pipe).__name__} has no VAE scale factor (vae_scale_factor, vae_scale_factor_spatial "
                     "or vae_spatial_compression_ratio)")


def _spatial_patch(config) -> int:
    patch = config.get("patch_size")
    if patch is None:
        patch = config.get("all_patch_size")  # Z-Image: a tuple of patch sizes, the first is the default
        patch = patch[0] if patch else 1
    elif isinstance(patch, (tuple, list)):
        patch = patch[-1]  # video transformers: (t, h, w)
    return int(patch)


def _latent_channels(vae_config) -> int | None:
    for name in ("latent_channels", "z_dim"):
        value = vae_config.get(name)
        if isinstance(value, int) and value > 0:
            return value
    return None


def derive_granularity(pipe) -> int:
    """VAE spatial scale factor x the transformer's spatial patch, read from the pipeline's modules.

    Pipelines whose transformer takes ``4 x`` the VAE's latent channels pack 2x2 latent patches into
    channels; the packing is their patch (the transformer's ``patch_size`` then names the same patch or
    the token after packing), so the granularity is the VAE factor x 2. Raises ``ValueError`` when the
    pipeline lacks a VAE factor or a transformer.
    """
    transformer = getattr(pipe, "transformer", None)
    if transformer is None:
        raise ValueError(f"{type(pipe).__name__} has no transformer")
    vae_factor = _vae_spatial_factor(pipe)
    config = transformer.config
    latent = _latent_channels(pipe.vae.config) if getattr(pipe, "vae", None) is not None else None
    in_channels = config.get("in_channels")
    if latent and in_channels == PACKED_CHANNEL_FACTOR * latent:
        return vae_factor * 2
    return vae_factor * _spatial_patch(config)


def pixel_granularity(pipe, family_multiple: int | None = None) -> int:
    """The granularity to enforce: :func:`derive_granularity`, combined (least common multiple) with the
    family registry's ``spatial_multiple`` where the family is known, so that a size the family's shape
    rule rejects is never accepted. A disagreement is logged."""
    derived = derive_granularity(pipe)
    if family_multiple is None or family_multiple == derived:
        return derived
    combined = math.lcm(derived, family_multiple)
    logger.warning("pixel granularity: %s gives %d, the family registry %d; using %d",
                   type(pipe).__name__, derived, family_multiple, combined)
    return combined
