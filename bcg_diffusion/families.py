"""What the integration knows about particular transformer classes, by class name.

The library knows no family names: which model families exist, and the transformer class each one runs, is
``bcg_pipelines``' (``bcg_pipelines.families.FAMILIES``, the one list of them; the two packages import nothing of
each other). Here are only the classes that need something the generic path does not do.
"""

from __future__ import annotations

from dataclasses import dataclass

import logging

import torch

from .errors import UnknownTransformerError

logger = logging.getLogger("bcg_diffusion")


@dataclass(frozen=True)
class TransformerInfo:
    """Per-class knowledge.

    Attributes:
        text_kwarg / text_mask_kwarg: the text sequence input and its mask, where the model takes
            a mask and the text length varies per prompt (the only case where ``text_buckets``
            padding applies).
        value_keyed: mask inputs whose values decide tensor shapes inside the model (Lumina2 packs
            the text by its effective length): their per-row token counts become part of the key.
        eager_functions: module-level functions of the transformer's module that run as eager
            breaks (they build tensors on the host inside ``forward``).
        device_inputs: host tensor inputs that ``forward`` moves onto the device before any use
            (Lumina-Next's rotary table, built on the CPU by its pipeline every step): the runner
            moves them first, the same copy, so that the call can be keyed and captured.
    """

    text_kwarg: str | None = None
    text_mask_kwarg: str | None = None
    value_keyed: tuple[str, ...] = ()
    eager_functions: tuple[str, ...] = ()
    device_inputs: tuple[str, ...] = ()


#: The transformer classes the library knows something particular about, and what. Every other diffusers model
#: class runs on the generic path with an empty :class:`TransformerInfo` (which classes were verified:
#: :data:`ZOO_VERIFIED`). The model families and the class each runs are ``bcg_pipelines.families.FAMILIES``, the
#: one list of them: an entry here is per-class knowledge, never a family.
KNOWN_TRANSFORMERS: dict[str, TransformerInfo] = {
    "QwenImageTransformer2DModel": TransformerInfo(
        text_kwarg="encoder_hidden_states",
        text_mask_kwarg="encoder_hidden_states_mask",
        # with a text mask it calls torch.as_tensor(<python int>, device=cuda): a host copy
        eager_functions=("compute_text_seq_len_from_mask",),
    ),
    "Lumina2Transformer2DModel": TransformerInfo(value_keyed=("encoder_attention_mask",)),
    # LuminaPipeline passes a CPU rotary table of 384 x 384 positions; LuminaPatchEmbed.forward moves it onto the
    # hidden states' device as its first step (diffusers 0.42.1)
    "LuminaNextDiT2DModel": TransformerInfo(device_inputs=("image_rotary_emb",)),
}


# What tests/library/test_zoo_gpu.py checks on tiny configs of every diffusion transformer class of
# diffusers 0.42.1 (bcg_pipelines.zoo; docs/accelerate.md "Verified transformer classes").
ZOO_VERIFIED = "77 call paths of every diffusion transformer class of diffusers 0.42.1 (75 captured, all bitwise equal to eager)"
_logged: set[str] = set()


def is_transformer_component(name: str) -> bool:
    """Whether a pipeline component of this name is a denoising transformer: ``transformer``, ``transformer_2`` (Wan
    2.2) or a ``*_transformer`` (Ideogram's ``unconditional_transformer``)."""
    return name.startswith("transformer") or name.endswith("_transformer")


def _is_diffusers_model(module: torch.nn.Module) -> bool:
    try:
        from diffusers.models.modeling_utils import ModelMixin
    except ImportError:  # pragma: no cover - diffusers is a dependency
        return False
    return isinstance(module, ModelMixin)


def transformer_info(module: torch.nn.Module, allow_unknown: bool | None) -> TransformerInfo:
    """Knowledge for ``module``'s class, or the generic (empty) entry.

    ``allow_unknown``: ``None`` (default) takes any diffusers model class (one log line for a class on
    the generic path) and refuses other modules; ``True`` takes any module; ``False`` only the classes
    of :data:`KNOWN_TRANSFORMERS`. Raises :class:`UnknownTransformerError` for a refused class.
    """
    name = type(module).__name__
    info = KNOWN_TRANSFORMERS.get(name)
    if info is not None:
        return info
    if allow_unknown or (allow_unknown is None and _is_diffusers_model(module)):
        if name not in _logged:
            _logged.add(name)
            logger.info(
                "bcg: %s runs on the generic path (breaks at dispatch_attention_fn and scaled_dot_product_attention, "
                "narrowing and module mode where it does host work), verified on %s", name, ZOO_VERIFIED,
            )
        return TransformerInfo()
    known = ", ".join(sorted(KNOWN_TRANSFORMERS))
    what = ("is not a diffusers model class" if allow_unknown is None
            else f"is not one of the classes with per-class knowledge ({known}), which allow_unknown=False limits it to")
    raise UnknownTransformerError(
        f"bcg-diffusion does not take the transformer class {name}: it {what}. Every diffusers model class is taken "
        "by default (allow_unknown=None). To try the generic path (breaks at dispatch_attention_fn and "
        "scaled_dot_product_attention) on another module, pass BCGConfig(allow_unknown=True) and compare with eager "
        "output (BCGConfig(debug=True) helps)."
    )
