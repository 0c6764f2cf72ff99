"""Step batching (issue 46) on the CPU with tiny pipelines, bitwise: a request alone through the step scheduler
equals the stock pipeline called at the same batch shape (per family); a request's image does not depend on what
joined or left its running batch at any step; joins, leaves, idle, sizes taking turns (both policies),
cancellation of a waiting request, a request that does not fit, failures; what the scheduler refuses.

Every scheduler here is driven by the test itself (``run_once``), on the test's thread: no server. The tests of the
order of events prepare and finish requests inline (``host_threads=False``: every event at a known boundary); the
comparison with the stock pipeline and the tests at the end run with the preparing and finishing threads.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import bcg_pipelines as pipelines
from bcg_diffusion.serving.batching.stepping import (
    FILLER_PROMPT,
    FILLER_SEED,
    STEP_PIPELINES,
    StepConfig,
    StepError,
    StepRequest,
    StepScheduler,
    loop_for,
)
from bcg_diffusion.serving.batching.stepping.loops import LOOPS

ROWS = 3
FAMILIES = ("pixart", "sana", "sd3", "flux", "wan")
#: The smallest size each tiny family takes (Sana: multiples of 32, Wan: 16 and 5 frames).
SIZES = {"pixart": (64, 64), "sana": (64, 64), "sd3": (64, 64), "flux": (64, 64), "wan": (32, 32)}
OTHER_SIZE = {"pixart": (64, 128), "flux": (64, 128)}


@pytest.fixture(autouse=True)
def keep_switch_interval():
    """Schedulers with host threads set the interpreter's switch interval; the tests that do not close theirs must
    not leave it changed for the next tests."""
    import sys

    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


@pytest.fixture(scope="module")
def pipes():
    built = {}
    for family in FAMILIES:
        pipe = pipelines.build_pipeline(family, size="tiny", device="cpu", seed=0)
        pipe.set_progress_bar_config(disable=True)
        built[family] = pipe
    return built


def call(pipe, family: str, prompt: str, steps: int = 2, size=None, **extra) -> dict:
    """A request's pipeline call, as the server plans it (numbers out: ``output_type="np"``)."""
    height, width = size or SIZES[family]
    planned = pipelines.plan_call(family, "tiny", prompt=prompt, height=height, width=width, steps=steps,
                                  num_frames=5 if family == "wan" else None,
                                  guidance=extra.pop("guidance", None), negative_prompt=extra.pop("negative", None))
    planned, _ = pipelines.fit_call(pipe, planned, batch=1, exact_shape=True)
    return {**planned, "output_type": "np", **extra}


def image(ticket) -> np.ndarray:
    result = ticket.future.result(timeout=0)
    return np.asarray(result.images[0])


def alone(scheduler: StepScheduler, request: StepRequest) -> np.ndarray:
    ticket = scheduler.submit(request)
    scheduler.run_until_idle()
    return image(ticket)


# -------------------------------------------------------------------------------------------------------
# equal to the stock pipeline; independent of the batch
# -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_a_request_alone_equals_the_stock_pipeline_at_the_same_batch_shape(pipes, family):
    """Text encoding and decoding at ROWS rows too (encode_rows = decode_rows = rows): the stock pipeline given the
    request's prompt and ROWS - 1 filler prompts, one generator per row, makes the same image bitwise."""
    pipe = pipes[family]
    negative = None if family == "flux" else "blurry, dark"
    extra = {"true_cfg_scale": 2.0} if family == "flux" else {}
    request_call = call(pipe, family, "a red fox in the snow", negative="low quality" if family == "flux" else negative,
                        **extra)
    scheduler = StepScheduler(pipe, StepConfig(rows=ROWS, encode_rows=ROWS, decode_rows=ROWS))
    mine = alone(scheduler, StepRequest(request_call, seed=7))
    stock_call = {**request_call, "prompt": [request_call["prompt"]] + [FILLER_PROMPT] * (ROWS - 1)}
    if request_call.get("negative_prompt") is not None:
        stock_call["negative_prompt"] = [request_call["negative_prompt"]] + [FILLER_PROMPT] * (ROWS - 1)
    generators = [torch.Generator().manual_seed(7)] + [torch.Generator().manual_seed(FILLER_SEED)
                                                       for _ in range(ROWS - 1)]
    stock = pipelines.generated(pipe(**stock_call, generator=generators))
    assert np.array_equal(mine, np.asarray(stock[0]))
    assert scheduler.stats.steps == 2 and scheduler.stats.occupied_rows == 2


