"""Locally made tokenizers for the families' text encoders.

No tokenizer can be downloaded here, so each one is built in code from a fixed English word list:

* byte-level BPE (Qwen2/Qwen3, Llama-3 and Mistral styles), CLIP BPE and Gemma BPE get merges from the
  ``tokenizers`` package's BPE trainer run over the word list, so every listed word is one token (as in the real
  vocabularies) and any other text still encodes (byte-level alphabet, or byte fallback for Gemma);
* T5/UMT5 get a Unigram vocabulary of whole words plus single characters.

Contract: the same call returns an equal tokenizer in every process (no hash-order or trainer
randomness); vocabularies stay below :data:`MAX_VOCAB` ids, so every text encoder built by
:mod:`bcg_pipelines.text_encoders` fits them. Prompts tokenize differently from the real models (other ids,
other splits of rare words); special tokens, padding sides, chat templates and maximum lengths follow
what each pipeline relies on. All tokenizers survive ``save_pretrained`` / ``from_pretrained``.
"""

from __future__ import annotations

import functools
import json

from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers, processors, trainers
from tokenizers.models import BPE

__all__ = [
    "MAX_VOCAB",
    "WORDS",
    "clip_tokenizer",
    "gemma_tokenizer",
    "llama3_tokenizer",
    "mistral_tokenizer",
    "qwen_tokenizer",
    "t5_tokenizer",
]

#: Every tokenizer made here has fewer ids than this (text encoders use at least this vocab size).
MAX_VOCAB = 4096

# Common English words plus the words of the prompt templates and system prompts hard-coded in the
# pipelines (Qwen-Image, HunyuanVideo, Sana, Lumina 2, Flux.2), so templates tokenize to about as
# many tokens as with the real vocabularies.
_WORD_TEXT = """
a an the and or but if of to in on at by for with from into onto over under above below between
behind beside near far up down out off through across around about after before during while
is are was were be been being am do does did done have has had having can could will would shall
should may might must not no yes all any each every some many much more most few less least other
this that these those it its they them their there here where when what which who whom whose why how
i me my mine you your yours he him his she her hers we us our ours one two three four five six seven
eight nine ten first second third last next new old young big small large little long short tall
high low wide narrow thick thin heavy light dark bright soft hard smooth rough warm cold hot cool wet
dry clean dirty full empty open closed round square flat sharp
red orange yellow green blue purple pink brown black white gray grey gold golden silver colorful
color colors colour shape shapes size sizes texture textures quantity text spatial relationships
relationship object objects background foreground image images picture photo photograph video videos
frame frames scene scenes view camera angle angles movement movements transition transitions style
atmosphere environment lighting light shadow shadows detail details detailed detailing describe
description descriptions main content theme following aspects action actions event events behavior
behaviors behaviours temporal physical change changes used assistant user system designed generate
generating generated superior degree alignment based textual prompt prompts given enhanced provide
provides visual suitable evaluate level simple focus adding specifics create vivid concrete already
refine enhance existing slightly without overcomplicating examples transform below only avoid
including additional commentary evaluations please reasons reasoning structured responses response
relationship attribution speculation ai assistant expert instruction instructions
cat cats dog dogs bird birds horse fish animal animals person people man woman men women child
children boy girl baby face faces eye eyes hair hand hands head body dress shirt hat coat shoes
house home building buildings city street streets road car cars bus train boat ship plane bike
tree trees flower flowers grass garden forest park field mountain mountains hill river lake sea ocean
beach sand water rain snow sky cloud clouds sun moon star stars night day morning evening sunset
sunrise dusk dawn window windowsill door wall floor roof room kitchen table chair bed book books cup
glass bottle food apple cake bread pizza fruit coffee tea lamp lamps clock phone computer screen
sign signs painting portrait landscape art artwork drawing sketch illustration render rendering
cinematic realistic photorealistic high quality resolution beautiful pretty cute ugly strange
fluffy furry sleeping sitting standing walking running flying swimming jumping playing eating
holding looking smiling reading wearing riding driving dancing singing talking walks walk run sits
peacefully curled shaped warm sunny blooming surrounded pots bustling glowing street crowd diverse
clothing double decker passing towering skyscrapers lights neon glowing futuristic ancient modern
vintage retro digital oil watercolor pencil cartoon anime fantasy magic magical dragon robot castle
space planet galaxy universe world nature life love happy sad calm quiet loud fast slow very really
just also too then than so as like such same different well good bad best better great
"""

_EXTRA_WORDS = "Describe Given Please User Here You Enhanced Prompt Start If Evaluate Output Rules"


def _word_list() -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for word in _WORD_TEXT.split() + _EXTRA_WORDS.split():
        seen.setdefault(word, None)
    return tuple(seen)


#: The words every tokenizer keeps as single tokens (lower case; byte-level styles also capitalised).
WORDS: tuple[str, ...] = _word_list()

# The pre-tokenizer regex of GPT-4-like byte-level BPE vocabularies (Qwen2, Llama-3, Tekken).
_BYTE_LEVEL_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


