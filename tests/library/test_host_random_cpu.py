"""Host random numbers in a captured step (``integration/host_random.py``): a capture that draws them runs
its key eagerly, with one warning, and puts torch's CPU generator back, so that every call, and the
process's random stream, equal an un-accelerated twin's.

Real captures are watched, debug mode is not (its replays run the forward again, and without CUDA the CPU
generator is also the device's). These tests run debug mode on the CPU with the watch switched on for
real (``host_random.watched``): the models here draw random numbers only in their host table, so the CPU
generator is the host's as on a GPU machine. ``tests/library/test_host_random_gpu.py`` runs real captures.
"""

import warnings

import pytest
import torch

import bcg_diffusion as bcg
from bcg_diffusion.integration import host_random


def _host_table(width: int) -> torch.Tensor:
    """A table built on the host with a dropout (as a rotary table built on the CPU), then moved to the device."""
    return torch.nn.functional.dropout(torch.ones(width), p=0.5, training=True)


class HostTable(torch.nn.Module):
    def forward(self, x):
        return x * _host_table(x.shape[-1]).to(x.device)


class Model(torch.nn.Module):
    def __init__(self, host_random_numbers: bool = True):
        super().__init__()
        self.proj_in = torch.nn.Linear(8, 8)
        self.table = HostTable() if host_random_numbers else torch.nn.Identity()
        self.proj_out = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.proj_out(self.table(self.proj_in(x)))


@pytest.fixture
def watched(monkeypatch):
    monkeypatch.setattr(host_random, "watched", lambda config: True)


def _twins(host_random_numbers: bool = True):
    torch.manual_seed(0)
    model = Model(host_random_numbers).eval()
    twin = Model(host_random_numbers).eval()
    twin.load_state_dict(model.state_dict())
    inputs = [torch.randn(2, 8, generator=torch.Generator().manual_seed(i)) for i in range(5)]
    return model, twin, inputs


def _calls(model, inputs):
    torch.manual_seed(123)  # once: the calls draw one stream, as a process would
    with torch.no_grad():
        outs = [model(x) for x in inputs]
    return outs, torch.get_rng_state()


def test_a_capture_that_draws_host_random_numbers_runs_the_key_eagerly_with_the_eager_stream(watched):
    model, twin, inputs = _twins()
    expected, expected_state = _calls(twin, inputs)
    bcg.accelerate_transformer(model, bcg.BCGConfig(debug=True, allow_unknown=True))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got, state = _calls(model, inputs)
        stats = bcg.get_stats(model)
    finally:
        bcg.remove_acceleration(model)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert torch.equal(state, expected_state), "the process's random stream moved away from the eager one"
    messages = [str(w.message) for w in caught if issubclass(w.category, bcg.BCGCaptureWarning)]
    assert len(messages) == 1 and "host random numbers in the step" in messages[0], messages
    assert stats.failed_captures == 1 and stats.captures == 0 and stats.hits == 0, str(stats)
    assert stats.warmup_calls == 1 and stats.eager_calls == 4, str(stats)
    assert stats.entries[0].fallback == "host random numbers in the step", str(stats)


def test_a_capture_that_draws_none_still_replays_under_the_watch(watched):
    model, twin, inputs = _twins(host_random_numbers=False)
    expected, expected_state = _calls(twin, inputs)
    bcg.accelerate_transformer(model, bcg.BCGConfig(debug=True, allow_unknown=True))
    try:
        got, state = _calls(model, inputs)
        stats = bcg.get_stats(model)
    finally:
        bcg.remove_acceleration(model)
    assert all(torch.equal(a, b) for a, b in zip(got, expected)) and torch.equal(state, expected_state)
    assert stats.captures == 1 and stats.failed_captures == 0 and stats.hits == 4, str(stats)


def test_the_watch_rewinds_what_an_attempt_drew_whichever_way_it_ends():
    watch = host_random.HostRandomWatch()
    before = torch.get_rng_state()
    with watch.attempt():
        pass
    assert not watch.drew
    with pytest.raises(KeyboardInterrupt), watch.attempt():
        torch.rand(3)
        raise KeyboardInterrupt
    assert watch.drew and torch.equal(torch.get_rng_state(), before)
    with watch.attempt():
        torch.rand(3)
    assert watch.drew and torch.equal(torch.get_rng_state(), before)
    assert not host_random.watch(bcg.BCGConfig(debug=True)).attempt().__enter__().drew
    assert host_random.watched(bcg.BCGConfig()) and not host_random.watched(bcg.BCGConfig(debug=True))