@pytest.mark.parametrize("family", FAMILIES)
def test_the_loop_shares_the_models_and_not_the_tokenizers(pipes, family):
    """The preparing thread encodes while the server's worker may run a whole call with the server's pipeline: two
    threads on one fast tokenizer can encode a prompt at the wrong length (docs/accelerate.md "Threads")."""
    pipe = pipes[family]
    loop = StepScheduler(pipe, StepConfig(host_threads=False, rows=ROWS)).loop
    for name, value in pipe.components.items():
        if isinstance(value, torch.nn.Module):
            assert loop.pipe.components[name] is value, name
        elif name.startswith("tokenizer") and value is not None:
            assert loop.pipe.components[name] is not value, name


@pytest.mark.parametrize("family", FAMILIES)
def test_a_requests_image_does_not_depend_on_what_joins_or_leaves_its_batch(pipes, family):
    pipe = pipes[family]
    count_key = "num_videos_per_prompt" if family == "wan" else "num_images_per_prompt"
    negative = None if family == "flux" else "blurry"
    fox = StepRequest(call(pipe, family, "a red fox", steps=3, guidance=3.0, negative=negative), seed=7)
    scheduler = StepScheduler(pipe, StepConfig(host_threads=False, rows=ROWS))
    reference = alone(scheduler, fox)
    lighthouse = scheduler.submit(StepRequest(call(pipe, family, "a lighthouse", steps=5), seed=3))
    scheduler.run_once()  # the lighthouse is one step ahead when the fox joins
    again = scheduler.submit(fox)
    scheduler.run_once()
    scheduler.run_once()
    ramen = scheduler.submit(StepRequest(call(pipe, family, "ramen", steps=2, guidance=6.0), seed=1))  # fills the batch
    pair = scheduler.submit(StepRequest({**call(pipe, family, "a tree", steps=2), count_key: 2}, seed=9))  # waits
    scheduler.run_until_idle()
    assert np.array_equal(image(again), reference)
    assert all(t.future.result(timeout=0).steps == s for t, s in ((lighthouse, 5), (ramen, 2), (pair, 2)))
    assert len(pair.future.result(timeout=0).images) == 2
    assert again.future.result(timeout=0).companions == ROWS


# -------------------------------------------------------------------------------------------------------
# the scheduler: joins, leaves, idle, turns, cancellation
# -------------------------------------------------------------------------------------------------------
def test_requests_join_at_step_boundaries_leave_when_done_and_the_loop_idles(pipes):
    pipe = pipes["pixart"]
    scheduler = StepScheduler(pipe, StepConfig(host_threads=False, rows=ROWS))
    assert not scheduler.has_work() and scheduler.run_once() is False and scheduler.stats.steps == 0
    first = scheduler.submit(StepRequest(call(pipe, "pixart", "a fox", steps=3), seed=1))
    assert scheduler.waiting() == 1 and first.state == "waiting"
    scheduler.run_once()
    assert first.state == "running" and scheduler.running_rows() == 1
    second = scheduler.submit(StepRequest(call(pipe, "pixart", "a boat", steps=3), seed=2))
    scheduler.run_once()  # the second joins at this boundary, the first takes its second step
    assert scheduler.running_rows() == 2 and first.steps == 2 and second.steps == 1
    scheduler.run_once()  # the first's last step: it leaves and is answered
    assert first.future.done() and first.state == "done" and scheduler.running_rows() == 1
    scheduler.run_once()
    assert second.future.done() and not scheduler.has_work()
    assert scheduler.run_once() is False and scheduler.stats.steps == 4  # idle: no step without work
    snapshot = scheduler.snapshot()
    assert snapshot["active_rows_per_step"] == {"1": 2, "2": 2}
    assert snapshot["occupancy"] == pytest.approx(6 / (4 * ROWS), abs=1e-4)
    assert snapshot["requests"]["finished"] == 2 and snapshot["queue_wait_s"]["count"] == 2
    assert snapshot["step_launch_s"]["count"] == 4 and snapshot["step_launch_s"]["max"] <= snapshot["step_s"]["max"]
    assert snapshot["predict_device_s"]["count"] == 0  # no device events off CUDA


