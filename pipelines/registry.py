"""What the project knows about each model family: specs, lookup, shape rules.

A family is one published diffusers pipeline (Flux.1-dev, SD3.5-medium, ...). Its :class:`FamilySpec`
names the real diffusers classes, the published transformer config (``full``) and a tiny config with the
same block structure (``tiny``), the VAE and text encoders, the scheduler, default call settings and how
classifier-free guidance (CFG) is run. Family modules live in :mod:`bcg_pipelines.family_specs`; this module only
holds the data types and the lookups over them. Which families exist, and in which order, is
:data:`bcg_pipelines.families.FAMILIES`.
"""

from __future__ import annotations

import functools
import importlib
import logging
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from .families import FAMILIES

logger = logging.getLogger(__name__)

__all__ = [
    "CFG_MODES",
    "SIZES",
    "FamilySpec",
    "SizeSpec",
    "TextEncoderSpec",
    "check_call",
    "family_of",
    "get_family",
    "list_families",
    "validate_shape",
]

#: How a family runs classifier-free guidance in its default call.
#: ``batched``: one transformer call per step on a batch of 2 (cond + uncond).
#: ``two_calls``: two transformer calls per step with the same shapes (cond, then uncond).
#: ``embedded``: guidance-distilled; the scale goes in as an embedding, one call per step.
#: ``none``: distilled to need no guidance at all (one call per step, no guidance input).
CFG_MODES = ("batched", "two_calls", "embedded", "none")

#: Size names accepted by :func:`bcg_pipelines.build_pipeline`.
SIZES = ("tiny", "full")


def _frozen(mapping: Mapping | None) -> Mapping:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True, eq=False)
class TextEncoderSpec:
    """One text encoder + tokenizer pair of a pipeline.

    ``kind`` is a model kind of :data:`bcg_pipelines.text_encoders.KINDS`, ``tokenizer_style`` a maker of
    :mod:`bcg_pipelines.tokenizers`; ``tiny_preset`` / ``full_preset`` name entries of
    :data:`bcg_pipelines.text_encoders.PRESETS` (whose note says how a full preset differs from ``real_model``).
    """

    component: str
    tokenizer_component: str
    kind: str
    tokenizer_style: str
    real_model: str
    max_length: int
    tiny_preset: str
    full_preset: str

    def preset(self, size: str) -> str:
        return self.tiny_preset if size == "tiny" else self.full_preset

    @property
    def model_class_name(self) -> str:
        from .text_encoders import KINDS

        return KINDS[self.kind][1]

    @property
    def full_note(self) -> str:
        from .text_encoders import preset_note

        return preset_note(self.full_preset)


@dataclass(frozen=True, eq=False)
class SizeSpec:
    """Configs and default call shape of one size (``tiny`` or ``full``) of a family."""

    transformer: Mapping[str, Any]
    vae: Mapping[str, Any]
    height: int
    width: int
    num_frames: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "transformer", _frozen(self.transformer))
        object.__setattr__(self, "vae", _frozen(self.vae))


@dataclass(frozen=True, eq=False)
class FamilySpec:
    """Everything the project knows about one model family.

    Shape contract: height and width must be multiples of ``vae_scale_factor * patch_size``; for video
    families ``(num_frames - 1) % frame_multiple == 0``. ``call_kwargs`` are the extra arguments that make
    a plain ``pipe(prompt=...)`` run the family's published CFG mode (e.g. Qwen-Image's negative prompt).
    """

    name: str
    title: str
    reference_id: str
    pipeline_class_name: str
    transformer_class_name: str
    vae_class_name: str
    scheduler_class_name: str
    scheduler_config: Mapping[str, Any]
    text_encoders: tuple[TextEncoderSpec, ...]
    tiny: SizeSpec
    full: SizeSpec
    default_steps: int
    default_guidance: float | None
    guidance_kwarg: str
    cfg_mode: str
    vae_scale_factor: int
    patch_size: int
    is_video: bool = False
    frame_multiple: int | None = None
    call_kwargs: Mapping[str, Any] = field(default_factory=dict)
    extra_components: Mapping[str, Any] = field(default_factory=dict)
    vae_note: str = ""
    notes: str = ""

    def __post_init__(self):
        if self.cfg_mode not in CFG_MODES:
            raise ValueError(f"{self.name}: cfg_mode {self.cfg_mode!r} not in {CFG_MODES}")
        object.__setattr__(self, "scheduler_config", _frozen(self.scheduler_config))
        object.__setattr__(self, "call_kwargs", _frozen(self.call_kwargs))
        object.__setattr__(self, "extra_components", _frozen(self.extra_components))

    # -- classes (imported lazily: diffusers is heavy) --------------------------------------------
    @property
    def pipeline_class(self) -> type:
        return getattr(importlib.import_module("diffusers"), self.pipeline_class_name)

    @property
    def transformer_class(self) -> type:
        return getattr(importlib.import_module("diffusers"), self.transformer_class_name)

    @property
    def vae_class(self) -> type:
        return getattr(importlib.import_module("diffusers"), self.vae_class_name)

    @property
    def scheduler_class(self) -> type:
        return getattr(importlib.import_module("diffusers"), self.scheduler_class_name)

    # -- sizes and shapes -------------------------------------------------------------------------
    def size(self, size: str) -> SizeSpec:
        """The :class:`SizeSpec` named ``size``; ``ValueError`` listing the sizes otherwise."""
        if size == "tiny":
            return self.tiny
        if size == "full":
            return self.full
        raise ValueError(f"unknown size {size!r} for family {self.name!r}; known sizes: {', '.join(SIZES)}")

    @property
    def spatial_multiple(self) -> int:
        """Height and width must be multiples of this (VAE scale factor x transformer patch size)."""
        return self.vae_scale_factor * self.patch_size

    def default_call(self, size: str = "full") -> dict[str, Any]:
        """Keyword arguments of a default ``pipe(...)`` call (shape, steps, guidance, CFG extras), no prompt."""
        sz = self.size(size)
        kwargs: dict[str, Any] = {"height": sz.height, "width": sz.width, "num_inference_steps": self.default_steps}
        if self.is_video:
            kwargs["num_frames"] = sz.num_frames
        if self.default_guidance is not None:
            kwargs[self.guidance_kwarg] = self.default_guidance
        kwargs.update(self.call_kwargs)
        return kwargs


