"""CPU tests of pipelines/: registry, tiny pipelines end to end, determinism, errors, load/save, smoke script."""

from __future__ import annotations

import importlib
import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import bcg_pipelines as P
from bcg_pipelines import tokenizers as T

from _scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = [
    "flux", "sd3", "pixart", "sana", "wan", "qwenimage", "hunyuanvideo",
    "ltx", "cogvideox", "lumina2", "zimage", "chroma", "flux2",
]
PROMPT = "a photo of a cat sitting on a table"
STEPS = 2

# Transformer parameter counts of the published configs (as counted by describe()).
FULL_PARAMS = {
    "flux": 11_901_408_320,
    "sd3": 2_243_171_520,
    "pixart": 610_856_096,
    "sana": 1_604_462_752,
    "wan": 1_418_996_800,
    "qwenimage": 20_430_401_088,
    "hunyuanvideo": 12_821_012_544,
    "ltx": 1_923_385_472,
    "cogvideox": 1_693_783_872,
    "lumina2": 2_609_769_152,
    "zimage": 6_154_908_736,
    "chroma": 8_899_983_424,
    "flux2": 32_223_281_152,
}


@functools.lru_cache(maxsize=None)
def built(family: str, seed: int = 0):
    """One tiny CPU pipeline per (family, seed) for the whole module."""
    return P.build_pipeline(family, "tiny", device="cpu", seed=seed)


def call_kwargs(family: str) -> dict:
    kw = P.get_family(family).default_call("tiny")
    kw["num_inference_steps"] = STEPS
    return kw


def generate(pipe, family: str, output_type: str = "np", **extra):
    kw = call_kwargs(family)
    kw.update(extra)
    out = pipe(prompt=PROMPT, generator=torch.Generator("cpu").manual_seed(0), output_type=output_type, **kw)
    return out.frames if P.get_family(family).is_video else out.images


def as_array(result) -> np.ndarray:
    if isinstance(result, np.ndarray):
        return result
    if isinstance(result, torch.Tensor):
        return result.float().numpy()
    if isinstance(result, list):
        return np.stack([as_array(r) for r in result])
    return np.asarray(result)


# ----------------------------------------------------------------------------------------- registry


def test_list_families_names_in_order():
    assert P.list_families() == FAMILIES


def test_specs_are_consistent():
    for name in FAMILIES:
        spec = P.get_family(name)
        assert spec.name == name
        assert spec.cfg_mode in P.CFG_MODES
        assert spec.pipeline_class.__name__ == spec.pipeline_class_name
        assert spec.transformer_class.__name__ == spec.transformer_class_name
        for size in P.SIZES:
            sz = spec.size(size)
            P.validate_shape(spec, sz.height, sz.width, sz.num_frames)
            assert (sz.num_frames is not None) == spec.is_video


def test_describe_full_counts_and_text():
    for name in FAMILIES:
        d = P.describe(name)
        assert d.transformer_params == FULL_PARAMS[name], name
        text = str(d)
        assert d.pipeline_class in text and d.transformer_class in text and d.cfg_mode in text
        assert f"{d.height}x{d.width}" in text
    tiny = P.describe("flux", size="tiny")
    assert 0 < tiny.transformer_params < 1_000_000
    assert P.transformer_param_count("wan", "full") == FULL_PARAMS["wan"]


def test_unknown_family_errors_list_known_names():
    for call in (lambda: P.get_family("nope"), lambda: P.build_pipeline("nope"), lambda: P.describe("nope"),
                 lambda: P.validate_shape("nope", 64, 64), lambda: P.check_call("nope")):
        with pytest.raises(ValueError) as exc:
            call()
        msg = str(exc.value)
        assert "unknown family 'nope'" in msg
        assert "known families: " + ", ".join(FAMILIES) in msg


def test_bad_size_name():
    with pytest.raises(ValueError, match=r"unknown size 'huge' for family 'flux'; known sizes: tiny, full"):
        P.build_pipeline("flux", size="huge")


