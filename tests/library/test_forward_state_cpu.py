"""Buffers that the model's own forward reassigns during a call are the forward's state, not weights
(CPU, debug mode: the runner's real path with segments run eagerly; test_forward_state_gpu.py proves
the same with captured graphs).

OmniGen's rope sets ``self.inv_freq = ...`` on every call. The registration hooks read that as a
weight change, so every call got a new graph key and nothing was ever captured ("new graph key (0
kept); changed weights"). Now the new value is written in place into the buffer it replaces, so its
address, which captured kernels read, never changes, and the key stays."""

import torch

import bcg_diffusion as bcg
from bcg_diffusion.integration import fingerprint
from bcg_pipelines import zoo

DEBUG = bcg.BCGConfig(debug=True, allow_unknown=True)


def _omnigen():
    case = next(c for c in zoo.zoo_cases() if c.name == "OmniGenTransformer2DModel")
    return zoo.build_tiny(case, "cpu", torch.float32, 0), zoo.tiny_inputs(case, "cpu", torch.float32, 0)


def _calls(model, inputs, n):
    outs = []
    latents = inputs["hidden_states"]
    base = inputs.setdefault("_base", latents.clone())
    inputs = {k: v for k, v in inputs.items() if k != "_base"}
    with torch.no_grad():
        for i in range(n):
            latents.copy_(base + 0.1 * i)
            outs.append(model(**inputs)[0].clone())
    return outs


def test_omnigen_keeps_its_key_and_replays(caplog):
    model, inputs = _omnigen()
    twin, _ = _omnigen()
    buffer = model.rope.inv_freq
    expected = _calls(twin, inputs, 5)
    bcg.accelerate_transformer(model, DEBUG)
    try:
        with caplog.at_level("INFO", logger="bcg_diffusion"):
            got = _calls(model, inputs, 5)
        stats = bcg.get_stats(model)
    finally:
        bcg.remove_acceleration(model)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    # the first call finds the buffer to be forward state (its key counted the buffer's version): one more
    # first call, then a capture and replays; before, every call was a first call of a new key (0 hits)
    assert (stats.warmup_calls, stats.captures, stats.hits, stats.eager_calls) == (2, 1, 3, 0), str(stats)
    assert model.rope.inv_freq is buffer  # written in place: the address captured kernels read stays
    assert fingerprint.is_forward_state(buffer)
    assert sum("changed weights" in r.getMessage() for r in caplog.records) == 1


class Rope(torch.nn.Module):
    """Recomputes a table into its buffer on every call (as OmniGen's rope does) and returns it scaled."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.register_buffer("state", torch.zeros(2, 4), persistent=False)

    def forward(self, x):
        self.state = self.proj(x).sin()
        return self.state * 2.0


class Model(torch.nn.Module):
    """Reads the buffer of its child after the child's call (code that reads it at its address)."""

    def __init__(self, cell=None):
        super().__init__()
        self.inner = cell or Rope()
        self.out = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.out(self.inner(x) + self.inner.state[-2:])


def _run(model, n, start=0):
    with torch.no_grad():
        return [model(torch.full((2, 4), 0.1 * i)).clone() for i in range(start, start + n)]


def test_a_buffer_the_forward_reassigns_is_read_by_other_modules_like_eager():
    torch.manual_seed(0)
    model = Model()
    twin = Model()
    twin.load_state_dict(model.state_dict())
    buffer = model.inner.state
    bcg.accelerate_transformer(model, DEBUG)
    try:
        got, expected = _run(model, 5), _run(twin, 5)
        stats = bcg.get_stats(model)
    finally:
        bcg.remove_acceleration(model)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert stats.hits == 3 and stats.captures == 1, str(stats)
    assert model.inner.state is buffer and torch.equal(buffer, twin.inner.state)


class Growing(Rope):
    """Reassigns its buffer with another shape on every call: that cannot be written in place."""

    def forward(self, x):
        self.state = torch.cat([self.state, self.proj(x)])
        return self.state[-2:] * 2.0


def test_a_buffer_reassigned_with_another_shape_changes_the_key_every_call():
    torch.manual_seed(0)
    model = Model(Growing())
    twin = Model(Growing())
    twin.load_state_dict(model.state_dict())
    bcg.accelerate_transformer(model, DEBUG)
    try:
        got, expected = _run(model, 4), _run(twin, 4)
        stats = bcg.get_stats(model)
    finally:
        bcg.remove_acceleration(model)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert stats.hits == 0 and stats.warmup_calls == 4, str(stats)  # a changed weight: never replayed


def test_a_buffer_replaced_between_calls_is_a_weight_change():
    torch.manual_seed(0)
    model = Model()
    bcg.accelerate_transformer(model, DEBUG)
    try:
        _run(model, 3)
        captured = bcg.get_stats(model).captures
        model.inner.state = torch.ones(2, 4)  # outside a call: registered as a new buffer
        _run(model, 3, start=3)
        stats = bcg.get_stats(model)
    finally:
        bcg.remove_acceleration(model)
    assert captured == 1 and stats.captures == 2, str(stats)


def test_outside_an_accelerated_call_a_reassignment_registers_as_before():
    model = Rope()
    handle = fingerprint.registration_hooks()
    try:
        before = model.state
        epoch = fingerprint.registration_epoch()
        with torch.no_grad():
            model(torch.ones(2, 4))
        assert model.state is not before and fingerprint.registration_epoch() > epoch
        with fingerprint.forward_state(), torch.no_grad():
            kept = model.state
            model(torch.ones(2, 4))
        assert model.state is kept
    finally:
        handle.remove()
