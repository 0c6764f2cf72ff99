"""Text encoders with random weights, built from transformers config classes.

Each *kind* maps to a transformers config + model class and base settings; a family's
:class:`~bcg_pipelines.registry.TextEncoderSpec` adds per-size overrides (the presets below). Token ids
(bos/eos/pad) come from the locally made tokenizer, and its length must fit the model's vocabulary.

Full-size presets keep the output width the diffusion transformer expects (hidden size, heads, head
dim). Encoders of billions of parameters are shrunk in depth (and vocabulary, since the local
tokenizers use a few thousand ids); each preset's ``note`` says how. The weights are whatever the
transformers initialisers draw from the current torch RNG: :func:`bcg_pipelines.build_pipeline` seeds it.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Mapping

from .tokenizers import MAX_VOCAB

logger = logging.getLogger(__name__)

__all__ = ["KINDS", "PRESETS", "build_text_encoder", "build_tokenizer"]

#: Vocabulary of every tiny encoder (the local tokenizers have fewer ids, see ``tokenizers.MAX_VOCAB``).
TINY_VOCAB = MAX_VOCAB
#: Vocabulary of shrunk full-size encoders whose real vocabulary is over 32k ids.
SHRUNK_VOCAB = 32768


def _rope(theta: float, **extra) -> dict:
    return {"rope_type": "default", "rope_theta": float(theta), **extra}


# kind -> (config class, model class, base kwargs)
KINDS: Mapping[str, tuple[str, str, dict]] = {
    "clip": ("CLIPTextConfig", "CLIPTextModel", {"max_position_embeddings": 77}),
    "clip_proj": ("CLIPTextConfig", "CLIPTextModelWithProjection", {"max_position_embeddings": 77}),
    "t5": ("T5Config", "T5EncoderModel", {"feed_forward_proj": "gated-gelu", "is_encoder_decoder": False, "use_cache": False}),
    "umt5": ("UMT5Config", "UMT5EncoderModel", {"feed_forward_proj": "gated-gelu", "is_encoder_decoder": False, "use_cache": False}),
    "gemma2": ("Gemma2Config", "Gemma2Model", {}),
    "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", {}),
    "qwen3": ("Qwen3Config", "Qwen3Model", {}),
    "llama": ("LlamaConfig", "LlamaModel", {}),
    "mistral3": ("Mistral3Config", "Mistral3ForConditionalGeneration", {}),
}

# Size presets: ``cfg`` goes to the config class, ``note`` documents how a full preset differs from the
# real encoder ("" = real architecture).
PRESETS: Mapping[str, Mapping[str, Any]] = {
    # CLIP ViT-L/14 text tower (Flux, SD3, HunyuanVideo): real size.
    "clip_l_full": {
        "cfg": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                    projection_dim=768, hidden_act="quick_gelu", vocab_size=49408),
        "note": "",
    },
    # OpenCLIP bigG/14 text tower (SD3): real size.
    "clip_g_full": {
        "cfg": dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=20,
                    projection_dim=1280, hidden_act="gelu", vocab_size=49408),
        "note": "",
    },
    "clip_tiny": {
        "cfg": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                    projection_dim=32, hidden_act="quick_gelu", vocab_size=TINY_VOCAB),
        "note": "",
    },
    # google/t5-v1_1-xxl encoder: width 4096, 64 heads x 64, gated-GELU 10240; 24 layers real.
    "t5_xxl_full": {
        "cfg": dict(d_model=4096, d_ff=10240, d_kv=64, num_heads=64, num_layers=2, vocab_size=32128),
        "note": "T5-XXL width (d_model 4096, 64 heads, d_ff 10240), 2 of 24 layers",
    },
    "t5_tiny": {
        "cfg": dict(d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=2, vocab_size=TINY_VOCAB),
        "note": "",
    },
    "t5_tiny_wide": {  # SD3: CLIP-L + CLIP-G embeddings (32 + 32) are padded to the T5 width
        "cfg": dict(d_model=64, d_ff=64, d_kv=8, num_heads=4, num_layers=2, vocab_size=TINY_VOCAB),
        "note": "",
    },
    # google/umt5-xxl encoder (Wan): as T5-XXL, vocabulary 256384.
    "umt5_xxl_full": {
        "cfg": dict(d_model=4096, d_ff=10240, d_kv=64, num_heads=64, num_layers=2, vocab_size=SHRUNK_VOCAB),
        "note": "UMT5-XXL width (d_model 4096, 64 heads, d_ff 10240), 2 of 24 layers, vocabulary 32768 of 256384",
    },
    "umt5_tiny": {
        "cfg": dict(d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=2, vocab_size=TINY_VOCAB),
        "note": "",
    },
    # google/gemma-2-2b(-it) (Sana, Lumina 2): hidden 2304, 8 heads x 256, 4 KV heads, MLP 9216, 26 layers.
    "gemma2_2b_full": {
        "cfg": dict(hidden_size=2304, intermediate_size=9216, num_hidden_layers=2, num_attention_heads=8,
                    num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256, vocab_size=SHRUNK_VOCAB),
        "note": "Gemma-2-2B width (hidden 2304, 8 heads x 256, MLP 9216), 2 of 26 layers, vocabulary 32768 of 256000",
    },
    "gemma2_tiny": {
        "cfg": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, vocab_size=TINY_VOCAB),
        "note": "",
    },
    # Qwen/Qwen2.5-VL-7B-Instruct (Qwen-Image): text hidden 3584, 28 heads, 4 KV heads, MLP 18944, 28 layers.
    "qwen2_5_vl_7b_full": {
        "cfg": dict(
            text_config=dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=2, num_attention_heads=28,
                             num_key_value_heads=4, vocab_size=SHRUNK_VOCAB,
                             rope_parameters=_rope(1e6, mrope_section=[16, 24, 24])),
            vision_config=dict(depth=1, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=3584,
                               fullatt_block_indexes=[0]),
        ),
        "note": "Qwen2.5-VL-7B text width (hidden 3584, 28 heads, MLP 18944), 2 of 28 layers, vocabulary 32768 "
                "of 152064; vision tower 1 block of width 64 (unused for text-to-image)",
    },
    "qwen2_5_vl_tiny": {
        "cfg": dict(
            text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                             num_key_value_heads=1, vocab_size=TINY_VOCAB,
                             rope_parameters=_rope(1e6, mrope_section=[2, 3, 3])),
            vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
                               fullatt_block_indexes=[0]),
        ),
        "note": "",
    },
    # Qwen/Qwen3-4B (Z-Image): hidden 2560, 32 heads x 128, 8 KV heads, MLP 9728, 36 layers.
    "qwen3_4b_full": {
        "cfg": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=2, num_attention_heads=32,
                    num_key_value_heads=8, head_dim=128, vocab_size=SHRUNK_VOCAB, rope_parameters=_rope(1e6)),
        "note": "Qwen3-4B width (hidden 2560, 32 heads x 128, MLP 9728), 2 of 36 layers, vocabulary 32768 of 151936",
    },
    "qwen3_tiny": {
        "cfg": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=16, vocab_size=TINY_VOCAB, rope_parameters=_rope(1e6)),
        "note": "",
    },
    # llava-llama-3-8b text model (HunyuanVideo): hidden 4096, 32 heads, 8 KV heads, MLP 14336, 32 layers.
    "llama3_8b_full": {
        "cfg": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=3, num_attention_heads=32,
                    num_key_value_heads=8, vocab_size=SHRUNK_VOCAB, rope_parameters=_rope(5e5)),
        "note": "Llama-3-8B width (hidden 4096, 32 heads, MLP 14336), 3 of 32 layers (the pipeline reads the "
                "third-last hidden state), vocabulary 32768 of 128320",
    },
    "llama3_tiny": {
        "cfg": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                    num_key_value_heads=1, vocab_size=TINY_VOCAB, rope_parameters=_rope(5e5)),
        "note": "",
    },
    # mistralai/Mistral-Small-3.1-24B (Flux.2): hidden 5120, 32 heads x 128, 8 KV heads, MLP 32768, 40 layers.
    "mistral3_small_full": {
        "cfg": dict(
            text_config=dict(hidden_size=5120, intermediate_size=2048, num_hidden_layers=30, num_attention_heads=32,
                             num_key_value_heads=8, head_dim=128, vocab_size=SHRUNK_VOCAB,
                             rope_parameters=_rope(1e9)),
            vision_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                               image_size=224, patch_size=14),
        ),
        "note": "Mistral-Small-3.1 text width (hidden 5120, 32 heads x 128), 30 of 40 layers (the pipeline stacks "
                "hidden states 10, 20 and 30), MLP 2048 of 32768, vocabulary 32768 of 131072; vision tower 1 "
                "block of width 64 (unused for text-to-image)",
    },
    "mistral3_tiny": {
        "cfg": dict(
            text_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=30, num_attention_heads=2,
                             num_key_value_heads=1, head_dim=8, vocab_size=TINY_VOCAB, rope_parameters=_rope(1e9)),
            vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                               image_size=28, patch_size=14),
        ),
        "note": "",
    },
}


def preset(name: str) -> dict[str, Any]:
    """The config overrides of a preset (a fresh dict)."""
    import copy

    return copy.deepcopy(dict(PRESETS[name]["cfg"]))


def preset_note(name: str) -> str:
    return PRESETS[name]["note"]


def _token_ids(tokenizer) -> dict[str, int]:
    ids = {}
    for key in ("pad", "bos", "eos"):
        ids[f"{key}_token_id"] = getattr(tokenizer, f"{key}_token_id", None)
    return ids


def _vocab_size(cfg: Mapping[str, Any]) -> int:
    if "text_config" in cfg:
        return cfg["text_config"]["vocab_size"]
    return cfg["vocab_size"]


def build_text_encoder(kind: str, overrides: Mapping[str, Any], tokenizer):
    """Build a random-weight text encoder of ``kind`` with config ``overrides`` and the tokenizer's ids.

    Tensors go to the current default device and dtype (the caller sets them). Raises ``ValueError`` if
    the tokenizer has more ids than the encoder's vocabulary.
    """
    import transformers

    if kind not in KINDS:
        raise ValueError(f"unknown text encoder kind {kind!r}; known: {', '.join(KINDS)}")
    config_name, model_name, base = KINDS[kind]
    cfg = {**base, **overrides}
    vocab = _vocab_size(cfg)
    if len(tokenizer) > vocab:
        raise ValueError(f"tokenizer has {len(tokenizer)} ids but the {kind} encoder's vocabulary is {vocab}")
    ids = _token_ids(tokenizer)
    if "text_config" in cfg:
        cfg["text_config"] = {**cfg["text_config"], **ids}
        if kind != "mistral3":
            cfg["pad_token_id"] = ids["pad_token_id"]
    else:
        cfg.update(ids)
    config_cls = getattr(transformers, config_name)
    config = config_cls(**cfg)
    model_cls = getattr(transformers, model_name)
    model = model_cls(config)
    model.eval()
    model.requires_grad_(False)
    return model


_TOKENIZER_MAKERS = {
    "clip": "clip_tokenizer",
    "t5": "t5_tokenizer",
    "gemma": "gemma_tokenizer",
    "qwen2": "qwen_tokenizer",
    "qwen3": "qwen_tokenizer",
    "llama3": "llama3_tokenizer",
    "mistral": "mistral_tokenizer",
}


def build_tokenizer(style: str, max_length: int):
    """A locally made tokenizer of ``style`` (see :mod:`bcg_pipelines.tokenizers`) with ``model_max_length``."""
    toks = importlib.import_module(f"{__package__}.tokenizers")
    if style not in _TOKENIZER_MAKERS:
        raise ValueError(f"unknown tokenizer style {style!r}; known: {', '.join(_TOKENIZER_MAKERS)}")
    maker = getattr(toks, _TOKENIZER_MAKERS[style])
    if style == "qwen3":
        return maker(model_max_length=max_length, chat_template=toks.QWEN3_CHAT_TEMPLATE)
    return maker(model_max_length=max_length)
