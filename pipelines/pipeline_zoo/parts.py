"""Seeded makers of tiny pipeline components (models, tokenizers, schedulers) on one device and dtype.

Every model is constructed on the CPU in float32 with torch's RNG seeded for its component name, then moved and
cast, so the same ``seed`` gives bitwise the same weights on every device: an accelerated pipeline and its eager
twin built with one seed hold equal weights. Diffusers models (transformers, controlnets, adapters) get small
random values where their init leaves a parameter all zero (zero-initialised output projections and control
blocks), so every layer shapes the output; their buffers are cast like ``from_pretrained(torch_dtype=...)``
casts them and the class's ``_keep_in_fp32_modules`` stay float32. Text encoders keep their float32 buffers
(RoPE tables), as transformers loads them.
"""

from __future__ import annotations

import contextlib
import importlib
import zlib
from typing import Any, Mapping

import torch

from ..text_encoders import TINY_VOCAB, build_text_encoder, build_tokenizer, preset
from ..zoo.case import _fill_zero_parameters, _keep_fp32_modules, _ZeroedEmpty

__all__ = ["QWEN_VL_CHAT_TEMPLATE", "VISION_TOKENS", "Parts", "PassThroughSafetyChecker", "diffusers_class",
           "transformers_class"]


#: The vision tokens of Qwen-VL vocabularies, in the order :meth:`Parts.vision_token_ids` reads them.
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")


#: A Qwen-VL-like chat template: a user turn whose content is a string or a list of typed parts (texts joined).
QWEN_VL_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}{%- set text = message['content'] -%}"
    "{%- else -%}{%- set text = message['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('') -%}{%- endif -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + text + '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)


def diffusers_class(name: str) -> type:
    """``diffusers.<name>`` (``AttributeError`` naming it when this diffusers has no such export)."""
    return getattr(importlib.import_module("diffusers"), name)


def transformers_class(name: str) -> type:
    return getattr(importlib.import_module("transformers"), name)


def _component_seed(seed: int, name: str) -> int:
    return (int(seed) * 1_000_003 + zlib.crc32(name.encode())) % (2**63 - 1)


@contextlib.contextmanager
def _seeded(seed: int):
    """Torch's CPU RNG seeded for the block, the caller's state restored after; ``torch.empty`` gives zeros."""
    with torch.random.fork_rng(devices=[]), torch.no_grad(), _ZeroedEmpty():
        torch.manual_seed(seed)
        yield


