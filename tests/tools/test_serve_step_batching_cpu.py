"""The server's step batching (``--batching step``, issue 46) on the CPU with tiny PixArt-Sigma: the step batcher
on the worker thread (every image equal to the same request alone, a failure confined to its request, unbatched
work let in between steps, the warm-up, ``/stats``), the options, the open-loop arrivals of ``bcg-load``, and a live
server loaded open-loop with every image checked against the same request alone.

The live server is ``bcg-serve``'s start-up and application in this process (as a Ray replica builds it), served by
uvicorn on a thread, on 127.0.0.1, and stopped at teardown (a server process of its own would cost a second import
of torch and diffusers); every request has a timeout.
"""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest
import torch
import uvicorn

import bcg_pipelines as pipelines
from bcg_diffusion.serving.load import command as load_test
from bcg_diffusion.serving.batching.request_batching import BatchPolicy, BatchShapes
from bcg_diffusion.serving.http.app import create_app
from bcg_diffusion.serving.http.listen import bind_socket, url_of
from bcg_diffusion.serving.load.run import poisson_arrivals
from bcg_diffusion.serving.http.png import encode_png_b64, pixel_hash
from bcg_diffusion.serving.replicas.state import (
    ServerOptionsError,
    build_server_state,
    check_server_args,
    parse_server_args,
)
from bcg_diffusion.toolkit.sizes import Size
from bcg_diffusion.serving.catalog import ModelCatalog  # noqa: E402
from bcg_diffusion.serving.requests import ImageRequest, RequestLimits, RequestPlanner
from bcg_diffusion.serving.batching.step_batching import StepBatcher
from bcg_diffusion.serving.batching.stepping import StepConfig, StepError
from bcg_diffusion.serving.faults import InjectedFailure
from bcg_diffusion.serving.runner import CallRunner
from bcg_diffusion.serving.worker import PipelineWorker, ServerCounters

from _faults import installed

ROWS = 3
TIMEOUT_S = 120
SERVER_ARGS = ("--model pixart --no-resolution-binning --steps 2 --max-batch 3 --batching step --warmup 64x64 "
               "--default-size 64x64")


@pytest.fixture(scope="module")
def planner():
    spec = pipelines.get_family("pixart")
    pipe = pipelines.build_pipeline("pixart", size="tiny", device="cpu", seed=0)
    pipe.set_progress_bar_config(disable=True)
    limits = RequestLimits(granularity=spec.spatial_multiple, max_pixels=2**20, max_steps=50, max_n=ROWS)
    return RequestPlanner(pipe, spec, "tiny", limits, ModelCatalog(spec.name), Size(64, 64), 2,
                          resolution_binning=False)


@pytest.fixture
def batcher(planner):
    worker = PipelineWorker()
    runner = CallRunner(planner.pipe, torch.device("cpu"), ServerCounters())
    shapes = BatchShapes(planner.pipe, BatchPolicy(ROWS), planner.limits.granularity)
    step = StepBatcher(worker, runner, shapes, StepConfig(rows=ROWS))
    with installed(["error:boom"]):
        yield step
    step.stop()
    worker.stop()


def job(planner, prompt: str, seed: int, size: str = "64x64", steps: int = 3):
    return planner.job(ImageRequest(prompt=prompt, seed=seed, size=size, num_inference_steps=steps))


def hashes(future) -> list[str]:
    _joined, result = future.result(timeout=TIMEOUT_S)
    return [pixel_hash(encode_png_b64(im)) for im in result.images]


def test_the_step_batcher_answers_each_request_as_alone_and_confines_a_failure(planner, batcher):
    report = batcher.warm(planner, [Size(64, 64)])
    assert report.sizes == ["64x64"] and report.captures == 0 and batcher.runner.counters.pipeline_calls == 0
    jobs = [job(planner, "a red fox", 1), job(planner, "a lighthouse", 2, "64x128"), job(planner, "boom", 3),
            job(planner, "ramen", 4, steps=5), job(planner, "a red fox", 5), job(planner, "a boat", 6, "64x128")]
    futures = [batcher.submit(j) for j in jobs]
    with pytest.raises(InjectedFailure):
        futures[2].result(timeout=TIMEOUT_S)
    together = {i: hashes(f) for i, f in enumerate(futures) if i != 2}
    for i, together_hashes in together.items():
        assert hashes(batcher.submit(jobs[i])) == together_hashes, jobs[i].prompt  # alone: the same image
    counters = batcher.runner.counters
    assert counters.pipeline_calls == 6 + 5 and counters.pipeline_failures == 1 and batcher.pending == 0
    snapshot = batcher.stats.snapshot()
    assert snapshot["mode"] == "step" and snapshot["max_batch"] == ROWS and snapshot["requests"]["failed"] == 1
    assert len(snapshot["steps_per_key"]) == 2 and "3" in snapshot["active_rows_per_step"]  # both sizes, a full step