# The trainer gives ``end_of_word_suffix`` symbols ids in hash-map order (tie-breaks then differ from
# process to process), so a word's last character is handed to it as one private-use character instead.
_END_OF_WORD_BASE = 0xF0000


def _train_bpe(words: list[str], end_of_word_suffix: str | None = None) -> list[tuple[str, str]]:
    """BPE merges, learnt by the ``tokenizers`` package's trainer, that make every word one symbol.

    Each word is one unit (no pre-tokenizer) of frequency 1; training goes on until no pair is left.
    With ``end_of_word_suffix`` a word's last character is the symbol ``char + suffix`` (CLIP's
    ``</w>``). Ties break on the pairs' ids, which follow the sorted alphabet and the merge order, so
    the result is the same in every process.
    """
    if end_of_word_suffix:
        words = [w[:-1] + chr(_END_OF_WORD_BASE + ord(w[-1])) for w in words]
    backend = Tokenizer(BPE())
    trainer = trainers.BpeTrainer(vocab_size=1_000_000, min_frequency=0, show_progress=False)  # no size limit
    backend.train_from_iterator(words, trainer)
    merges = json.loads(backend.to_str())["model"]["merges"]

    def symbol(text: str) -> str:
        return "".join(chr(ord(c) - _END_OF_WORD_BASE) + end_of_word_suffix if ord(c) >= _END_OF_WORD_BASE else c
                       for c in text)

    return [(symbol(a), symbol(b)) for a, b in merges]


def _bpe_vocab(alphabet: list[str], merges: list[tuple[str, str]], first: list[str], last: list[str]):
    vocab: dict[str, int] = {}
    for tok in [*first, *alphabet, *(a + b for a, b in merges), *last]:
        if tok not in vocab:
            vocab[tok] = len(vocab)
    if len(vocab) >= MAX_VOCAB:
        raise RuntimeError(f"local vocabulary too large ({len(vocab)} >= {MAX_VOCAB})")
    return vocab


def _byte_level_words() -> list[str]:
    out: dict[str, None] = {}
    for w in WORDS:
        for v in (w, w.capitalize()):
            out.setdefault(v, None)
            out.setdefault(" " + v, None)
    # Separators the templates use often.
    for extra in ("\n", "\n\n", ":", ",", ".", " <", ">", "{}", " {}"):
        out.setdefault(extra, None)
    return list(out)


@functools.lru_cache(maxsize=None)
def _byte_level_model() -> tuple[dict[str, int], list[tuple[str, str]]]:
    pre = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_BYTE_LEVEL_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    chunks: dict[str, None] = {}
    for w in _byte_level_words():
        for piece, _ in pre.pre_tokenize_str(w):
            chunks.setdefault(piece, None)
    merges = _train_bpe(list(chunks))
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = _bpe_vocab(alphabet, merges, [], [])
    return vocab, merges


def _bytes_backend(specials: list[str]) -> tuple[Tokenizer, dict[str, int]]:
    """A byte-level BPE ``tokenizers.Tokenizer`` (GPT-4-style split) with ``specials`` appended."""
    vocab, merges = _byte_level_model()
    vocab = dict(vocab)
    for tok in specials:
        vocab.setdefault(tok, len(vocab))
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_BYTE_LEVEL_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok, vocab


# --------------------------------------------------------------------------------------------- CLIP


@functools.lru_cache(maxsize=None)
def _clip_model() -> tuple[dict[str, int], list[tuple[str, str]]]:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    words = sorted({w.lower() for w in WORDS if w.isalpha()})
    merges = _train_bpe(words, end_of_word_suffix="</w>")
    vocab = _bpe_vocab(alphabet + [a + "</w>" for a in alphabet], merges, [], ["<|startoftext|>", "<|endoftext|>"])
    return vocab, list(merges)


def clip_tokenizer(model_max_length: int = 77):
    """A ``CLIPTokenizer`` (BPE with ``</w>``, lower-casing, bos/eos/pad like CLIP; bos/eos are the last ids)."""
    from transformers import CLIPTokenizer

    vocab, merges = _clip_model()
    return CLIPTokenizer(
        vocab=dict(vocab),
        merges=list(merges),
        model_max_length=model_max_length,
        padding_side="right",
    )


# ------------------------------------------------------------------------------------------ T5/UMT5


@functools.lru_cache(maxsize=None)
def _unigram_vocab() -> tuple[tuple[str, float], ...]:
    pieces: dict[str, float] = {"<pad>": 0.0, "</s>": 0.0, "<unk>": 0.0, "▁": -3.0}
    chars = [chr(c) for c in range(33, 127)]
    for c in chars:
        pieces.setdefault(c, -10.0)
        pieces.setdefault("▁" + c, -10.5)
    for rank, w in enumerate(WORDS):
        for v in (w, w.capitalize()):
            pieces.setdefault("▁" + v, -2.0 - rank * 1e-4)
            pieces.setdefault(v, -6.0 - rank * 1e-4)
    return tuple(pieces.items())