@pytest.mark.parametrize(
    "family, height, width, frames, pattern",
    [
        ("flux", 1000, 1024, None, r"height=1000 .* multiples of 16 \(VAE scale factor 8 x patch size 2\)"),
        ("sd3", 1024, 1000, None, r"width=1000 .* multiples of 16"),
        ("sana", 1000, 1024, None, r"multiples of 32 \(VAE scale factor 32 x patch size 1\)"),
        ("ltx", 496, 704, 9, r"multiples of 32"),
        ("wan", 480, 832, 10, r"frames=10 .* \(frames - 1\) % 4 == 0 .* e\.g\. 1, 5, 9"),
        ("ltx", 512, 704, 10, r"\(frames - 1\) % 8 == 0 .* e\.g\. 1, 9, 17"),
        ("cogvideox", 480, 720, 48, r"\(frames - 1\) % 4 == 0"),
        ("hunyuanvideo", 720, 1280, 0, r"\(frames - 1\) % 4 == 0"),
        ("flux", 1024, 1024, 5, r"frames=5 .* makes images"),
        ("wan", -16, 832, 9, r"positive multiples of 16"),
    ],
)
def test_impossible_shapes_are_rejected(family, height, width, frames, pattern):
    with pytest.raises(ValueError, match=pattern):
        P.validate_shape(family, height, width, frames)


def test_check_call_defaults_and_validation():
    assert P.check_call("flux") == {"height": 1024, "width": 1024}
    assert P.check_call("wan", size="tiny") == {"height": 32, "width": 32, "num_frames": 9}
    assert P.check_call("ltx", num_frames=17) == {"height": 512, "width": 704, "num_frames": 17}
    assert P.check_call("qwenimage", height=512, width=768) == {"height": 512, "width": 768}
    with pytest.raises(ValueError, match="frames=12"):
        P.check_call("wan", num_frames=12)
    P.validate_shape("flux", 512, 768, 1)


def test_plan_call_puts_values_into_the_family_default():
    call = P.plan_call("qwenimage", "tiny", prompt="x", guidance=2.0, steps=3)
    assert call == {"prompt": "x", "height": 64, "width": 64, "num_inference_steps": 3, "true_cfg_scale": 2.0,
                    "negative_prompt": " "}
    assert P.plan_call("wan", "tiny", prompt="x", num_frames=5)["num_frames"] == 5
    assert P.plan_call(None, prompt="x", width=64, guidance=1.0) == {"prompt": "x", "width": 64, "guidance_scale": 1.0}
    with pytest.raises(ValueError, match="multiples of 16"):
        P.plan_call("flux", "tiny", prompt="x", height=65)


def test_fit_call_adapts_to_the_pipeline_signature():
    call, dropped = P.fit_call(built("pixart"), {"prompt": "x"}, batch=2, exact_shape=True, clean_caption=False)
    assert call == {"prompt": "x", "num_images_per_prompt": 2, "use_resolution_binning": False, "clean_caption": False}
    assert dropped == []
    call, dropped = P.fit_call(built("wan"), {"prompt": "x", "no_such_kwarg": 1}, batch=3, exact_shape=True)
    assert call == {"prompt": "x", "num_videos_per_prompt": 3} and dropped == ["no_such_kwarg"]


def test_generated_reads_images_frames_and_latents():
    assert P.generated(SimpleNamespace(images=[1], frames=None)) == [1]
    assert P.generated(SimpleNamespace(images=None, frames=[2])) == [2]
    assert P.generated(([3],)) == [3]


def test_family_of_unknown_object():
    with pytest.raises(ValueError, match="no known family uses transformer class Linear"):
        P.family_of(torch.nn.Linear(2, 2))


# ------------------------------------------------------------------------------------- tokenizers