def test_an_unexpected_failure_is_logged_with_where_it_came_from(planner, batcher, caplog):
    """A failure that is not injected, nor out of memory, is logged with its traceback: a note, since the error is
    handed on without the traceback object (bcg_diffusion.toolkit.failed_calls); an injected one without."""
    from bcg_diffusion.serving.faults import install_fault_hook

    def a_bug_at_the_boundary():
        raise RuntimeError("a bug")

    class Bug:
        def fault(self, prompts):
            return a_bug_at_the_boundary if "a bug" in prompts else None

    remove = install_fault_hook(Bug())
    try:
        with caplog.at_level("ERROR", logger="bcg_diffusion.serving.batching.step_batching"):
            with pytest.raises(RuntimeError, match="a bug"):
                batcher.submit(job(planner, "a bug", 1)).result(timeout=TIMEOUT_S)
            with pytest.raises(InjectedFailure):
                batcher.submit(job(planner, "boom", 2)).result(timeout=TIMEOUT_S)
    finally:
        remove()
    bug, boom = (next(r for r in caplog.records if word in r.getMessage()) for word in ("a bug", "boom"))
    assert bug.exc_info and "in a_bug_at_the_boundary" in caplog.text and not boom.exc_info

def test_unbatched_work_runs_between_two_steps(planner, batcher):
    futures = [batcher.submit(job(planner, f"prompt {i}", i, steps=6)) for i in range(ROWS)]
    other = batcher.worker.submit(lambda: "unbatched call")
    assert other.result(timeout=TIMEOUT_S) == "unbatched call"
    assert not all(f.done() for f in futures)  # it did not wait for the running batch to finish
    assert all(len(hashes(f)) == 1 for f in futures)


def test_a_stopped_step_batcher_fails_what_it_holds_and_refuses_more(planner, batcher):
    batcher.stop()
    future = batcher.submit(job(planner, "a red fox", 1))
    assert isinstance(future.exception(timeout=TIMEOUT_S), StepError)


@pytest.mark.parametrize("args, message", [
    ("--model pixart --batching step", "--batching step needs --max-batch ROWS of 2 or more"),
    ("--model pixart --max-batch 4 --step-policy oldest_first", "--step-policy applies to --batching step"),
    ("--model qwenimage --max-batch 2 --batching step", "qwenimage (QwenImagePipeline) has no step loop"),
])
def test_step_options_are_checked_before_anything_is_built(args, message):
    with pytest.raises(ServerOptionsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_server_args(parse_server_args(args))
    plan = check_server_args(parse_server_args("--model pixart --max-batch 4 --batching step --step-policy oldest_first"))
    assert plan.batching.step == StepConfig(rows=4, policy="oldest_first")


def test_open_loop_arrivals_are_a_seeded_poisson_process():
    arrivals = poisson_arrivals(20.0, 4000, seed=3)
    assert arrivals == poisson_arrivals(20.0, 4000, seed=3) != poisson_arrivals(20.0, 4000, seed=4)
    assert all(b > a for a, b in zip(arrivals, arrivals[1:]))
    assert arrivals[-1] / len(arrivals) == pytest.approx(1 / 20.0, rel=0.05)  # the mean gap is 1 / rate
    with pytest.raises(ValueError, match="rate must be > 0"):
        poisson_arrivals(0.0, 3, seed=0)


@pytest.fixture
def live_server():
    """``bcg-serve SERVER_ARGS`` built in this process and served on a thread; its URL."""
    state = build_server_state(parse_server_args(SERVER_ARGS))
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(create_app(state), log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started and thread.is_alive():
            thread.join(0.05)
        assert server.started, "uvicorn did not start"
        yield url_of(sock)
    finally:
        server.should_exit = True
        thread.join(TIMEOUT_S)
        sock.close()
        state.stop()


def test_a_live_step_server_under_open_loop_load(live_server, tmp_path, capsys):
    out = tmp_path / "load.json"
    code = load_test.main(["--url", live_server, "--requests", "12", "--arrival-rate", "6", "--sizes",
                           "64x64,64x128", "--steps", "2", "--check-alone", "--time-limit", "60",
                           "--request-timeout", "60", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    result = json.loads(out.read_text())
    (summary,) = result["servers"]
    assert result["arrival_rate"] == 6 and summary["open_loop"]["sent"] == 12 and summary["ok"] == 12
    assert summary["alone_check"]["equal"] == summary["alone_check"]["distinct"] > 0
    batching = summary["batching"]
    assert batching["mode"] == "step" and batching["steps"] > 0 and 0 < batching["occupancy"] <= 1
    assert "step batching (3 slots, round_robin)" in printed
    with urllib.request.urlopen(f"{live_server}/stats", timeout=30) as answer:
        reused = json.loads(answer.read())["batching"]["negative_encodings"]
    assert reused["hits"] >= 12 and reused["kept"] >= 1, reused  # every request's negative prompt: the same