@functools.lru_cache(maxsize=None)
def _registry() -> Mapping[str, FamilySpec]:
    """One spec per supported family, from module ``bcg_pipelines.family_specs.<family>``."""
    specs = {}
    for name, transformer_class_name in FAMILIES.items():
        spec: FamilySpec = importlib.import_module(f"{__package__}.family_specs.{name}").SPEC
        if (spec.name, spec.transformer_class_name) != (name, transformer_class_name):
            raise RuntimeError(f"{__package__}.family_specs.{name} defines family {spec.name!r} with transformer "
                               f"{spec.transformer_class_name}; bcg_pipelines.families.FAMILIES maps "
                               f"{name!r} to {transformer_class_name}")
        specs[name] = spec
    return MappingProxyType(specs)


def list_families() -> list[str]:
    """Names of all known families, in registry order."""
    return list(_registry())


def get_family(family: str | FamilySpec) -> FamilySpec:
    """The :class:`FamilySpec` for a name (or the spec itself); ``ValueError`` listing known names otherwise."""
    if isinstance(family, FamilySpec):
        return family
    reg = _registry()
    if not isinstance(family, str) or family not in reg:
        raise ValueError(f"unknown family {family!r}; known families: {', '.join(reg)}")
    return reg[family]


def family_of(obj: Any) -> FamilySpec:
    """The family of a pipeline or transformer (instance or class), matched on the transformer class.

    Raises ``ValueError`` when the transformer class belongs to no known family.
    """
    target = getattr(obj, "transformer", None)
    if target is None and getattr(obj, "transformer_2", None) is not None:
        target = obj.transformer_2
    if target is None:
        target = obj
    cls = target if isinstance(target, type) else type(target)
    names = {c.__name__ for c in cls.__mro__}
    for spec in _registry().values():
        if spec.transformer_class_name in names:
            return spec
    known = ", ".join(f"{s.transformer_class_name} ({s.name})" for s in _registry().values())
    raise ValueError(f"no known family uses transformer class {cls.__name__}; known transformer classes: {known}")


def _frames_examples(mult: int, upto: int) -> str:
    vals = [k * mult + 1 for k in range(0, 6)]
    return ", ".join(str(v) for v in vals) + f", ..., {upto}"


def validate_shape(family: str | FamilySpec, height: int, width: int, frames: int | None = None) -> None:
    """Raise ``ValueError`` (saying what is allowed) if the family cannot generate this shape.

    Height and width must be positive multiples of :attr:`FamilySpec.spatial_multiple`. Video families
    need ``(frames - 1) % frame_multiple == 0`` (``frames=None`` is accepted: the pipeline default);
    image families accept only ``frames`` of ``None`` or 1.
    """
    spec = get_family(family)
    m = spec.spatial_multiple
    for name, value in (("height", height), ("width", width)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or value % m:
            raise ValueError(
                f"{name}={value!r} is not valid for family {spec.name!r}: height and width must be positive "
                f"multiples of {m} (VAE scale factor {spec.vae_scale_factor} x patch size {spec.patch_size}); "
                f"e.g. {spec.full.height}x{spec.full.width}"
            )
    if frames is None:
        return
    if not spec.is_video:
        if frames != 1:
            raise ValueError(f"frames={frames!r} is not valid for family {spec.name!r}: it makes images; use frames=None or 1")
        return
    k = spec.frame_multiple or 1
    if not isinstance(frames, int) or isinstance(frames, bool) or frames < 1 or (frames - 1) % k:
        raise ValueError(
            f"frames={frames!r} is not valid for family {spec.name!r}: the frame count must satisfy "
            f"(frames - 1) % {k} == 0 (VAE temporal compression {k}), e.g. "
            f"{_frames_examples(k, spec.full.num_frames or 1)}"
        )


def check_call(
    family: str | FamilySpec,
    height: int | None = None,
    width: int | None = None,
    num_frames: int | None = None,
    size: str = "full",
) -> dict[str, int]:
    """Validate a call shape before diffusers sees it; return the shape kwargs for ``pipe(...)``.

    Missing values take the family's defaults for ``size``. The result has ``height`` and ``width``, plus
    ``num_frames`` for video families. Raises ``ValueError`` as :func:`validate_shape` does.
    """
    spec = get_family(family)
    sz = spec.size(size)
    height = sz.height if height is None else height
    width = sz.width if width is None else width
    if spec.is_video and num_frames is None:
        num_frames = sz.num_frames
    validate_shape(spec, height, width, num_frames)
    out = {"height": height, "width": width}
    if spec.is_video:
        out["num_frames"] = num_frames
    return out