def t5_tokenizer(model_max_length: int = 512):
    """A ``T5Tokenizer`` (Unigram, ``<pad>``=0, ``</s>``=1 appended, ``<unk>``=2) for T5 and UMT5 encoders."""
    from transformers import T5Tokenizer

    return T5Tokenizer(
        vocab=list(_unigram_vocab()),
        extra_ids=0,
        model_max_length=model_max_length,
        padding_side="right",
    )


# -------------------------------------------------------------------------------------------- Gemma

_GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
_GEMMA_TURN = ["<start_of_turn>", "<end_of_turn>"]


@functools.lru_cache(maxsize=None)
def _gemma_model() -> tuple[dict[str, int], list[tuple[str, str]]]:
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    alphabet = ["▁"] + [chr(c) for c in range(33, 127)]
    words: dict[str, None] = {}
    for w in WORDS:
        for v in (w, w.capitalize()):
            words.setdefault("▁" + v, None)
            words.setdefault(v, None)
    merges = _train_bpe(list(words))
    vocab = _bpe_vocab(alphabet, merges, _GEMMA_SPECIALS + _GEMMA_TURN + byte_tokens, [])
    return vocab, list(merges)


def gemma_tokenizer(model_max_length: int = 8192):
    """A ``GemmaTokenizer`` (SentencePiece-style BPE with byte fallback; adds ``<bos>``; pads right)."""
    from transformers import GemmaTokenizer

    vocab, merges = _gemma_model()
    return GemmaTokenizer(
        vocab=dict(vocab),
        merges=list(merges),
        add_bos_token=True,
        add_eos_token=False,
        model_max_length=model_max_length,
        padding_side="right",
        extra_special_tokens=list(_GEMMA_TURN),
    )


# ------------------------------------------------------------------------------------ Qwen2 / Qwen3

_QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

# A Qwen3-like chat template: the parts Z-Image relies on (user turn, generation prompt, thinking switch).
QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{ '<think>\n\n</think>\n\n' }}{%- endif -%}"
    "{%- endif -%}"
)


def qwen_tokenizer(model_max_length: int = 32768, chat_template: str | None = None):
    """A ``Qwen2Tokenizer`` (byte-level BPE, ``<|endoftext|>`` pad/eos, ``<|im_start|>``/``<|im_end|>``).

    With the local vocabulary the Qwen-Image system prefix tokenizes to 34 tokens, the number the pipeline
    drops (``prompt_template_encode_start_idx``), as with the real Qwen2.5 vocabulary.
    """
    from transformers import Qwen2Tokenizer

    vocab, merges = _byte_level_model()
    kwargs = {}
    if chat_template is not None:
        kwargs["chat_template"] = chat_template
    tok = Qwen2Tokenizer(
        vocab=dict(vocab),
        merges=list(merges),
        model_max_length=model_max_length,
        padding_side="right",
        extra_special_tokens=_QWEN_SPECIALS[1:],
        **kwargs,
    )
    return tok


# ------------------------------------------------------------------------------------------ Llama-3

_LLAMA3_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<pad>",
]


def llama3_tokenizer(model_max_length: int = 8192):
    """A Llama-3-style ``PreTrainedTokenizerFast`` (byte-level BPE, ``<|begin_of_text|>`` prepended, header tokens)."""
    from transformers import PreTrainedTokenizerFast

    backend, vocab = _bytes_backend(_LLAMA3_SPECIALS)
    bos = "<|begin_of_text|>"
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token="<|end_of_text|>",
        pad_token="<pad>",
        model_max_length=model_max_length,
        padding_side="right",
        extra_special_tokens=["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    )


# ---------------------------------------------------------------------------------- Mistral (Tekken)

_MISTRAL_SPECIALS = [
    "<unk>",
    "<s>",
    "</s>",
    "<pad>",
    "[INST]",
    "[/INST]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[IMG]",
]

# A Mistral-Small-3.1-like chat template; message content may be a string or a list of typed parts.
MISTRAL_CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}{%- set text = message['content'] -%}"
    "{%- else -%}{%- set text = message['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('') -%}{%- endif -%}"
    "{%- if message['role'] == 'system' -%}{{ '[SYSTEM_PROMPT]' + text + '[/SYSTEM_PROMPT]' }}"
    "{%- elif message['role'] == 'user' -%}{{ '[INST]' + text + '[/INST]' }}"
    "{%- else -%}{{ text + eos_token }}{%- endif -%}"
    "{%- endfor -%}"
)


def mistral_tokenizer(model_max_length: int = 131072):
    """A Mistral-style ``PreTrainedTokenizerFast`` (byte-level BPE, ``[INST]``/``[SYSTEM_PROMPT]`` chat template).

    Stands in for the ``PixtralProcessor`` of Flux.2: the pipeline only calls ``apply_chat_template`` on
    text conversations, which the tokenizer does the same way.
    """
    from transformers import PreTrainedTokenizerFast

    backend, _ = _bytes_backend(_MISTRAL_SPECIALS)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=model_max_length,
        padding_side="left",
        chat_template=MISTRAL_CHAT_TEMPLATE,
        extra_special_tokens=_MISTRAL_SPECIALS[4:],
    )