class Parts:
    """Makers of one pipeline's components at ``seed`` on ``device`` in ``dtype`` (see the module docstring)."""

    def __init__(self, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0):
        self.device = torch.device(device)
        self.dtype = dtype
        self.seed = seed

    # -- placing ------------------------------------------------------------------------------------
    def _place_diffusers(self, model: torch.nn.Module, name: str, fill_zeros: bool) -> torch.nn.Module:
        if fill_zeros:
            _fill_zero_parameters(model, torch.Generator("cpu").manual_seed(_component_seed(self.seed, name + "/zeros")))
        model = torch.nn.Module.to(model, device=self.device, dtype=self.dtype)  # torch's own: no fp32 warning
        _keep_fp32_modules(model, self.dtype)
        return model.eval().requires_grad_(False)

    def _place_encoder(self, model: torch.nn.Module) -> torch.nn.Module:
        model = model.to(self.device)
        with torch.no_grad():
            for param in model.parameters():
                if param.is_floating_point() and param.dtype != self.dtype:
                    param.data = param.data.to(self.dtype)
        return model.eval().requires_grad_(False)

    # -- diffusers models -----------------------------------------------------------------------------
    def model(self, name: str, cls: type | str, config: Mapping[str, Any] | None = None, *,
              fill_zeros: bool = True) -> torch.nn.Module:
        """A diffusers model (``cls`` or its name in ``diffusers``) for component ``name``, from ``config``."""
        cls = diffusers_class(cls) if isinstance(cls, str) else cls
        with _seeded(_component_seed(self.seed, name)):
            model = cls(**dict(config or {}))
        return self._place_diffusers(model, name, fill_zeros)

    def vae(self, cls: type | str, config: Mapping[str, Any] | None = None, name: str = "vae") -> torch.nn.Module:
        """A VAE: as :meth:`model`, its init left as it is (no zero filling)."""
        return self.model(name, cls, config, fill_zeros=False)

    # -- text encoders and tokenizers -----------------------------------------------------------------
    def tokenizer(self, style: str, max_length: int = 512):
        """A local tokenizer of ``style`` (``clip``, ``t5``, ``gemma``, ``qwen2``, ``qwen3``, ``llama3``, ``mistral``)."""
        return build_tokenizer(style, max_length)

    def text_encoder(self, name: str, kind: str, preset_name: str | None = None, tokenizer=None,
                     **overrides: Any) -> torch.nn.Module:
        """A text encoder of a :data:`bcg_pipelines.text_encoders.KINDS` kind, with the config of preset
        ``preset_name`` updated by ``overrides`` and the token ids of ``tokenizer``."""
        config = preset(preset_name) if preset_name else {}
        config.update(overrides)
        with _seeded(_component_seed(self.seed, name)):
            model = build_text_encoder(kind, config, tokenizer)
        return self._place_encoder(model)

    def transformers_model(self, name: str, model_class: str | type, config_class: str | type,
                           **config: Any) -> torch.nn.Module:
        """Any transformers model from its config class (image encoders, encoders the presets lack); classes by
        name in ``transformers`` or given."""
        config_class = transformers_class(config_class) if isinstance(config_class, str) else config_class
        model_class = transformers_class(model_class) if isinstance(model_class, str) else model_class
        cfg = config_class(**config)
        with _seeded(_component_seed(self.seed, name)):
            model = model_class(cfg)
        return self._place_encoder(model)

    # -- schedulers -----------------------------------------------------------------------------------
    @staticmethod
    def scheduler(cls: type | str, **config: Any):
        cls = diffusers_class(cls) if isinstance(cls, str) else cls
        return cls(**config)

    # -- the components of a known family -------------------------------------------------------------
    def family(self, family: str, transformer: Mapping[str, Any] | None = None, *,
               transformer_class: str | None = None, scheduler: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Every component of a :mod:`bcg_pipelines.family_specs` family at its tiny size: its text encoders and
        tokenizers, VAE and scheduler, and its transformer with ``transformer`` overriding config keys
        (``transformer_class`` another class on the same config, e.g. the VACE variant of Wan)."""
        from ..registry import get_family

        spec = get_family(family)
        components: dict[str, Any] = {}
        for te in spec.text_encoders:
            components[te.tokenizer_component] = tokenizer = self.tokenizer(te.tokenizer_style, te.max_length)
            components[te.component] = self.text_encoder(te.component, te.kind, te.tiny_preset, tokenizer)
        components["vae"] = self.vae(spec.vae_class, spec.tiny.vae)
        config = {**spec.tiny.transformer, **(transformer or {})}
        components["transformer"] = self.model("transformer", transformer_class or spec.transformer_class, config)
        components["scheduler"] = self.scheduler(spec.scheduler_class, **{**spec.scheduler_config, **(scheduler or {})})
        components.update(spec.extra_components)
        return components

    # -- image encoders and processors ----------------------------------------------------------------
    def clip_vision(self, name: str = "image_encoder", hidden: int = 32, image_size: int = 32,
                    projection: bool = False, **config: Any) -> torch.nn.Module:
        """A tiny CLIP vision tower (``CLIPVisionModel``, or ``...WithProjection`` with ``projection``): 2 layers,
        patches of 8 px."""
        model_class = "CLIPVisionModelWithProjection" if projection else "CLIPVisionModel"
        settings = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=2,
                        image_size=image_size, patch_size=8, projection_dim=hidden) | config
        return self.transformers_model(name, model_class, "CLIPVisionConfig", **settings)

    @staticmethod
    def clip_image_processor(size: int = 32):
        """A ``CLIPImageProcessor`` that resizes and crops to ``size`` px (CLIP's mean and std)."""
        from transformers import CLIPImageProcessor

        return CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size})

    def siglip_vision(self, name: str = "image_encoder", hidden: int = 32, image_size: int = 32,
                      **config: Any) -> torch.nn.Module:
        """A tiny SigLIP vision tower (``SiglipVisionModel``): 2 layers, patches of 8 px."""
        settings = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=2,
                        image_size=image_size, patch_size=8) | config
        return self.transformers_model(name, "SiglipVisionModel", "SiglipVisionConfig", **settings)

    @staticmethod
    def siglip_image_processor(size: int = 32):
        from transformers import SiglipImageProcessor

        return SiglipImageProcessor(size={"height": size, "width": size})

    # -- vision-language text encoders (Qwen2-VL style processors) ----------------------------------------
    @staticmethod
    def vl_tokenizer(style: str = "qwen2", max_length: int = 32768):
        """A local Qwen tokenizer with the vision tokens the VL processors and chat templates use."""
        tokenizer = build_tokenizer(style, max_length)
        tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)},
                                     replace_extra_special_tokens=False)
        return tokenizer

    @staticmethod
    def vl_processor(tokenizer, processor_class: str = "Qwen2VLProcessor", image_processor_class: str =
                     "Qwen2VLImageProcessor", max_pixels: int = 28 * 28 * 16, patch_size: int = 14, **extra: Any):
        """A Qwen-VL processor of ``tokenizer`` whose image processor makes at most ``max_pixels`` per image (16
        patches of 14 px by default), without a video processor (transformers' video processors need torchvision;
        the pipelines pass images only). transformers' constructor insists on every sub-processor, so the object
        is assembled attribute by attribute; its ``__call__`` is transformers' own."""
        image_processor = transformers_class(image_processor_class)(
            min_pixels=patch_size * patch_size * 4 * 4, max_pixels=max_pixels, patch_size=patch_size)
        processor = object.__new__(transformers_class(processor_class))
        processor.image_processor, processor.tokenizer, processor.video_processor = image_processor, tokenizer, None
        processor.chat_template = getattr(tokenizer, "chat_template", None)
        processor.image_token, processor.video_token = "<|image_pad|>", "<|video_pad|>"
        processor.image_token_id = tokenizer.convert_tokens_to_ids(processor.image_token)
        processor.video_token_id = tokenizer.convert_tokens_to_ids(processor.video_token)
        for name, value in extra.items():
            setattr(processor, name, value)
        return processor

    @staticmethod
    def vision_token_ids(tokenizer) -> dict[str, int]:
        """The ids a Qwen-VL config needs (image, video, vision start and end)."""
        ids = tokenizer.convert_tokens_to_ids(list(VISION_TOKENS))
        return dict(vision_start_token_id=ids[0], vision_end_token_id=ids[1], image_token_id=ids[2],
                    video_token_id=ids[3])

    def qwen25_vl(self, name: str, tokenizer, hidden: int = 32, model_class: str | None = None) -> torch.nn.Module:
        """A tiny Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``, or ``model_class`` on the same config) of
        text width ``hidden`` whose vision tokens match ``tokenizer``."""
        config = preset("qwen2_5_vl_tiny")
        config["text_config"].update(hidden_size=hidden, intermediate_size=2 * hidden)
        config["vision_config"].update(out_hidden_size=hidden)
        config.update(self.vision_token_ids(tokenizer))
        kind = "qwen2_5_vl"
        with _seeded(_component_seed(self.seed, name)):
            model = build_text_encoder(kind, config, tokenizer)
        if model_class is not None:  # another class on the config: its text model alone (``...TextModel``) or all
            config = model.config.text_config if model_class.endswith("TextModel") else model.config
            with _seeded(_component_seed(self.seed, name)):
                model = transformers_class(model_class)(config)
        return self._place_encoder(model)


    def qwen3_vl(self, name: str, tokenizer, hidden: int = 32, layers: int = 2,
                 model_class: str = "Qwen3VLForConditionalGeneration") -> torch.nn.Module:
        """A tiny Qwen3-VL (text width ``hidden``, 16 px patches merged 2x2, one vision block with a deepstack
        output) whose vision token ids and pad/bos/eos ids are ``tokenizer``'s."""
        ids = {f"{key}_token_id": getattr(tokenizer, f"{key}_token_id", None) for key in ("pad", "bos", "eos")}
        half = hidden // 4  # half the head width (2 heads), split over the time, height and width sections
        sections = [half - 2 * (half // 3), half // 3, half // 3]
        text = dict(vocab_size=TINY_VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=hidden // 2,
                    rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": sections,
                                     "mrope_interleaved": True}, **ids)
        vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=16, spatial_merge_size=2,
                      temporal_patch_size=2, out_hidden_size=hidden, num_position_embeddings=16,
                      deepstack_visual_indexes=[0])
        return self.transformers_model(name, model_class, "Qwen3VLConfig", text_config=text, vision_config=vision,
                                       **self.vision_token_ids(tokenizer))

    def qwen3_vl_processor(self, tokenizer):
        """A Qwen3-VL processor over ``tokenizer`` (16 px patches, at most 16 per image)."""
        vision = {name: token for name, token in zip(("vision_start", "vision_end"), VISION_TOKENS[:2])}
        return self.vl_processor(
            tokenizer, "Qwen3VLProcessor", max_pixels=16 * 16 * 16, patch_size=16,
            vision_start_token=vision["vision_start"], vision_end_token=vision["vision_end"],
            vision_start_token_id=tokenizer.convert_tokens_to_ids(vision["vision_start"]),
            vision_end_token_id=tokenizer.convert_tokens_to_ids(vision["vision_end"]))

    def language_model(self, name: str, model_class: str | type, config_class: str | type, tokenizer,
                       **config: Any) -> torch.nn.Module:
        """A transformers language model (``Qwen3ForCausalLM``, ``GemmaModel``, ...) whose pad, bos and eos ids are
        the local ``tokenizer``'s and whose vocabulary holds it (``vocab_size`` at least the tokenizer's length)."""
        ids = {f"{key}_token_id": getattr(tokenizer, f"{key}_token_id", None) for key in ("pad", "bos", "eos")}
        config = {"vocab_size": TINY_VOCAB, **ids, **config}
        if len(tokenizer) > config["vocab_size"]:
            raise ValueError(f"{name}: the tokenizer has {len(tokenizer)} ids, more than the vocabulary "
                             f"{config['vocab_size']}")
        return self.transformers_model(name, model_class, config_class, **config)

    # -- more tokenizers and VAEs ---------------------------------------------------------------------------
    @staticmethod
    def bert_tokenizer(max_length: int = 77):
        """A WordPiece ``BertTokenizer`` over the local word list (``[PAD]`` 0, whole words, then characters and
        ``##`` continuations), lower-casing like bert-base-uncased."""
        from transformers import BertTokenizer

        from ..tokenizers import WORDS

        vocab: dict[str, int] = {}
        pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
        chars = [chr(c) for c in range(33, 127)]
        pieces += chars + ["##" + c for c in chars]
        for piece in pieces:
            vocab.setdefault(piece.lower() if not piece.startswith("[") else piece, len(vocab))
        return BertTokenizer(vocab=vocab, model_max_length=max_length)

    def kl_vae(self, latent_channels: int = 4, levels: int = 4, name: str = "vae", **config: Any) -> torch.nn.Module:
        """A tiny ``AutoencoderKL`` (16 channels per level, one layer per block) with ``latent_channels`` and a scale
        factor of ``2 ** (levels - 1)``."""
        settings = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * levels,
                        up_block_types=("UpDecoderBlock2D",) * levels, block_out_channels=(16,) * levels,
                        layers_per_block=1, latent_channels=latent_channels, norm_num_groups=8, sample_size=64)
        return self.vae("AutoencoderKL", settings | config, name=name)


class PassThroughSafetyChecker:
    """A stand-in for Cosmos's ``CosmosSafetyChecker`` (the ``cosmos_guardrail`` package downloads its guard models
    at construction, which cannot be done offline): every text and video passes unchanged. The denoising path is
    the pipeline's own; only the guard models' checks around it are skipped."""

    def to(self, *args: Any, **kwargs: Any) -> "PassThroughSafetyChecker":
        return self

    @staticmethod
    def check_text_safety(prompt: str) -> bool:
        return True

    @staticmethod
    def check_video_safety(video: Any) -> Any:
        return video
