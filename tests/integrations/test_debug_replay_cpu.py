"""Replay claims checked on the CPU with debug mode (``BCGConfig(debug=True)``): without CUDA the
real graph runner runs on CPU tensors (keys, first calls, static inputs, breaks and copies as in a
replay; only the segments run eagerly), so its counters and outputs can be checked here. That the
graphs themselves replay exactly is proven by the GPU tests.

Also the suite's own check (tests/_replay.py) against the test-only sabotage switch that debug mode
honours: every capture falling back, and static inputs not refreshed before a replay.
"""

import pytest
import torch

import bcg_diffusion as bcg
import bcg_pipelines as pipelines
import _sabotage
from _pipes import build, flux_inputs, run, tiny_flux_transformer, transformer_calls
from _replay import assert_replayed, counters

DEBUG = bcg.BCGConfig(debug=True)
STEPS = 3  # _pipes.run's default


def _calls(model, seeds):
    with torch.no_grad():
        return [model(**flux_inputs(s, timestep=None))[0].clone() for s in seeds]


@pytest.fixture(autouse=True)
def _no_sabotage():
    with _sabotage.suspended():
        yield


@pytest.fixture
def sabotage():
    """``sabotage(mode)`` breaks every capture of the test in ``mode`` (tests/_sabotage.py)."""
    handles = []
    yield lambda mode: handles.append(_sabotage.install(mode))
    for handle in handles:
        handle.remove()


# every family: two-call CFG (Flux with true CFG here, Wan, ...), batched CFG, embedded guidance, none;
# this also checks _pipes.transformer_calls, which the GPU tests bound their hits with
@pytest.mark.parametrize("family", pipelines.list_families())
def test_every_call_of_a_generation_after_the_first_replays(family):
    calls = transformer_calls(family, STEPS)
    pipe = build(family, device="cpu")
    eager = run(pipe, family)
    bcg.accelerate_pipeline(pipe, DEBUG)
    first = run(pipe, family)
    assert_replayed(pipe, calls)  # the runner saw exactly the calls _pipes counts; only first calls were eager
    before = counters(pipe)
    second = run(pipe, family)
    assert_replayed(pipe, calls, before)
    bcg.remove_acceleration(pipe)
    assert torch.equal(first, eager) and torch.equal(second, eager)


def test_a_bare_transformer_warms_up_once_then_replays_on_new_inputs():
    model, twin = tiny_flux_transformer(), tiny_flux_transformer()
    bcg.accelerate_transformer(model, DEBUG)
    outs, expected = _calls(model, range(4)), _calls(twin, range(4))
    stats = bcg.get_stats(model)
    assert (stats.warmup_calls, stats.captures, stats.hits, stats.eager_calls) == (1, 1, 3, 0), str(stats)
    assert all(torch.equal(a, b) for a, b in zip(outs, expected))
    assert not torch.equal(expected[2], expected[3])  # the inputs change between calls
    bcg.remove_acceleration(model)


def test_a_forward_replaced_on_the_instance_runs_in_module_mode():
    """Python the key cannot see (it reuses its last output every other call) runs eagerly on every
    call; the transformer's units replay."""
    def patch(model):
        original, state = model.forward, {"n": 0, "last": None}

        def forward(*args, **kwargs):
            state["n"] += 1
            if state["n"] % 2 == 0 and state["last"] is not None:
                return (state["last"],)
            out = original(*args, **kwargs)
            state["last"] = out[0]
            return out

        model.forward = forward

    model, twin = tiny_flux_transformer(), tiny_flux_transformer()
    bcg.accelerate_transformer(model, DEBUG)
    patch(model)
    patch(twin)
    outs, expected = _calls(model, range(6)), _calls(twin, range(6))
    assert all(torch.equal(a, b) for a, b in zip(outs, expected))
    stats = bcg.get_stats(model)
    assert stats.entries and all(e.module_mode for e in stats.entries), str(stats)
    assert stats.child_hits > 0 and stats.child_eager_calls == 0 and stats.eager_calls == 0, str(stats)
    bcg.remove_acceleration(model)