@pytest.mark.parametrize("policy, expected", [("round_robin", ["a", "b", "a", "b", "b"]),
                                              ("oldest_first", ["a", "a", "b", "b", "b"])])
def test_sizes_take_turns_by_the_policy(pipes, policy, expected):
    pipe = pipes["pixart"]
    stepped = []
    scheduler = StepScheduler(pipe, StepConfig(host_threads=False, rows=ROWS, policy=policy))
    a = scheduler.submit(StepRequest(call(pipe, "pixart", "a fox", steps=2), seed=1))
    b = scheduler.submit(StepRequest(call(pipe, "pixart", "a boat", steps=3, size=OTHER_SIZE["pixart"]), seed=2))
    names = {a.key: "a", b.key: "b"}
    while scheduler.has_work():
        before = {k: scheduler.stats.steps_per_key.get(str(k), 0) for k in names}
        scheduler.run_once()
        stepped += [names[k] for k in names if scheduler.stats.steps_per_key.get(str(k), 0) > before[k]]
    assert stepped == expected
    assert a.future.result(timeout=0).steps == 2 and b.future.result(timeout=0).steps == 3


def test_a_waiting_request_can_be_cancelled_a_running_one_cannot(pipes):
    pipe = pipes["flux"]
    scheduler = StepScheduler(pipe, StepConfig(host_threads=False, rows=1))
    running = scheduler.submit(StepRequest(call(pipe, "flux", "a fox", steps=2), seed=1))
    scheduler.run_once()
    waiting = scheduler.submit(StepRequest(call(pipe, "flux", "a boat", steps=2), seed=2))
    assert scheduler.cancel(waiting) is True and waiting.future.cancelled() and waiting.state == "cancelled"
    assert scheduler.cancel(waiting) is False and scheduler.cancel(running) is False
    assert scheduler.run_until_idle() == 1 and running.future.result(timeout=0).steps == 2
    assert scheduler.snapshot()["requests"] == {"submitted": 2, "admitted": 1, "finished": 1, "failed": 0,
                                                "cancelled": 1}


def test_a_request_that_does_not_fit_is_not_overtaken(pipes):
    pipe = pipes["flux"]
    scheduler = StepScheduler(pipe, StepConfig(host_threads=False, rows=2))
    one = scheduler.submit(StepRequest(call(pipe, "flux", "a fox", steps=2), seed=1))
    scheduler.run_once()
    two = scheduler.submit(StepRequest({**call(pipe, "flux", "a pair", steps=2), "num_images_per_prompt": 2}, seed=2))
    late = scheduler.submit(StepRequest(call(pipe, "flux", "a boat", steps=2), seed=3))
    scheduler.run_once()  # one slot is free: the pair does not fit, and the later single request waits behind it
    assert two.state == "waiting" and late.state == "waiting" and one.future.done()
    scheduler.run_until_idle()
    assert two.future.result(timeout=0).queue_s < late.future.result(timeout=0).queue_s
    assert [np.asarray(im).shape for im in two.future.result(timeout=0).images] == [(64, 64, 3)] * 2


def test_failures_fail_their_request_or_their_batch_and_the_scheduler_goes_on(pipes, monkeypatch):
    pipe = pipes["flux"]
    scheduler = StepScheduler(pipe, StepConfig(host_threads=False, rows=ROWS))

    def fail_after(steps):
        if steps == 1:
            raise RuntimeError("injected")

    fox = call(pipe, "flux", "a fox", steps=2)
    reference = alone(scheduler, StepRequest(fox, seed=1))
    failing = scheduler.submit(StepRequest(call(pipe, "flux", "a boat", steps=2), seed=2, on_step=fail_after))
    survivor = scheduler.submit(StepRequest(fox, seed=1))
    scheduler.run_until_idle()
    assert isinstance(failing.future.exception(timeout=0), RuntimeError) and failing.state == "failed"
    assert np.array_equal(image(survivor), reference)  # the request that failed left its batch, the other went on
    real_predict = scheduler.loop.predict
    monkeypatch.setattr(scheduler.loop, "predict", lambda batch: (_ for _ in ()).throw(torch.OutOfMemoryError("oom")))
    both = [scheduler.submit(StepRequest(fox, seed=s)) for s in (1, 2)]
    scheduler.run_until_idle()
    assert all(isinstance(t.future.exception(timeout=0), torch.OutOfMemoryError) for t in both)
    assert scheduler.running_rows() == 0
    monkeypatch.setattr(scheduler.loop, "predict", real_predict)
    assert np.array_equal(alone(scheduler, StepRequest(fox, seed=1)), reference)
    assert scheduler.snapshot()["requests"]["failed"] == 3