def test_template_prefixes_match_pipeline_crop_indices():
    # Qwen-Image drops the first 34 template tokens, HunyuanVideo crops 95: the local vocabularies agree.
    q = T.qwen_tokenizer()
    prefix = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
              "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n")
    assert len(q(prefix).input_ids) == 34
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE

    ll = T.llama3_tokenizer()
    ids = ll(DEFAULT_PROMPT_TEMPLATE["template"].format("")).input_ids
    assert len(ids) - 1 == DEFAULT_PROMPT_TEMPLATE["crop_start"] == 95  # minus the trailing <|eot_id|>


def test_tokenizers_encode_words_whole_and_fit_vocab():
    makers = [T.clip_tokenizer, T.t5_tokenizer, T.gemma_tokenizer, T.qwen_tokenizer, T.llama3_tokenizer,
              T.mistral_tokenizer]
    for make in makers:
        tok = make()
        assert len(tok) <= T.MAX_VOCAB
        assert tok.pad_token_id is not None
        ids = tok("the cat", add_special_tokens=False).input_ids
        assert len(ids) == 2, (make.__name__, tok.convert_ids_to_tokens(ids))
        assert tok.decode(tok("Zebra-42 ünïcode!", add_special_tokens=False).input_ids).strip() != ""


def test_tokenizer_vocab_is_deterministic_across_processes():
    code = (
        "import hashlib, json; from bcg_pipelines import tokenizers as T; "
        "v, m = T._byte_level_model(); c, cm = T._clip_model(); g, gm = T._gemma_model(); "
        "print(hashlib.md5(json.dumps([v, m, c, cm, g, gm, T._unigram_vocab()]).encode()).hexdigest())"
    )
    digests = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                             check=True)
        digests.add(out.stdout.strip())
    assert len(digests) == 1


def test_chat_templates():
    q3 = P.build_pipeline("zimage").tokenizer
    text = q3.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True,
                                  enable_thinking=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    m = T.mistral_tokenizer()
    msgs = [[{"role": "system", "content": [{"type": "text", "text": "sys"}]},
             {"role": "user", "content": [{"type": "text", "text": "a cat"}]}]]
    assert m.apply_chat_template(msgs[0], tokenize=False) == "<s>[SYSTEM_PROMPT]sys[/SYSTEM_PROMPT][INST]a cat[/INST]"
    enc = m.apply_chat_template(msgs, tokenize=True, return_dict=True, return_tensors="pt", padding="max_length",
                                truncation=True, max_length=32)
    assert enc["input_ids"].shape == (1, 32) and enc["attention_mask"].shape == (1, 32)


# ----------------------------------------------------------------------------- tiny pipelines run

EXPECTED_CALLS = {"batched": (1, {2}), "two_calls": (2, {1}), "embedded": (1, {1}), "none": (1, {1})}


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_pipeline_end_to_end_deterministic(family):
    spec = P.get_family(family)
    pipe = built(family, 0)
    assert type(pipe).__name__ == spec.pipeline_class_name
    assert P.family_of(pipe) is spec and P.family_of(pipe.transformer) is spec
    assert P.family_of(type(pipe.transformer)) is spec

    batches: list[int] = []

    def hook(module, args, kwargs):
        x = kwargs.get("hidden_states", args[0] if args else None)
        batches.append(len(x) if isinstance(x, (list, tuple)) else int(x.shape[0]))

    handle = pipe.transformer.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        a = generate(pipe, family)
    finally:
        handle.remove()
    per_step, batch = EXPECTED_CALLS[spec.cfg_mode]
    assert len(batches) == per_step * STEPS and set(batches) == batch, (spec.cfg_mode, batches)

    sz = spec.tiny
    expected = (1, sz.num_frames, sz.height, sz.width, 3) if spec.is_video else (1, sz.height, sz.width, 3)
    assert a.shape == expected and a.dtype == np.float32
    assert np.isfinite(a).all() and 0.0 <= a.min() and a.max() <= 1.0

    # Same seed, separate build: bitwise the same output.
    b = generate(P.build_pipeline(family, "tiny", device="cpu", seed=0), family)
    assert np.array_equal(a, b)

    # Other seed: other weights, other output; default output_type (PIL) works too.
    other = generate(built(family, 1), family)
    assert not np.array_equal(other, a), "a different seed must change the output"
    c = generate(built(family, 1), family, output_type="pil")
    if spec.is_video:
        assert len(c) == 1 and len(c[0]) == sz.num_frames and c[0][0].size == (sz.width, sz.height)
    else:
        assert len(c) == 1 and c[0].size == (sz.width, sz.height)
    # the PIL images are the same generation as the float output, rounded to 8 bits as diffusers does
    assert np.array_equal(as_array(c), (other * 255).round().astype(np.uint8))


