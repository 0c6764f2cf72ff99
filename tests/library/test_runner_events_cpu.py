"""The public runner-events seam (``bcg_diffusion.RunnerWatcher``, ``watch_every_runner``; docs/api.md) on the CPU,
in debug mode: what a watcher is told, in order, and what it may change."""

import pytest
import torch
from diffusers import ModelMixin

import bcg_diffusion as bcg
import _sabotage
import _shape_break

DEBUG = bcg.BCGConfig(debug=True)


@pytest.fixture(autouse=True)
def _no_sabotage():
    with _sabotage.suspended():
        yield


class Told(bcg.RunnerWatcher):
    def __init__(self, give_up: str | None = None):
        self.events, self.give_up = [], give_up

    def call_began(self):
        self.events.append("began")

    def call_ended(self):
        self.events.append("ended")

    def planned(self, path, key):
        self.events.append(f"planned {path}")

    def ran_eagerly(self, reason):
        self.events.append(f"eager: {reason}")

    def captured(self, entry):
        self.events.append(f"captured {type(entry).__name__}")
        return entry.fall_back(self.give_up) if self.give_up else None  # None: the entry as it is


class NoTensorInput(ModelMixin):
    def forward(self, n):
        return torch.ones(n)


def test_a_watcher_is_told_each_call_s_path_and_captures_in_order_until_removed():
    model, _ = _shape_break.models("cpu")
    bcg.accelerate_transformer(model, DEBUG)
    told = Told()
    handle = bcg.watch_every_runner(told)
    x = torch.randn(2, 4)
    with torch.no_grad():
        for _ in range(3):
            model(x)
        handle.remove()
        model(x)
    assert told.events == ["began", "planned warmup", "ended", "began", "planned capture", "captured DebugRun", "ended",
                           "began", "planned replay", "ended"]
    bcg.remove_acceleration(model)


def test_a_call_that_runs_eagerly_says_why_on_every_call():
    model = NoTensorInput()
    bcg.accelerate_transformer(model, DEBUG)
    told = Told()
    handle = bcg.watch_every_runner(told)
    model(3)
    model(3)
    handle.remove()
    assert [e for e in told.events if e.startswith("eager")] == ["eager: no input tensor is on a CPU device"] * 2
    bcg.remove_acceleration(model)


def test_a_watcher_may_give_a_capture_up():
    model, twin = _shape_break.models("cpu")
    bcg.accelerate_transformer(model, DEBUG)
    handle = bcg.watch_every_runner(Told(give_up="given up by a watcher"))
    x = torch.randn(2, 4)
    with torch.no_grad():
        outs = [model(x) for _ in range(3)]
    handle.remove()
    stats = bcg.get_stats(model)
    assert stats.entries[0].fallback == "given up by a watcher" and stats.failed_captures == 1, str(stats)
    assert (stats.hits, stats.eager_calls) == (0, 2), str(stats)
    with torch.no_grad():
        assert all(torch.equal(out, twin(x)) for out in outs)
    bcg.remove_acceleration(model)


class ObjectInputs(ModelMixin):
    """Takes a plain object (a KV cache) and may write to it or return one, as Qwen-Image 2.1 and Flux.2 Klein KV do."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x, cache=None, mode=None, opaque=None):
        if mode == "extract":
            cache.k = self.proj(x)  # fills the cache the pipeline passed
        if mode == "return":
            made = type(cache)()
            made.k = self.proj(x)
            return x, made
        return self.proj(x) + (cache.k if cache is not None and cache.k is not None else 0)


class KV:
    def __init__(self):
        self.k = None


def test_object_inputs_replay_across_new_objects_and_what_cannot_be_replayed_warns_once():
    import warnings

    model = ObjectInputs()
    bcg.accelerate_transformer(model, DEBUG)
    told = Told()
    handle = bcg.watch_every_runner(told)
    x = torch.randn(2, 4)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):  # a new cache per "pipeline call": extract once, then read it twice
            kv = KV()
            model(x, kv, "extract")
            assert kv.k is not None  # the write was made: the extract key runs eagerly
            for _ in range(2):
                model(x, kv, "cached")
            model(x, KV(), "return")
        for _ in range(2):
            model(x, opaque=len)  # a function cannot be keyed: every call runs eagerly, one warning says so
    handle.remove()
    stats = bcg.get_stats(model)
    bcg.remove_acceleration(model)
    messages = [str(w.message) for w in caught if issubclass(w.category, bcg.BCGCaptureWarning)]
    assert sum("changes its own input args[1].k" in m for m in messages) == 1, messages
    assert sum("returns a" in m and "KV object (out[1])" in m for m in messages) == 1, messages
    assert sum("runs eagerly: uncacheable input: opaque is a builtin_function_or_method" in m for m in messages) == 1
    # the cached key: first call of the first cache, captured at its second, replayed for every later cache
    assert told.events.count("planned replay") == 4 and told.events.count("captured DebugRun") == 1
    assert stats.eager_calls == 2 + 2 + 2 and stats.failed_captures == 0, str(stats)