def test_requests_that_finish_together_are_answered_one_by_one_as_their_decodes_end(pipes, monkeypatch):
    """Three requests leave at the same step: each is answered once its own decode is done (not after all three);
    a decode that fails fails its request and the ones after it, not the one answered before."""
    pipe = pipes["pixart"]
    scheduler = StepScheduler(pipe, StepConfig(host_threads=False, rows=ROWS))
    fox = call(pipe, "pixart", "a fox", steps=2)
    references = [alone(scheduler, StepRequest(fox, seed=s)) for s in (1, 2, 3)]
    real_decoded, seen = scheduler.loop.decoded, []

    def decoded(plan, latents):
        seen.append([t.state for t in tickets])  # what was answered when this decode started
        if fail_at is not None and len(seen) == fail_at:
            raise RuntimeError("decode failed")
        return real_decoded(plan, latents)

    monkeypatch.setattr(scheduler.loop, "decoded", decoded)
    for fail_at in (None, 2):
        seen.clear()
        tickets = [scheduler.submit(StepRequest(fox, seed=s)) for s in (1, 2, 3)]
        scheduler.run_until_idle()
        assert seen[:2] == [["running"] * 3, ["done", "running", "running"]]
        assert tickets[0].future.result(timeout=0).companions == 3
    assert np.array_equal(image(tickets[0]), references[0])
    assert [t.state for t in tickets] == ["done", "failed", "failed"] and len(seen) == 2
    assert str(tickets[2].future.exception(timeout=0)) == "decode failed"


@pytest.mark.parametrize("family", FAMILIES)
def test_a_negative_prompt_seen_before_is_not_encoded_again_and_changes_no_image(pipes, family):
    """``StepConfig.reused_encodings``: the second request with the same negative prompt runs half the text-encoder
    calls and gives the image of a scheduler that reuses nothing; weights written in place make it encode again."""
    from bcg_diffusion.serving.batching.stepping.text_reuse import text_encoders

    pipe = pipes[family]
    extra = {"true_cfg_scale": 2.0} if family == "flux" else {}
    first, second = (call(pipe, family, prompt, negative="low quality", **extra) for prompt in ("a fox", "a boat"))
    reusing = StepScheduler(pipe, StepConfig(host_threads=False, rows=ROWS))
    fresh = StepScheduler(pipe, StepConfig(host_threads=False, rows=ROWS, reused_encodings=0))
    assert reusing.loop.plan(first).args["cfg"], "the test needs classifier-free guidance"
    encoders, calls = text_encoders(pipe), []
    hooks = [m.register_forward_pre_hook(lambda *_: calls.append(1)) for m in encoders]
    try:
        alone(reusing, StepRequest(first, seed=1))  # its negative prompt and the filler's empty one: encoded
        calls.clear()
        reused = alone(reusing, StepRequest(second, seed=2))
        hit = len(calls)
        calls.clear()
        encoded = alone(fresh, StepRequest(second, seed=2))  # a new scheduler: its filler row is encoded too
        assert len(calls) > hit > 0 and reusing.loop.unconds.hits >= 1
        calls.clear()
        alone(fresh, StepRequest(second, seed=2))
        assert len(calls) == 2 * hit  # without reuse: the prompt and the negative prompt, each as many calls
        with torch.no_grad():
            next(encoders[0].parameters()).add_(0)  # the same values, a new version: the weights may have changed
        calls.clear()
        assert np.array_equal(alone(reusing, StepRequest(second, seed=2)), reused)
        assert len(calls) == 2 * hit  # encoded again
    finally:
        for hook in hooks:
            hook.remove()
    assert np.array_equal(reused, encoded)


