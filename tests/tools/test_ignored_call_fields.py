"""``bcg_pipelines.ignored_call_fields``: what a pipeline call would set for nothing (issue 39, point 3).

Three checks: the answers on sample calls; the CFG rules against the ``__call__`` code of diffusers' pipelines;
and the tiny pipelines themselves, run with two different negative prompts: the outputs are equal exactly
where the function says the negative prompt is ignored.
"""

from __future__ import annotations

import inspect
import re

import pytest
import torch

import bcg_pipelines as pipelines
from bcg_pipelines.ignored import CFG_RULES


def test_flux_ignores_a_negative_prompt_without_true_cfg():
    ignored = pipelines.ignored_call_fields("flux", {"prompt": "p", "negative_prompt": "blurry", "guidance_scale": 3.5})
    assert list(ignored) == ["negative_prompt"]
    field = ignored["negative_prompt"]
    assert (field.setting, field.above) == ("true_cfg_scale", 1.0)
    assert "FluxPipeline uses negative_prompt only with classifier-free guidance" in field.reason
    assert "true_cfg_scale is 1.0" in field.reason  # the __call__ default
    assert pipelines.ignored_call_fields("flux", {"negative_prompt": "blurry", "true_cfg_scale": 2.0}) == {}


def test_true_cfg_without_a_negative_prompt_is_reported():
    ignored = pipelines.ignored_call_fields("flux", {"prompt": "p", "true_cfg_scale": 4.0})
    assert list(ignored) == ["true_cfg_scale"] and ignored["true_cfg_scale"].setting == "negative_prompt"
    assert pipelines.ignored_call_fields("flux", {"prompt": "p"}) == {}


@pytest.mark.parametrize("family, setting, off, on", [
    ("sd3", "guidance_scale", 1.0, 1.5), ("pixart", "guidance_scale", 1.0, 4.5), ("wan", "guidance_scale", 1.0, 5.0),
    ("qwenimage", "true_cfg_scale", 1.0, 4.0), ("zimage", "guidance_scale", 0.0, 0.5),
    ("chroma", "guidance_scale", 1.0, 5.0), ("hunyuanvideo", "true_cfg_scale", 1.0, 6.0),
])
def test_the_threshold_of_each_cfg_family(family, setting, off, on):
    call = {"prompt": "p", "negative_prompt": "n", "negative_prompt_2": None}
    assert list(pipelines.ignored_call_fields(family, {**call, setting: off})) == ["negative_prompt"]
    assert pipelines.ignored_call_fields(family, {**call, setting: on}) == {}


def test_a_keyword_the_pipeline_does_not_take():
    ignored = pipelines.ignored_call_fields("flux2", {"prompt": "p", "negative_prompt": "n"})
    assert list(ignored) == ["negative_prompt"]
    assert ignored["negative_prompt"] == ("Flux2Pipeline.__call__ takes no negative_prompt, so the pipeline would run "
                                          "without it", None, None)


def test_pipelines_classes_specs_and_accelerated_subclasses_answer_alike():
    import diffusers

    spec = pipelines.get_family("sd3")
    accelerated = type("AcceleratedStableDiffusion3Pipeline", (diffusers.StableDiffusion3Pipeline,),
                       {"__call__": lambda self, *args, **kwargs: None})
    call = {"negative_prompt": "n", "guidance_scale": 1.0}
    answers = [pipelines.ignored_call_fields(x, call) for x in ("sd3", spec, diffusers.StableDiffusion3Pipeline,
                                                                accelerated)]
    assert all(a == answers[0] for a in answers) and list(answers[0]) == ["negative_prompt"]
    with pytest.raises(ValueError, match="unknown family 'nope'"):
        pipelines.ignored_call_fields("nope", call)


# -- the rules against diffusers' code -------------------------------------------------------------------------
def cfg_code(cls) -> str:
    """The ``__call__`` source and the ``do_classifier_free_guidance`` property's, where the CFG test is."""
    code = inspect.getsource(cls.__call__)
    prop = getattr(cls, "do_classifier_free_guidance", None)
    if isinstance(prop, property):
        code += inspect.getsource(prop.fget)
    return code


@pytest.mark.parametrize("family", pipelines.list_families())
def test_every_family_has_a_rule_read_from_its_pipeline_code(family):
    cls = pipelines.get_family(family).pipeline_class
    if "negative_prompt" not in inspect.signature(cls.__call__).parameters:
        assert cls.__name__ not in CFG_RULES  # answered from the signature
        return
    rule = CFG_RULES[cls.__name__]
    code = cfg_code(cls)
    if rule.setting == "true_cfg_scale":
        pattern = rf"do_true_cfg = true_cfg_scale > {rule.above:g}\b"
    else:
        pattern = rf"(do_classifier_free_guidance = guidance_scale|return self\._guidance_scale) > {rule.above:g}\b"
    assert re.search(pattern, code), f"{cls.__name__}: no {pattern!r} in its __call__ code"


# -- the tiny pipelines, run --------------------------------------------------------------------------------------
#: Flux2Pipeline takes no negative prompt at all (the signature test above covers it).
IMAGE_FAMILIES = ["flux", "sd3", "qwenimage", "zimage"]  # each kind of rule: true CFG, > 1 (batched), > 0


def latents(pipe, spec, **call):
    call = {"prompt": "a fox", "num_inference_steps": 2, "height": spec.tiny.height, "width": spec.tiny.width,
            "output_type": "latent", "generator": torch.Generator("cpu").manual_seed(0), **call}
    call, _ = pipelines.fit_call(pipe, call)
    with torch.no_grad():
        out = pipelines.generated(pipe(**call))
    assert torch.isfinite(out).all()  # (Qwen-Image's tiny pipeline gives NaN in 1 step: 2 steps here)
    return out


@pytest.mark.parametrize("family", IMAGE_FAMILIES)
def test_the_output_changes_with_the_negative_prompt_exactly_where_it_is_not_ignored(family):
    spec = pipelines.get_family(family)
    pipe = pipelines.build_pipeline(family, "tiny", device="cpu")
    rule = CFG_RULES.get(spec.pipeline_class_name)
    settings = [{}] if rule is None else [{rule.setting: rule.above}, {rule.setting: rule.above + 2.0}]
    for setting in settings:
        call = {**dict(spec.call_kwargs), **setting}
        a, b = ({**call, "negative_prompt": text} for text in ("blurry, dark", "a cat in a hat"))
        ignored = "negative_prompt" in pipelines.ignored_call_fields(pipe, a)
        same = torch.equal(latents(pipe, spec, **a), latents(pipe, spec, **b))
        assert same == ignored, f"{family} {setting}: outputs {'equal' if same else 'differ'}, ignored={ignored}"
