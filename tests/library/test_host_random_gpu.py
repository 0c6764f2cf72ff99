"""Host random numbers in a captured step, with real captures (``integration/host_random.py``): a capture
that draws them (a dropout of a table built on the CPU, as EasyAnimate's rotary table in plant 631 of the
planting harness) runs its key eagerly with one warning, every call and the process's CPU random stream
equal to an un-accelerated twin's; random numbers drawn on the device, or on the host inside an eager
break, are still captured and replayed, equal to the twin."""

import warnings

import pytest
import torch

import bcg_diffusion as bcg

from _replay import assert_replayed

pytestmark = pytest.mark.gpu

DEVICE = torch.device("cuda")
CALLS = 4  # eager first call, capture, two replays
WIDTH = 32


def _host_table() -> torch.Tensor:
    return torch.nn.functional.dropout(torch.ones(WIDTH), p=0.5, training=True)


class ApplyTable(torch.nn.Module):
    """Moves a host table to the device (not capturable: run as an eager break); with ``draws`` it builds the
    table itself, inside the break."""

    def __init__(self, draws: bool):
        super().__init__()
        self.draws = draws

    def forward(self, x, table):
        table = _host_table() if self.draws else table
        return x * table.to(x.device, x.dtype)


class Model(torch.nn.Module):
    def __init__(self, where: str):
        super().__init__()
        self.where = where  # "host": table drawn in the captured step; "break": in the eager break; "device"
        self.proj_in = torch.nn.Linear(WIDTH, WIDTH)
        self.apply_table = ApplyTable(draws=where == "break")
        self.proj_out = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        h = self.proj_in(x)
        if self.where == "device":
            h = torch.nn.functional.dropout(h, p=0.5, training=True)
        else:
            h = self.apply_table(h, _host_table() if self.where == "host" else None)
        return self.proj_out(h)


def _run(where: str):
    torch.manual_seed(0)
    model, twin = Model(where).to(DEVICE).eval(), Model(where).to(DEVICE).eval()
    twin.load_state_dict(model.state_dict())
    inputs = [torch.randn(4, WIDTH, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(i)) for i in range(CALLS)]

    def calls(m):
        torch.manual_seed(123)  # once: the calls draw one stream (CPU and CUDA), as a process would
        with torch.no_grad():
            outs = [m(x).clone() for x in inputs]
        return outs, torch.get_rng_state(), torch.cuda.get_rng_state()

    expected = calls(twin)
    bcg.accelerate_transformer(model, bcg.BCGConfig(allow_unknown=True, eager_modules=("apply_table",)))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = calls(model)
        stats = bcg.get_stats(model)
        if where != "host":
            assert_replayed(model, CALLS)
    finally:
        bcg.remove_acceleration(model)
    for i, (a, b) in enumerate(zip(got[0], expected[0])):
        assert torch.equal(a, b), f"{where}: call {i}"
    assert not torch.equal(expected[0][0], expected[0][1])
    assert torch.equal(got[1], expected[1]) and torch.equal(got[2], expected[2]), f"{where}: random streams moved"
    return stats, [str(w.message) for w in caught if issubclass(w.category, bcg.BCGCaptureWarning)]


def test_host_random_numbers_in_the_captured_step_run_the_key_eagerly():
    stats, messages = _run("host")
    assert stats.failed_captures == 1 and stats.captures == 0 and stats.hits == 0, str(stats)
    assert stats.eager_calls == CALLS - 1 and stats.entries[0].fallback == "host random numbers in the step", str(stats)
    assert len(messages) == 1 and "host random numbers in the step" in messages[0], messages


@pytest.mark.parametrize("where", ["device", "break"])
def test_random_numbers_on_the_device_or_in_an_eager_break_still_replay(where):
    stats, messages = _run(where)
    assert stats.captures == 1 and stats.failed_captures == 0, str(stats)
    assert not messages, messages
