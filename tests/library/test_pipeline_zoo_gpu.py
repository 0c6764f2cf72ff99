"""The pipeline zoo on the GPU: a fast subset of diffusers pipeline classes, one of each of 15 family groups, each
accelerated with ``accelerate_pipeline`` and called as the probe calls it (three seeds, two outputs per prompt, a
step-end callback that edits the latents), every output bitwise equal to an eager twin built with the same seed, and
every transformer call after a key's first served by replayed graphs. The whole zoo runs in
``scripts/pipeline_zoo_probe.py`` (docs/pipelines.md)."""

import pytest
import torch

from bcg_diffusion.benchmarks.zoo.pipeline_calls import Settings, probe_class
from bcg_pipelines import pipeline_zoo

pytestmark = pytest.mark.gpu

#: One class per family group, each taking a path of its own (masks, control images, reference latents in the
#: sequence, image latents on channels, per-frame timesteps, a ControlNet sharing the transformer's modules, PAG).
SUBSET = [
    "FluxFillPipeline",                      # flux: masked-image latents and the packed mask on channels
    "FluxKontextPipeline",                   # flux: reference-image tokens in the sequence
    "StableDiffusion3ControlNetPipeline",    # stable_diffusion_3: ControlNet residuals, batched CFG
    "PixArtSigmaPAGPipeline",                # pixart_alpha: perturbed-attention guidance, legacy callback
    "SanaSprintPipeline",                    # sana: guidance embedding, SCM scheduler
    "WanImageToVideoPipeline",               # wan: CLIP image embedding, image latents on channels
    "QwenImageEditPipeline",                 # qwenimage: Qwen2-VL processor, edit tokens in the sequence
    "LTXConditionPipeline",                  # ltx: image and video conditions as latent tokens
    "CogVideoXImageToVideoPipeline",         # cogvideo
    "ZImageControlNetPipeline",              # z_image: the ControlNet shares the transformer's modules
    "ChromaInpaintPipeline",                 # chroma
    "Flux2KleinPipeline",                    # flux2: Qwen3 text, two calls per step
    "HunyuanVideoFramepackPipeline",         # hunyuan_video: history latents, SigLIP image embedding
    "SkyReelsV2DiffusionForcingPipeline",    # skyreels_v2: per-frame timesteps
    "HunyuanDiTPipeline",                    # hunyuandit: BERT + T5, rotary tables per call
    "Cosmos2VideoToWorldPipeline",           # cosmos
]


@pytest.mark.survives_sabotage("fallback", "skip_segment", "stale_inputs",
                               reason="checks the subset's list of classes: no pipeline runs")
def test_the_subset_spans_at_least_ten_family_groups():
    groups = {pipeline_zoo.group_of(pipeline_zoo.get_case(name)) for name in SUBSET}
    assert len(groups) >= 10, sorted(groups)


@pytest.mark.parametrize("name", SUBSET)
def test_pipeline_replays_and_matches_its_eager_twin(name):
    result = probe_class(pipeline_zoo.get_case(name), Settings(torch.device("cuda"), torch.bfloat16))
    detail = f"{result.status} ({result.phase}: {result.error}) {result.reason}\n{(result.stats or {}).get('text')}"
    assert result.eager_repeatable, f"{name}: the eager twin does not repeat itself: {detail}"
    assert result.status == "replayed", detail
    compared = [c for c in result.calls if c.bitwise is not None]
    assert len(compared) >= 4, [(c.label, c.note) for c in result.calls]
    for call in compared:
        assert call.bitwise, f"{name}, call {call.label}: differs from the eager twin by {call.max_diff}"
    later = [c for c in compared if c.label in ("seed 2", "seed 3", "callback")]
    assert all(c.counters["hits"] > 0 and c.counters["eager_calls"] == 0 for c in later), \
        [(c.label, c.counters) for c in later]
    assert not result.accelerate_warnings, result.accelerate_warnings


# -- what the H100 probe of 2026-12-07 found (bench_results/pipeline_zoo_probe_2026-12-07_073011.md) -------------
#: Crashed in their eager twin (a case bug: Lucy's float32 video into a bf16 VAE, VQ-Diffusion's numpy output in
#: bf16), or ran every call eagerly (Lumina-Next: its rotary table on the CPU, now moved by the runner).
FIXED_REPLAYED = ["LucyEditPipeline", "VQDiffusionPipeline", "LuminaPipeline"]
#: Make a new KV-cache object per pipeline call: its step-0 call fills it (Qwen-Image 2.1) or returns it (Flux.2
#: Klein KV) and runs eagerly with one warning; the later steps read it and replay across objects.
KV_CACHES = {"Flux2KleinKVPipeline": "returns a Flux2KVCache object",
             "QwenImage21Pipeline": "changes its own input kv_cache.layer_caches[0].k"}


@pytest.mark.parametrize("name", FIXED_REPLAYED)
def test_formerly_crashing_or_eager_pipelines_replay(name):
    test_pipeline_replays_and_matches_its_eager_twin(name)


@pytest.mark.parametrize("name", sorted(KV_CACHES))
def test_kv_cache_pipelines_replay_their_cached_steps_and_warn_once_for_the_fill(name):
    result = probe_class(pipeline_zoo.get_case(name), Settings(torch.device("cuda"), torch.bfloat16))
    detail = f"{result.status} ({result.phase}: {result.error}) {result.reason}\n{(result.stats or {}).get('text')}"
    assert result.eager_repeatable and result.status == "partial", detail
    assert any(KV_CACHES[name] in reason for reason in result.eager_reasons), (result.eager_reasons, detail)
    compared = [c for c in result.calls if c.bitwise is not None]
    assert len(compared) >= 4 and all(c.bitwise for c in compared), [(c.label, c.max_diff) for c in compared]
    later = [c for c in compared if c.label in ("seed 2", "seed 3", "callback")]
    assert all(c.counters["hits"] > 0 for c in later), [(c.label, c.counters) for c in later]
    warned = [c.label for c in result.calls if KV_CACHES[name] in c.note]
    assert warned == ["seed 1"], [(c.label, c.note) for c in result.calls]


def test_moe_routing_with_atomic_adds_is_bitwise_under_deterministic_algorithms():
    """NucleusMoE adds its experts' outputs with scatter_add_ (atomics on CUDA): the H100 probe saw one call of five
    differ; under torch's deterministic algorithms the twin and the replays must agree bitwise."""
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        result = probe_class(pipeline_zoo.get_case("NucleusMoEImagePipeline"),
                             Settings(torch.device("cuda"), torch.bfloat16))
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    detail = f"{result.status} ({result.phase}: {result.error}) {result.reason}\n{(result.stats or {}).get('text')}"
    assert result.eager_repeatable and result.status in ("replayed", "partial"), detail
    compared = [c for c in result.calls if c.bitwise is not None]
    assert len(compared) >= 4 and all(c.bitwise for c in compared), [(c.label, c.max_diff, c.note) for c in compared]
    assert (result.stats or {}).get("hits", 0) > 0, detail