def test_the_replay_check_fails_when_every_capture_falls_back(sabotage):
    sabotage("fallback")
    model, twin = tiny_flux_transformer(), tiny_flux_transformer()
    bcg.accelerate_transformer(model, DEBUG)
    outs, expected = _calls(model, range(3)), _calls(twin, range(3))
    assert all(torch.equal(a, b) for a, b in zip(outs, expected))  # right outputs: comparing alone cannot tell
    with pytest.raises(AssertionError, match="fell back to eager"):
        assert_replayed(model, 3)
    stats = bcg.get_stats(model)
    assert stats.failed_captures == 1 and stats.hits == 0 and stats.eager_calls == 2, str(stats)  # calls 2 and 3
    bcg.remove_acceleration(model)


def test_stale_static_inputs_give_other_outputs_when_inputs_change(sabotage):
    sabotage("stale_inputs")
    model, twin = tiny_flux_transformer(), tiny_flux_transformer()
    bcg.accelerate_transformer(model, DEBUG)
    seeds = [0, 1, 1, 2]  # first call, capture, a replay of the same inputs, a replay of new ones
    outs, expected = _calls(model, seeds), _calls(twin, seeds)
    assert torch.equal(outs[1], expected[1])  # the capture's static inputs are copies of its own inputs
    assert torch.equal(outs[2], expected[2])  # the same inputs again: a stale replay cannot be told apart
    assert not torch.equal(outs[3], expected[3])  # new inputs: the stale replay is caught by the comparison
    assert bcg.get_stats(model).hits == 3  # the counters cannot tell: only changing inputs do
    bcg.remove_acceleration(model)


_STARTED = """
import torch
import bcg_diffusion as bcg
model = bcg.accelerate_transformer(torch.nn.Linear(4, 4), bcg.BCGConfig(debug=True, allow_unknown=True))
with torch.no_grad():
    for _ in range(3):
        model(torch.randn(2, 4))
stats = bcg.get_stats(model)
print("counters", stats.failed_captures, stats.hits, stats.eager_calls)
"""


def test_a_process_the_tests_start_is_sabotaged_too():
    """What a sabotaged session starts (a server, a torchrun worker) breaks its captures as well: with
    tests/sabotage_site on its PYTHONPATH (the conftest puts it there) the sabotage installs itself once
    the library's runner events are imported. Normally the three calls would be 1 warm-up and 2 replays."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    site = Path(_sabotage.__file__).resolve().parent / "sabotage_site"
    env = {**os.environ, _sabotage.ENV_SABOTAGE: "fallback", "PYTHONPATH": str(site)}
    proc = subprocess.run([sys.executable, "-c", _STARTED], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-4:] == ["counters", "1", "0", "2"], proc.stdout  # the capture fell back: nothing replays


@pytest.mark.parametrize("module_mode", [False, True])
def test_a_break_that_changes_shape_stops_the_replay_and_the_call_runs_eagerly(module_mode):
    """The one replay path, whole-call and for a unit in module mode: a break whose output shape follows a host
    value stops the replay; the call returns the eager result, one warning names what stopped, and the key (or
    the unit call) runs eagerly from then on."""
    import _shape_break

    model, twin = _shape_break.models("cpu")
    bcg.accelerate_transformer(model, DEBUG)
    if module_mode:
        _shape_break.opaque_forward(model)
    equal, messages = _shape_break.calls_until_a_break_changes_shape(model, twin, "cpu")
    assert equal == [True] * 4
    what = "blocks.0 (Block) in module mode" if module_mode else "WideningModel"
    assert len(messages) == 1 and f"replay of {what} stopped" in messages[0], messages
    stats = bcg.get_stats(model)
    entry = stats.entries[0]
    if module_mode:
        assert entry.module_mode and entry.child_failed_captures == 1 and stats.failed_captures == 0, str(stats)
        assert stats.child_hits >= 3 and stats.eager_calls == 0, str(stats)  # both blocks replayed before
    else:
        assert entry.fallback.startswith("break output changed shape") and stats.failed_captures == 1, str(stats)
        assert (stats.hits, stats.eager_calls) == (2, 1), str(stats)
    with torch.no_grad():  # from now on that key (or unit call) runs eagerly, with no new warning
        x = torch.randn(2, 4)
        assert torch.equal(model(x), twin(x))
    bcg.remove_acceleration(model)