def test_a_failed_step_hands_its_error_on_without_the_steps_locals(pipes, monkeypatch):
    """What a failed step held (its tensors) is freed when its requests get the error, not when the cyclic garbage
    collector gets to it (bcg_diffusion.toolkit.failed_calls); checked with the collector off."""
    import gc
    import weakref

    pipe = pipes["flux"]
    scheduler = StepScheduler(pipe, StepConfig(host_threads=False, rows=ROWS))
    refs = []

    def failing_predict(batch):
        held = torch.zeros(4)
        refs.append(weakref.ref(held))
        raise RuntimeError("injected in the step")

    monkeypatch.setattr(scheduler.loop, "predict", failing_predict)
    was = gc.isenabled()
    gc.disable()
    try:
        ticket = scheduler.submit(StepRequest(call(pipe, "flux", "a fox", steps=2), seed=1))
        scheduler.run_until_idle()
        assert isinstance(ticket.future.exception(timeout=0), RuntimeError) and refs and refs[0]() is None
    finally:
        if was:
            gc.enable()



def test_a_request_failed_at_a_step_boundary_leaves_nothing_to_the_cyclic_collector(pipes):
    """A request that fails in its step callback, as the server's injected faults do: once its error is read and
    its ticket dropped, none of its tensors (text embeddings, latents, its scheduler's state) waits in a reference
    cycle. Its error is handed on without its traceback, whose frames lead (``f_back``) to the scheduler's own,
    which hold the ticket that holds the error (bcg_diffusion.toolkit.failed_calls)."""
    import gc

    pipe = pipes["flux"]
    scheduler = StepScheduler(pipe, StepConfig(host_threads=False, rows=ROWS))

    def fail_after(steps):
        raise RuntimeError("injected at the boundary")

    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        ticket = scheduler.submit(StepRequest(call(pipe, "flux", "a boat", steps=2), seed=2, on_step=fail_after))
        scheduler.run_until_idle()
        error = ticket.future.exception(timeout=0)
        assert str(error) == "injected at the boundary" and error.__traceback__ is None
        assert "in fail_after" in "".join(getattr(error, "__notes__", []))  # where it failed, as text
        del ticket, error
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [tuple(o.shape) for o in gc.garbage if isinstance(o, torch.Tensor)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()
    assert left == [], f"tensors of the failed request in reference cycles: {left}"

def test_idle_batches_beyond_the_limit_are_dropped_and_made_again(pipes, monkeypatch):
    from bcg_diffusion.serving.batching.stepping import scheduler as scheduler_module

    monkeypatch.setattr(scheduler_module, "IDLE_BATCHES", 1)
    pipe = pipes["flux"]
    scheduler = StepScheduler(pipe, StepConfig(host_threads=False, rows=2))
    small = StepRequest(call(pipe, "flux", "a fox"), seed=1)
    first = alone(scheduler, small)
    alone(scheduler, StepRequest(call(pipe, "flux", "a fox", size=OTHER_SIZE["flux"]), seed=1))
    assert len(scheduler._batches) == 1  # the small size's idle batch was dropped for the other's
    assert np.array_equal(alone(scheduler, small), first) and len(scheduler._batches) == 1


def test_the_host_runs_at_most_one_step_ahead_of_the_device():
    """The CUDA pacing of every step (its events are faked here): after queueing step N, wait for step N - 1."""
    from bcg_diffusion.serving.batching.stepping.loop import DevicePacer

    waited = []

    class Event:
        def __init__(self, n):
            self.n = n

        def synchronize(self):
            waited.append(self.n)

    made = iter(range(10))
    pacer = DevicePacer(torch.device("cpu"), make_event=lambda: Event(next(made)))
    for _ in range(4):
        pacer.queued()
    assert waited == [0, 1, 2]
    DevicePacer(torch.device("cpu")).queued()  # no device to wait for: nothing recorded


def test_the_step_clock_reads_device_spans_once_the_device_has_passed_them():
    """Host time from the first mark to the last; a step's device spans only once its last event has run, oldest
    step first, never waited for (the events are faked here: milliseconds on a device timeline)."""
    from bcg_diffusion.serving.batching.stepping.step_clock import DeviceSpans, StepClock

    class Event:
        def __init__(self, at_ms):
            self.at_ms, self.passed = at_ms, False

        def query(self):
            return self.passed

        def elapsed_time(self, later):
            return later.at_ms - self.at_ms

    host = iter([0.0, 0.010, 0.011, 1.0, 1.020, 1.022, 2.0, 2.001, 2.002])
    device_ms = iter([0.0, 5.0, 20.0, 20.0, 45.0, 50.0, 50.0, 51.0, 52.0])
    made: list[Event] = []
    clock = StepClock(torch.device("cpu"), clock=lambda: next(host),
                      make_event=lambda: made.append(Event(next(device_ms))) or made[-1])

    def step():
        marks = clock.begin()
        clock.mark(marks)
        clock.mark(marks)
        return marks

    launch_s, spans = clock.end(step())
    assert launch_s == pytest.approx(0.011) and spans == []  # the device has not passed the step yet
    second = step()
    for event in made[:3]:
        event.passed = True
    launch_s, spans = clock.end(second)
    assert launch_s == pytest.approx(0.022) and spans == [DeviceSpans(0.005, 0.015)]  # the first step only
    third = step()
    for event in made[3:]:
        event.passed = True
    assert clock.end(third)[1] == [DeviceSpans(0.025, 0.005), DeviceSpans(0.001, 0.001)]
    assert StepClock(torch.device("cpu")).end(StepClock(torch.device("cpu")).begin())[1] == []  # off CUDA: none


# -------------------------------------------------------------------------------------------------------
# what is refused
# -------------------------------------------------------------------------------------------------------
def test_calls_the_step_scheduler_cannot_run_are_refused_before_they_queue(pipes):
    pipe = pipes["pixart"]
    scheduler = StepScheduler(pipe, StepConfig(host_threads=False, rows=2))
    base = call(pipe, "pixart", "a fox")
    cases = {"latents": {**base, "latents": torch.zeros(1, 4, 8, 8)}, "callback": {**base, "callback": print},
             "a list of prompts": {**base, "prompt": ["a", "b"]}, "n": {**base, "num_images_per_prompt": 3},
             "unknown key": {**base, "strength": 0.5}, "output type": {**base, "output_type": "jpeg"}}
    messages = {}
    for name, bad in cases.items():
        with pytest.raises(StepError) as caught:
            scheduler.submit(StepRequest(bad))
        messages[name] = str(caught.value)
    assert "does not support 'latents'" in messages["latents"] and "'callback'" in messages["callback"]
    assert "one prompt" in messages["a list of prompts"] and "does not fit a running batch of 2 rows" in messages["n"]
    assert "takes no 'strength'" in messages["unknown key"] and "jpeg" in messages["output type"]
    assert scheduler.waiting() == 0 and scheduler.stats.requests["submitted"] == 0


def test_pipelines_without_a_loop_or_with_a_step_cache_are_refused(pipes):
    with pytest.raises(StepError, match="no denoising loop for object"):
        loop_for(object(), StepConfig())
    pipe = pipelines.build_pipeline("flux", size="tiny", device="cpu", seed=0)
    from diffusers import FirstBlockCacheConfig

    pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=0.2))
    with pytest.raises(StepError, match="step caches"):
        StepScheduler(pipe)
    assert sorted(name for loop in LOOPS for name in loop.pipeline_names) == sorted(STEP_PIPELINES)


