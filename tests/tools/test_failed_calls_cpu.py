"""A failed call's error is handed on without its traceback (bcg_diffusion.toolkit.failed_calls), where it came from
kept as a note: what a failed pipeline call held (its tensors, on the GPU in a server) is freed when the error
reaches the waiting request, not when the cyclic garbage collector gets to it. Checked with the collector off."""

from __future__ import annotations

import gc
import weakref

import pytest

from bcg_diffusion.serving.worker import PipelineWorker
from bcg_diffusion.toolkit.failed_calls import TRACEBACK_NOTE, without_traceback


class Held:
    """Stands for a call's tensors."""


@pytest.fixture
def collector_off():
    was = gc.isenabled()
    gc.disable()
    yield
    if was:
        gc.enable()


def failing_call(refs: list):
    held = Held()
    refs.append(weakref.ref(held))
    raise RuntimeError("the call failed")


def failing_call_that_read_its_locals(refs: list):
    """As a diffusers pipeline does for its step callback (``callback_kwargs[k] = locals()[k]``)."""
    held = Held()
    refs.append(weakref.ref(held))
    assert locals()["held"] is held
    raise RuntimeError("the call failed after reading its locals")


def caught(fn) -> BaseException:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001
        return exc
    raise AssertionError("did not raise")


def test_the_error_keeps_where_it_came_from_as_a_note_and_drops_its_traceback_and_its_contexts(collector_off):
    refs: list = []

    def during_handling():
        try:
            failing_call(refs)
        except RuntimeError:
            raise ValueError("while handling it")

    error = caught(lambda: failing_call(refs))
    assert refs[0]() is not None  # held by the traceback's frame
    assert without_traceback(error) is error and refs[0]() is None and error.__traceback__ is None
    assert error.__notes__[0].startswith(TRACEBACK_NOTE) and "in failing_call" in error.__notes__[0]
    chained = caught(during_handling)
    assert isinstance(chained.__context__, RuntimeError) and refs[1]() is not None
    without_traceback(chained)
    assert refs[1]() is None and chained.__context__.__traceback__ is None  # the context's frames too
    assert "in failing_call" in chained.__context__.__notes__[0]


def test_the_worker_hands_a_failure_to_its_request_without_the_calls_locals(collector_off):
    worker = PipelineWorker("test-worker")
    try:
        refs: list = []
        error = worker.submit(lambda: failing_call(refs)).exception(timeout=10)
        assert isinstance(error, RuntimeError) and str(error) == "the call failed"
        assert refs[0]() is None  # freed while the request still holds the error
    finally:
        worker.stop()


def test_a_call_that_read_its_locals_leaves_no_snapshot_holding_them(collector_off):
    refs: list = []
    error = caught(lambda: failing_call_that_read_its_locals(refs))
    assert refs[0]() is not None
    without_traceback(error)
    assert refs[0]() is None  # with the frame's ``locals()`` snapshot (which frame.clear() leaves before Python 3.13)



def test_a_failed_diffusers_call_hands_on_its_error_without_its_tensors(collector_off):
    """A diffusers pipeline that fails in its step callback, as the server's injected faults do: with its error still
    held (a waiting request holds it), none of the call's tensors is (the soak found 73-104 MiB more allocated at an
    idle checkpoint right after a failure: the pipeline's ``locals()`` snapshot, in reference cycles)."""
    import torch

    import bcg_pipelines

    pipe = bcg_pipelines.build_pipeline("sana", "tiny", device="cpu", dtype=torch.float32)
    tensors: list = []

    def fail(_pipe, _step, _timestep, callback_kwargs):
        tensors.extend(weakref.ref(t) for t in callback_kwargs.values())
        raise RuntimeError("injected")

    error = caught(lambda: pipe(prompt="a fox", num_inference_steps=2, height=64, width=64, output_type="latent",
                                callback_on_step_end=fail,
                                callback_on_step_end_tensor_inputs=["latents", "prompt_embeds"]))
    assert len(tensors) == 2 and all(t() is not None for t in tensors)  # held by the error's frames
    without_traceback(error)
    assert [t() for t in tensors] == [None, None]  # the latents and the text embeddings gone, the error kept
    assert str(error) == "injected" and "in __call__" in error.__notes__[0]  # the pipeline's frame, named


def test_a_request_answered_with_a_failed_call_is_freed_without_the_collector(collector_off):
    """The route that awaits a failed call: the shared error's traceback gets the route's frame; the frame must
    not keep the future (which keeps the error), or the request and its job wait for the cyclic collector."""
    import asyncio
    import concurrent.futures

    pytest.importorskip("fastapi")
    from bcg_diffusion.serving.http import routes

    class Job:
        size, n = "64x64", 1

    class Planner:
        class limits:
            max_body_bytes = 1024

        @staticmethod
        def parse(body):
            job = Job()
            refs.append(weakref.ref(job))
            return job

    class State:
        planner, max_queue = Planner(), 8

        @staticmethod
        def depth():
            return 0

        @staticmethod
        def submit(job):
            future = concurrent.futures.Future()
            future.set_exception(shared)
            held.append(future)  # as a batcher may, until its call is done
            return future

    class Request:
        headers: dict = {}

        async def stream(self):
            yield b"{}"

    refs: list = []
    held: list = []
    shared = without_traceback(RuntimeError("the batched call failed"))

    async def answer_twice():
        for _ in range(2):  # two requests of one batched call: one error
            response = await routes.generate(Request(), State())
            assert response.status_code == 500 and b"the batched call failed" in response.body
        await asyncio.sleep(0)

    asyncio.run(answer_twice())
    held.clear()  # the batcher lets go of the call's futures
    del shared  # (the error's traceback holds the frames of the routes it was raised in while the error lives)
    assert [ref() for ref in refs] == [None, None]