@pytest.mark.parametrize("family", ["flux", "wan"])
@pytest.mark.parametrize("output_type", ["pt", "latent"])
def test_other_output_types(family, output_type):
    spec = P.get_family(family)
    res = generate(built(family, 0), family, output_type=output_type)
    assert isinstance(res, torch.Tensor) and torch.isfinite(res).all()
    if output_type == "pt":
        sz = spec.tiny
        if spec.is_video:
            assert res.shape == (1, sz.num_frames, 3, sz.height, sz.width)
        else:
            assert res.shape == (1, 3, sz.height, sz.width)


def test_tiny_transformers_keep_structural_features():
    flux = built("flux").transformer
    assert len(flux.transformer_blocks) >= 1 and len(flux.single_transformer_blocks) >= 1
    assert flux.config.guidance_embeds and hasattr(flux.time_text_embed, "guidance_embedder")
    chroma = built("chroma").transformer
    assert len(chroma.transformer_blocks) >= 1 and len(chroma.single_transformer_blocks) >= 1
    assert hasattr(chroma, "distilled_guidance_layer")
    flux2 = built("flux2").transformer
    assert len(flux2.transformer_blocks) >= 1 and len(flux2.single_transformer_blocks) >= 1
    assert flux2.config.guidance_embeds
    hv = built("hunyuanvideo").transformer
    assert len(hv.transformer_blocks) >= 1 and len(hv.single_transformer_blocks) >= 1 and hv.config.guidance_embeds
    assert len(hv.context_embedder.token_refiner.refiner_blocks) >= 1
    sd3 = built("sd3").transformer
    assert sd3.transformer_blocks[0].use_dual_attention and not sd3.transformer_blocks[1].use_dual_attention
    assert sd3.transformer_blocks[-1].context_pre_only
    assert len(built("qwenimage").transformer.transformer_blocks) >= 2
    assert len(built("lumina2").transformer.context_refiner) >= 1
    assert len(built("zimage").transformer.noise_refiner) >= 1


def test_build_in_bf16_on_cpu_has_bf16_weights():
    pipe = P.build_pipeline("flux", "tiny", device="cpu", dtype=torch.bfloat16)
    for module in (pipe.transformer, pipe.vae, pipe.text_encoder, pipe.text_encoder_2):
        assert {p.dtype for p in module.parameters()} == {torch.bfloat16}
    assert torch.get_default_dtype() == torch.float32


# ------------------------------------------------------------------------------------- loading


def test_load_pipeline_offline_error_says_how_to_pass_a_local_path(tmp_path):
    code = "import bcg_pipelines as pipelines; pipelines.load_pipeline('made-up-org/no-such-model-1234', device='cpu')"
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode != 0
    assert "OSError: could not load pipeline 'made-up-org/no-such-model-1234'" in out.stderr
    assert "offline (HF_HUB_OFFLINE is set)" in out.stderr
    assert "Pass a local path instead" in out.stderr and "load_pipeline('/path/to/no-such-model-1234')" in out.stderr