def test_a_closed_scheduler_fails_waiting_and_running_requests(pipes):
    pipe = pipes["flux"]
    scheduler = StepScheduler(pipe, StepConfig(host_threads=False, rows=1))
    running = scheduler.submit(StepRequest(call(pipe, "flux", "a fox", steps=3), seed=1))
    scheduler.run_once()
    waiting = scheduler.submit(StepRequest(call(pipe, "flux", "a boat", steps=3), seed=2))
    scheduler.close("stopping for the test")
    for ticket in (running, waiting):
        assert isinstance(ticket.future.exception(timeout=0), StepError)
    assert not scheduler.has_work()
    with pytest.raises(StepError, match="stopping for the test"):
        scheduler.submit(StepRequest(call(pipe, "flux", "a fox"), seed=1))


# -------------------------------------------------------------------------------------------------------
# the preparing and finishing threads (host_threads, the default)
# -------------------------------------------------------------------------------------------------------
def test_with_host_threads_every_image_equals_the_request_alone_whatever_the_timing(pipes):
    """Requests submitted from another thread while a thread runs the boundaries (prepared on arrival, finished off
    the loop): each image bitwise equal to the same request alone through an inline scheduler."""
    import threading
    import time

    pipe = pipes["pixart"]
    requests = [StepRequest(call(pipe, "pixart", prompt, steps=steps, guidance=guidance), seed=seed)
                for prompt, steps, guidance, seed in (("a fox", 3, 4.5, 1), ("a boat", 2, 2.0, 2), ("ramen", 4, 6.0, 3),
                                                      ("a tree", 2, 4.5, 4), ("a lighthouse", 3, 3.0, 5))]
    inline = StepScheduler(pipe, StepConfig(host_threads=False, rows=ROWS))
    references = [alone(inline, request) for request in requests]
    scheduler = StepScheduler(pipe, StepConfig(rows=ROWS))
    tickets = [scheduler.submit(request) for request in requests[:3]]
    for ticket in tickets:
        ticket.prepared.result(timeout=60)  # prepared on arrival, before any boundary: the first three join at once
    stop = threading.Event()
    runner = threading.Thread(target=scheduler.run, args=(stop, 0.01))
    runner.start()
    try:
        for request in requests[3:]:  # these join whenever their preparation is done
            time.sleep(0.01)
            tickets.append(scheduler.submit(request))
        results = [t.future.result(timeout=60) for t in tickets]
    finally:
        stop.set()
        runner.join(timeout=60)
        scheduler.close()
    assert all(np.array_equal(np.asarray(r.images[0]), ref) for r, ref in zip(results, references))
    snapshot = scheduler.snapshot()
    assert snapshot["requests"]["finished"] == len(requests) and snapshot["prepare_s"]["count"] == len(requests)
    assert [r.companions for r in results[:3]] == [ROWS] * 3


