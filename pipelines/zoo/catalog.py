"""Which classes of ``diffusers.models.transformers`` the zoo covers, and which it leaves out (and why)."""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil

__all__ = ["EXCLUDED", "transformer_classes"]

#: ``ModelMixin`` classes of ``diffusers.models.transformers`` that are not diffusion-transformer denoisers
#: of image, video or audio latents, with the reason. Every other class there has a zoo case.
EXCLUDED: dict[str, str] = {
    "PriorTransformer": "the unCLIP / Kandinsky 2 prior: maps text embeddings to a CLIP image embedding, "
    "not a denoiser of image latents",
    "TransformerTemporalModel": "the temporal-attention block inside UNets (AnimateDiff, Text2Video): "
    "no denoiser of its own",
    "Transformer2DModel": "the spatial-transformer block of UNets; its patched DiT and PixArt modes are "
    "loaded as DiTTransformer2DModel and PixArtTransformer2DModel (both in the zoo)",
    "DreamLiteTransformer2DModel": "the continuous-input transformer block inside the DreamLite UNet, "
    "not a denoiser of its own",
    "RFD4ProteinaTransformer": "a protein-structure denoiser (backbone coordinates and residue latents), "
    "not image, video or audio",
    "MiniMaxMusic3RVQDepthDecoder": "MiniMax Music 3's autoregressive language model over RVQ codebooks, "
    "not a diffusion denoiser",
}


@functools.lru_cache(maxsize=1)
def transformer_classes() -> dict[str, type]:
    """Every ``ModelMixin`` class defined in a module of ``diffusers.models.transformers`` (name -> class)."""
    import diffusers.models.transformers as package
    from diffusers.models.modeling_utils import ModelMixin

    found: dict[str, type] = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, ModelMixin) and obj.__module__ == module.__name__:
                found[name] = obj
    return dict(sorted(found.items()))
