"""bcg_diffusion.warmup on the GPU: later calls replay from their first call, outputs unchanged;
the capture breakdown in get_stats."""

import pytest
import torch

import bcg_diffusion as bcg
import bcg_pipelines as pipelines
from _pipes import build, call_kwargs, run

pytestmark = pytest.mark.gpu


def _shape(family):
    spec = pipelines.get_family(family)
    return dict(height=spec.tiny.height, width=spec.tiny.width)


def _warm_settings(family):
    call = call_kwargs(family, device="cuda")
    for name in ("generator", "num_inference_steps", "height", "width"):
        call.pop(name)
    return call


@pytest.mark.parametrize("family", ["flux", "pixart", "wan"])
def test_after_warmup_the_first_call_replays_and_outputs_are_unchanged(family):
    twin, warmed, plain = build(family), build(family), build(family)
    expected = run(twin, family)
    bcg.accelerate_pipeline(warmed)
    bcg.accelerate_pipeline(plain)
    report = bcg.warmup(warmed, [_shape(family)], **_warm_settings(family))
    assert report.captures >= 1, str(report)
    before = bcg.get_stats(warmed)
    out = run(warmed, family)
    after = bcg.get_stats(warmed)
    # every transformer call of the real run was served by a graph captured during warm-up
    assert after.misses == before.misses and after.captures == before.captures, (str(before), str(after))
    assert after.warmup_calls == before.warmup_calls and after.eager_calls == 0, str(after)
    assert after.hits > before.hits
    assert torch.equal(out, expected)
    assert torch.equal(run(plain, family), expected)  # the same pipeline without warm-up agrees
    for pipe in (warmed, plain):
        bcg.remove_acceleration(pipe)


def test_capture_phases_are_reported():
    family = "flux"
    pipe = build(family)
    bcg.accelerate_pipeline(pipe)
    run(pipe, family)
    stats = bcg.get_stats(pipe)
    entry = stats.entries[0]
    phases = dict(entry.capture_phases)
    for name in ("setup", "blas_workspace", "record", "instantiate", "accounting", "key", "static_inputs", "first_replay"):
        assert name in phases and phases[name] >= 0.0, phases
    inside = phases["setup"] + phases["record"] + phases["instantiate"] + phases["accounting"]
    assert inside == pytest.approx(entry.capture_time_s, rel=0.05, abs=2e-3), phases
    assert phases["blas_workspace"] <= phases["setup"]
    assert stats.warmup_calls == 1 and "first calls" in str(stats)
    bcg.remove_acceleration(pipe)


def test_a_call_in_another_grad_mode_than_the_warm_up_warns_once():
    family = "pixart"
    pipe = build(family)
    bcg.accelerate_pipeline(pipe)
    bcg.warmup(pipe, [_shape(family)], **_warm_settings(family))  # outside inference_mode
    with pytest.warns(bcg.BCGCaptureWarning, match="only difference from a captured one is the grad mode") as caught:
        with torch.inference_mode():
            run(pipe, family)
            run(pipe, family)
    grad_mode = [w for w in caught if "grad mode" in str(w.message)]
    assert len(grad_mode) == 1 and "inference_mode=True" in str(grad_mode[0].message)
    bcg.remove_acceleration(pipe)