def test_rows_get_a_copy_of_one_scheduler_with_the_first_step_index_found_while_preparing(pipes):
    for family in FAMILIES:
        scheduler = StepScheduler(pipes[family], StepConfig(host_threads=False, rows=2))
        loop = scheduler.loop
        rows = loop.prepare(loop.plan(call(pipes[family], family, "a fox", steps=3)), 1)
        assert rows[0].scheduler is not loop.scheduler_template and rows[0].scheduler.step_index == 0
        assert loop.scheduler_template.step_index is None and len(rows[0].timesteps) == 3


def test_a_failed_preparation_fails_its_request_only(pipes, monkeypatch):
    pipe = pipes["flux"]
    scheduler = StepScheduler(pipe, StepConfig(rows=ROWS))
    real_prepare = scheduler.loop.prepare

    def prepare(plan, seed):
        if plan.args["prompt"] == "boom":
            raise RuntimeError("injected while preparing")
        return real_prepare(plan, seed)

    monkeypatch.setattr(scheduler.loop, "prepare", prepare)
    fox = StepRequest(call(pipe, "flux", "a fox", steps=2), seed=1)
    boom = scheduler.submit(StepRequest(call(pipe, "flux", "boom", steps=2), seed=2))
    ok = scheduler.submit(fox)
    scheduler.run_until_idle()
    scheduler.close()
    assert isinstance(boom.future.exception(timeout=0), RuntimeError) and boom.state == "failed"
    reference = alone(StepScheduler(pipe, StepConfig(host_threads=False, rows=ROWS)), fox)
    assert np.array_equal(image(ok), reference)