@pytest.mark.parametrize("family", ["flux", "hunyuanvideo", "zimage"])
def test_save_and_load_round_trip(family, tmp_path):
    pipe = built(family, 0)
    pipe.save_pretrained(tmp_path)
    loaded = P.load_pipeline(tmp_path, device="cpu")
    loaded.set_progress_bar_config(disable=True)
    assert P.family_of(loaded).name == family
    assert type(loaded) is type(pipe)
    assert np.array_equal(generate(loaded, family), generate(pipe, family))
    again = P.load_pipeline(tmp_path, family=family, device="cpu", dtype=torch.float32)
    assert type(again) is type(pipe)


def test_loaded_weights_are_copied_out_of_the_mapped_file(tmp_path):
    """safetensors maps the file and returns views at 8-byte-aligned offsets; CPU GEMMs round differently
    on such operands, so load_pipeline copies them into torch's 64-byte-aligned memory."""
    built("flux", 0).save_pretrained(tmp_path)
    loaded = P.load_pipeline(tmp_path, device="cpu")
    misaligned = [
        f"{component}.{name}"
        for component, module in loaded.components.items() if isinstance(module, torch.nn.Module)
        for name, tensor in [*module.named_parameters(), *module.named_buffers()] if tensor.data_ptr() % 64
    ]
    assert misaligned == []


# --------------------------------------------------------------------------------- smoke script


@functools.lru_cache(maxsize=None)
def smoke_module():
    return importlib.import_module("bcg_diffusion.checks.smoke_full_pipelines")


def test_smoke_script_arguments_and_plan(capsys):
    smoke = smoke_module()
    args = smoke.parse_args([])
    assert args.family_list == FAMILIES and args.size == "full" and args.steps == 2
    assert smoke.parse_args(["--families", "wan, ltx"]).family_list == ["wan", "ltx"]
    with pytest.raises(SystemExit):
        smoke.parse_args(["--families", "flux,nope"])
    assert "known families" in capsys.readouterr().err
    plan = smoke.plan_for("ltx", smoke.parse_args([]))
    assert plan["call"]["num_frames"] == 17 and plan["call"]["height"] == 512 and plan["call"]["num_inference_steps"] == 2
    assert smoke.plan_for("qwenimage", args)["call"]["negative_prompt"] == " "
    assert smoke.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    for name in FAMILIES:
        assert f"{name}: build size=full" in out


def test_smoke_script_runs_tiny_on_cpu(tmp_path):
    smoke = smoke_module()
    out = tmp_path / "smoke"
    assert smoke.main(["--size", "tiny", "--device", "cpu", "--families", "zimage,sd3", "--out", str(out)]) == 0
    data = json.loads(Path(f"{out}.json").read_text())
    assert [r["family"] for r in data["results"]] == ["zimage", "sd3"]
    assert all(r["ok"] for r in data["results"])
    sd3 = data["results"][1]
    assert sd3["transformer_calls_per_step"] == 1 and sd3["transformer_batch"] == [2]
    assert sd3["output_shape"] == [1, 64, 64, 3]
    md = Path(f"{out}.md").read_text()
    assert "| zimage | yes |" in md and "| sd3 | yes |" in md


def test_smoke_script_records_failures_and_goes_on(tmp_path, monkeypatch):
    smoke = smoke_module()
    real_build = P.build_pipeline

    def flaky(family, *a, **k):
        if family == "flux":
            raise RuntimeError("boom")
        return real_build(family, *a, **k)

    monkeypatch.setattr(P, "build_pipeline", flaky)
    out = tmp_path / "smoke"
    assert smoke.main(["--size", "tiny", "--device", "cpu", "--families", "flux,zimage", "--out", str(out)]) == 1
    data = json.loads(Path(f"{out}.json").read_text())
    assert data["results"][0]["ok"] is False and "RuntimeError: boom" in data["results"][0]["error"]
    assert data["results"][1]["ok"] is True


def test_docs_list_every_family():
    text = (ROOT / "docs" / "pipelines.md").read_text()
    for name in FAMILIES:
        assert f"`{name}`" in text
