"""bcg_diffusion.warmup on the CPU: argument checks, the report, and that later calls are unchanged.

Without CUDA acceleration is a no-op, so these tests prove the state handling (generators, global
RNG, schedulers, step caches) and the plumbing; capture and replay after a warm-up are proven in
test_warmup_gpu.py.
"""

import pytest
import torch

import bcg_diffusion
import bcg_pipelines as pipelines
from _pipes import build, call_kwargs, with_cache


@pytest.fixture(scope="module")
def pixart():
    return build("pixart", device="cpu")  # float32, progress bars off


def _shape(family):
    spec = pipelines.get_family(family)
    return dict(height=spec.tiny.height, width=spec.tiny.width)


def _latents(pipe, family, **overrides):
    with torch.no_grad():
        return pipe(**call_kwargs(family, device="cpu", **overrides))[0].clone()


def test_warmup_leaves_the_next_call_unchanged(pixart):
    before = _latents(pixart, "pixart")
    timesteps = pixart.scheduler.timesteps.clone()
    report = bcg_diffusion.warmup(pixart, [_shape("pixart")], prompt="another prompt", output_type="latent")
    assert torch.equal(pixart.scheduler.timesteps, timesteps)  # 2 warm-up steps left no trace
    assert torch.equal(_latents(pixart, "pixart"), before)
    assert len(report.shapes) == 1 and report.captures == 0 and report.total_s > 0
    assert "warm-up: 1 shape(s), 0 graph key(s) captured" in str(report)
    assert report.shapes[0].settings["height"] == _shape("pixart")["height"]


def test_warmup_restores_the_global_rng(pixart):
    """A call without a generator draws from the global RNG: warm-up must not advance it."""
    torch.manual_seed(123)
    plain = _latents(pixart, "pixart", generator=None)
    torch.manual_seed(123)
    bcg_diffusion.warmup(pixart, [_shape("pixart")], output_type="latent")
    assert torch.equal(_latents(pixart, "pixart", generator=None), plain)


def test_warmup_resets_step_cache_state():
    pipe = pipelines.build_pipeline("flux", size="tiny", device="cpu", dtype=torch.float32, seed=0)
    pipe.set_progress_bar_config(disable=True)
    with_cache(pipe, "flux", "fbc", steps=3)
    before = _latents(pipe, "flux")
    bcg_diffusion.warmup(pipe, [_shape("flux")], prompt="x", negative_prompt=" ", true_cfg_scale=2.0,
                         output_type="latent", num_inference_steps=1)
    assert torch.equal(_latents(pipe, "flux"), before)


@pytest.mark.parametrize(
    "shapes, kwargs, error, text",
    [
        ([], {}, TypeError, "non-empty list of dicts"),
        ({"height": 64, "width": 64}, {}, TypeError, "non-empty list of dicts"),
        ([64], {}, TypeError, "each shape must be a dict"),
        ([{"height": 64}], {"num_inference_steps": 0}, ValueError, "num_inference_steps must be an int >= 1"),
        ([{"height": 64}], {"generator": torch.Generator()}, ValueError, "its own generator"),
        ([{"height": 64}], {"latents": torch.zeros(1)}, ValueError, "draws its own noise"),
        ([{"heigth": 64}], {}, TypeError, "takes no 'heigth'"),
    ],
)
def test_warmup_rejects_bad_arguments_before_any_call(pixart, shapes, kwargs, error, text):
    calls = []
    handle = pixart.transformer.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(error, match=text):
            bcg_diffusion.warmup(pixart, shapes, **kwargs)
    finally:
        handle.remove()
    assert calls == []


def test_warmup_needs_a_pipeline():
    with pytest.raises(TypeError, match="needs a diffusers pipeline"):
        bcg_diffusion.warmup(torch.nn.Linear(2, 2), [dict(height=64, width=64)])