def test_cancel_withdraws_a_waiting_preparation_and_close_fails_what_the_workers_hold(pipes, monkeypatch):
    import threading

    pipe = pipes["flux"]
    scheduler = StepScheduler(pipe, StepConfig(rows=ROWS))
    release = threading.Event()
    real_prepare, real_decoded = scheduler.loop.prepare, scheduler.loop.decoded

    def slow_prepare(plan, seed):
        if plan.args["prompt"] == "slow":
            release.wait(30)
        return real_prepare(plan, seed)

    def slow_decoded(plan, latents):
        release.wait(30)
        return real_decoded(plan, latents)

    monkeypatch.setattr(scheduler.loop, "prepare", slow_prepare)
    monkeypatch.setattr(scheduler.loop, "decoded", slow_decoded)
    one, two = (scheduler.submit(StepRequest(call(pipe, "flux", p, steps=s), seed=1)) for p, s in (("a", 1), ("b", 2)))
    one.prepared.result(timeout=30), two.prepared.result(timeout=30)
    scheduler.run_once()  # both join and step: the first is done, its decode waits on the finishing thread
    scheduler.run_once()  # the second is done: its finish is queued behind
    slow = scheduler.submit(StepRequest(call(pipe, "flux", "slow"), seed=3))  # its preparation waits
    queued = scheduler.submit(StepRequest(call(pipe, "flux", "queued"), seed=4))
    assert scheduler.cancel(queued) and queued.prepared.cancelled() and queued.future.cancelled()
    scheduler.close("closed for the test")
    release.set()
    assert isinstance(slow.future.exception(timeout=30), StepError)
    assert one.future.result(timeout=30).steps == 1  # it was being decoded: answered
    assert isinstance(two.future.exception(timeout=30), StepError) and "closed for the test" in str(two.future.exception())


def test_the_host_threads_set_the_switch_interval_and_close_puts_it_back(pipes):
    import sys

    before = sys.getswitchinterval()
    scheduler = StepScheduler(pipes["flux"], StepConfig(rows=2, switch_interval_s=0.002))
    assert sys.getswitchinterval() == pytest.approx(0.002)
    scheduler.close()
    assert sys.getswitchinterval() == pytest.approx(before)
    StepScheduler(pipes["flux"], StepConfig(host_threads=False, rows=2, switch_interval_s=0.002))
    assert sys.getswitchinterval() == pytest.approx(before)  # inline: no threads, nothing set
    with pytest.raises(ValueError, match="switch_interval_s"):
        StepConfig(switch_interval_s=0)
    assert StepConfig().host_stream_priority == -1  # on CUDA: the host threads' streams before the steps'


def test_a_request_finished_after_the_workers_stopped_is_answered_not_lost(pipes):
    """A boundary still running when the host workers stop (close() while the server waits for the boundary) hands its
    finished requests to a stopped finishing thread: the finish runs where the boundary runs."""
    pipe = pipes["flux"]
    fox = StepRequest(call(pipe, "flux", "a fox", steps=1), seed=1)
    reference = alone(StepScheduler(pipe, StepConfig(host_threads=False, rows=ROWS)), fox)
    scheduler = StepScheduler(pipe, StepConfig(rows=ROWS))
    alone(scheduler, StepRequest(call(pipe, "flux", "a boat", steps=1), seed=2))  # its running batch is made
    ticket = scheduler.submit(fox)
    ticket.prepared.result(timeout=30)
    scheduler._host.close()
    scheduler.run_once()  # its only step, then its finish
    assert ticket.state == "done" and np.array_equal(image(ticket), reference)


def test_text_encoders_whose_weights_cannot_be_versioned_are_never_reused():
    """Inference tensors keep no version counter: their encodings are made every time, never reused."""
    from bcg_diffusion.serving.batching.stepping.text_reuse import ReusedEncodings, weights_signature

    plain = torch.nn.Linear(2, 2)
    with torch.inference_mode():
        frozen = torch.nn.Linear(2, 2)
    assert weights_signature([plain]) is not None and weights_signature([frozen]) is None
    reuse = ReusedEncodings(lambda: [frozen])
    key, found = reuse.lookup(("",))
    reuse.store(key, {"x": torch.zeros(1)})
    assert key is None and found is None and reuse.lookup(("",)) == (None, None) and reuse.counts()["kept"] == 0
    kept = ReusedEncodings(lambda: [plain], size=1)
    for text in ("a", "b", "a"):
        key, found = kept.lookup((text,))
        assert found is None  # "a" was dropped for "b" (one entry kept)
        kept.store(key, {"x": torch.zeros(1)})
    assert kept.lookup(("a",))[1] is not None and kept.counts() == {"hits": 1, "misses": 3, "kept": 1}
