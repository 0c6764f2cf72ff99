"""bcg_diffusion.warmup on the GPU: later calls replay from their first call, outputs unchanged;
the capture breakdown in get_stats."""

import pytest
import torch

import bcg_diffusion as bcg
import bcg_pipelines as pipelines
from _pipes import build, call_kwargs, run, transformer_calls
from _replay import assert_replayed, counters

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
    before = counters(warmed)
    out = run(warmed, family)
    # every transformer call of the real run was served by a graph captured during warm-up
    assert_replayed(warmed, transformer_calls(family, 3), before)
    assert torch.equal(out, expected)
    assert torch.equal(run(plain, family), expected)  # the same pipeline without warm-up agrees
    for pipe in (warmed, plain):
        bcg.remove_acceleration(pipe)


def test_capture_phases_are_reported():
    family = "flux"
    pipe = build(family)
    eager = run(pipe, family)
    bcg.accelerate_pipeline(pipe)
    assert torch.equal(run(pipe, family), eager)
    assert_replayed(pipe, transformer_calls(family, 3))
    stats = bcg.get_stats(pipe)
    (entry,) = stats.entries
    phases = dict(entry.capture_phases)
    for name in ("setup", "blas_workspace", "record", "instantiate", "accounting", "key", "static_inputs", "first_replay"):
        assert name in phases and phases[name] >= 0.0, phases
    for name in ("record", "instantiate", "first_replay"):  # work that ran: measured, not left at zero
        assert phases[name] > 0.0, phases
    assert entry.capture_time_s > 0.0, entry
    assert stats.warmup_calls == 1 and "first calls" in str(stats)
    bcg.remove_acceleration(pipe)


def test_a_call_in_another_grad_mode_than_the_warm_up_warns_once():
    family = "pixart"
    pipe = build(family)
    with torch.inference_mode():
        eager = run(pipe, family)
    bcg.accelerate_pipeline(pipe)
    bcg.warmup(pipe, [_shape(family)], **_warm_settings(family))  # outside inference_mode
    with pytest.warns(bcg.BCGCaptureWarning, match="only difference from a captured one is the grad mode") as caught:
        with torch.inference_mode():
            first = run(pipe, family)
            before = counters(pipe)
            second = run(pipe, family)
    assert torch.equal(first, eager) and torch.equal(second, eager)
    grad_mode = [w for w in caught if "grad mode" in str(w.message)]
    assert len(grad_mode) == 1 and "inference_mode=True" in str(grad_mode[0].message)
    assert_replayed(pipe, transformer_calls(family, 3), before)  # the inference-mode key, captured once, replays
    bcg.remove_acceleration(pipe)
