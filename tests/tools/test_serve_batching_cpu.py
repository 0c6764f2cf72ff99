"""Request batching (issue 35) on the CPU with tiny pipelines: a request's image does not depend on its batch
(bitwise, alone and at every position of batches of different composition), what may share a call, how the
batcher forms batches, failures inside a batch, the work rule, and a live server whose concurrent requests form
batches (``/stats``) with every image equal to the same request sent alone.

The live server (tiny Flux, 2 steps, ``--max-batch 4``) listens on 127.0.0.1 and is stopped at teardown; every
request has a timeout.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch

import bcg_pipelines as pipelines
from bcg_diffusion.serving.batching.request_batching import BatchPolicy, BatchShapes, BatchStats, RequestBatcher, batch_key
from bcg_diffusion.serving.calls import Batch, row_seeds
from bcg_diffusion.serving.faults import InjectedFailure
from bcg_diffusion.serving.http.png import encode_png_b64, pixel_hash
from bcg_diffusion.serving.catalog import ModelCatalog  # noqa: E402
from bcg_diffusion.toolkit.sizes import Size  # noqa: E402
from bcg_diffusion.serving.requests import GenerationJob, ImageRequest, RequestLimits, RequestPlanner
from bcg_diffusion.serving.load.spawn import spawned_servers

from _serve_http import pixels, post
from _serve_http import stats as server_stats
from bcg_diffusion.serving.runner import CallRunner
from bcg_diffusion.serving.startup_warmup import run_warmup
from bcg_diffusion.serving.worker import PipelineWorker, ServerCounters

from _faults import installed

ROWS = 4
START_TIMEOUT_S = 120
REQUEST_TIMEOUT_S = 120


# -------------------------------------------------------------------------------------------------------
# in-process: the same request alone and inside batches
# -------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def planners():
    out = {}
    for family in ("flux", "pixart"):
        spec = pipelines.get_family(family)
        pipe = pipelines.build_pipeline(family, size="tiny", device="cpu")
        pipe.set_progress_bar_config(disable=True)
        limits = RequestLimits(granularity=spec.spatial_multiple, max_pixels=2**20, max_steps=50, max_n=ROWS)
        out[family] = RequestPlanner(pipe, spec, "tiny", limits, ModelCatalog(spec.name), Size(64, 64), 2,
                                     resolution_binning=False)
    return out


def job(planner, prompt: str, seed: int, n: int = 1, **extra) -> GenerationJob:
    return planner.job(ImageRequest(prompt=prompt, seed=seed, n=n, size="64x64", **extra))


def hashes(results) -> list[list[str]]:
    return [[pixel_hash(encode_png_b64(im)) for im in r.images] for r in results]


def runner_of(planner, counters: ServerCounters | None = None) -> CallRunner:
    return CallRunner(planner.pipe, torch.device("cpu"), counters or ServerCounters())


def run_batch(runner: CallRunner, jobs, rows: int):
    """The jobs as one batched call of ``rows`` rows, as the batcher runs them: one result per job."""
    return runner.run(Batch(tuple(jobs), rows).call())


@pytest.mark.parametrize("family", ["flux", "pixart"])  # pixart: classifier-free guidance doubles the rows
def test_a_request_gives_the_same_image_alone_and_in_any_batch(planners, family):
    planner = planners[family]
    runner = runner_of(planner)
    a = job(planner, "a red fox in the snow", 7)
    b = job(planner, "a lighthouse in a storm", 3, n=2)
    c = job(planner, "a bowl of ramen", 1)
    (alone_a,) = hashes(run_batch(runner, [a], ROWS))
    (alone_b,) = hashes(run_batch(runner, [b], ROWS))
    (alone_c,) = hashes(run_batch(runner, [c], ROWS))
    assert alone_a != alone_c and alone_b[0] != alone_b[1]  # different requests, different images
    for batch in ([a, b], [b, a], [c, b, a], [b, c, a], [a, c], [c, a, b]):  # every position, every composition
        got = dict(zip(map(id, batch), hashes(run_batch(runner, batch, ROWS))))
        assert got[id(a)] == alone_a, [j.prompt for j in batch]
        if b in batch:
            assert got[id(b)] == alone_b, [j.prompt for j in batch]
        if c in batch:
            assert got[id(c)] == alone_c, [j.prompt for j in batch]


def test_image_i_of_a_request_is_drawn_from_seed_plus_i(planners):
    planner = planners["flux"]
    runner = runner_of(planner)
    (two,) = hashes(run_batch(runner, [job(planner, "a fox", 10, n=2)], ROWS))
    (second,) = hashes(run_batch(runner, [job(planner, "a fox", 11)], ROWS))
    assert two[1] == second[0]
    assert row_seeds(2**64 - 1, 2) == [2**64 - 1, 0]


def test_a_batch_is_one_call_and_its_failure_fails_every_request(planners):
    planner = planners["flux"]
    counters = ServerCounters()
    runner = runner_of(planner, counters)
    jobs = [job(planner, "a fox", 1), job(planner, "a cat", 2, n=2)]
    results = run_batch(runner, jobs, ROWS)
    assert counters.pipeline_calls == 1 and [len(r.images) for r in results] == [1, 2]
    assert all((r.batch_requests, r.batch_rows) == (2, ROWS) for r in results)
    with installed(["error:__fail__"]), pytest.raises(InjectedFailure):
        run_batch(runner, [jobs[0], job(planner, "__fail__", 3)], ROWS)
    assert (counters.pipeline_calls, counters.pipeline_failures) == (2, 1)
    with pytest.raises(ValueError, match="does not fit"):
        run_batch(runner, [job(planner, "a", 1, n=3), job(planner, "b", 1, n=2)], ROWS)


def test_the_batch_key_keeps_apart_what_cannot_share_a_call(planners):
    planner = planners["pixart"]
    base = job(planner, "a fox", 1)
    assert batch_key(base) == batch_key(job(planner, "another prompt", 99, n=3))  # prompt, seed, n: per row
    others = [planner.job(ImageRequest(prompt="a fox", size="64x80")),
              planner.job(ImageRequest(prompt="a fox", size="64x64", num_inference_steps=3)),
              planner.job(ImageRequest(prompt="a fox", size="64x64", guidance_scale=2.0)),
              planner.job(ImageRequest(prompt="a fox", size="64x64", negative_prompt="blurry"))]
    import dataclasses

    others += [dataclasses.replace(base, adapter="lora-a"), dataclasses.replace(base, adapter="lora-a", adapter_scale=0.5)]
    keys = [batch_key(j) for j in [base, *others]]
    assert len(set(keys)) == len(keys)


def test_the_warmup_runs_batched_sizes_at_their_batch_shape(planners, monkeypatch):
    import bcg_diffusion

    planner = planners["flux"]
    seen = []
    monkeypatch.setattr(bcg_diffusion, "warmup", lambda pipe, shapes, **call: seen.append((shapes, call))
                        or type("R", (), {"total_s": 0.0, "captures": 0})(), raising=False)
    shapes = BatchShapes(planner.pipe, BatchPolicy(max_batch=ROWS, work_limit=64 * 64 * 10_000), 16)
    shapes.hidden = 1  # work = latent tokens: 64x64 (16 tokens) is batched, 256x256 (256 tokens) is not
    shapes.policy = BatchPolicy(max_batch=ROWS, work_limit=100)
    report = run_warmup(runner_of(planner), planner, [Size(64, 64), Size(256, 256)], shapes)
    (batched_shapes, batched), *alone = seen
    assert batched_shapes == [dict(height=64, width=64)] and batched["prompt"] == [batched["prompt"][0]] * ROWS
    assert batched["num_images_per_prompt"] == 1  # a batched call has its rows whatever its requests' n
    # the size left alone: one call per n a request may ask for, each n an input shape of its own
    assert [call["num_images_per_prompt"] for _, call in alone] == list(range(1, planner.max_n + 1))
    assert all(s == [dict(height=256, width=256)] and isinstance(c["prompt"], str) for s, c in alone)
    assert report.captures == 0 and len(report.reports) == 1 + planner.max_n


def test_the_work_rule(planners):
    flux, pixart = planners["flux"], planners["pixart"]
    shapes = BatchShapes(pixart.pipe, BatchPolicy(max_batch=ROWS, work_limit=10**12), 16)
    call = pixart.default_job(Size(64, 64)).call
    assert shapes.cfg_rows(call) == 2  # PixArt's default guidance runs CFG
    hidden = shapes.hidden
    assert shapes.work(Size(64, 64), call) == 16 * hidden * 2
    assert BatchShapes(flux.pipe, BatchPolicy(max_batch=ROWS), 16).cfg_rows(flux.default_job(Size(64, 64)).call) == 1
    tight = BatchShapes(pixart.pipe, BatchPolicy(max_batch=ROWS, work_limit=16 * hidden * 2), 16)
    assert tight.rows(Size(64, 64), call) == ROWS and tight.rows(Size(64, 80), call) == 1
    assert "NOT batched: compute-bound" in tight.describe(Size(64, 80), call) and "batched, 4 rows" in tight.describe(Size(64, 64), call)
    off = BatchShapes(pixart.pipe, BatchPolicy(max_batch=1), 16)
    assert off.rows(Size(64, 64), call) == 1
    assert BatchShapes(pixart.pipe, BatchPolicy(max_batch=ROWS, work_limit=0), 16).rows(Size(4096, 4096), call) == ROWS


# -------------------------------------------------------------------------------------------------------
# in-process: the batcher (a stand-in for the pipeline)
# -------------------------------------------------------------------------------------------------------
def _fake_job(size: str, n: int = 1, steps: int = 2, adapter=None) -> GenerationJob:
    wxh = Size.parse(size)
    call = {"prompt": "p", "height": wxh.height, "width": wxh.width, "num_inference_steps": steps,
            "num_images_per_prompt": n}
    return GenerationJob("p", wxh, n, steps, 0, None, None, call, adapter=adapter)


class _Recorder:
    def __init__(self, fail: bool = False, delay_s: float = 0.0):
        self.batches, self.fail, self.delay_s = [], fail, delay_s
        self.on_call = lambda: None

    def __call__(self, batch):
        jobs = batch.jobs
        self.batches.append((list(jobs), batch.rows))
        self.on_call()
        time.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("batch failed")
        return [f"result-{id(j)}" for j in jobs]


def _batcher(recorder, window_s: float, rows: int = ROWS):
    shapes = type("Shapes", (), {"policy": BatchPolicy(max_batch=rows, window_s=window_s),
                                 "rows_of": staticmethod(lambda job: rows)})()
    worker = PipelineWorker()
    return RequestBatcher(worker, recorder, shapes, BatchStats(shapes.policy)), worker


def test_the_batcher_never_mixes_keys_and_fills_up_to_the_rows():
    recorder = _Recorder(delay_s=0.05)
    batcher, worker = _batcher(recorder, window_s=0.3)
    try:
        jobs = [_fake_job("64x64"), _fake_job("64x80"), _fake_job("64x64", n=2), _fake_job("64x64", steps=3),
                _fake_job("64x64"), _fake_job("64x64", adapter="a"), _fake_job("64x64", n=2), _fake_job("64x80")]
        futures = [batcher.submit(j) for j in jobs]
        results = [f.result(timeout=30) for f in futures]
    finally:
        batcher.stop()
        worker.stop()
    assert [r for _, r in results] == [f"result-{id(j)}" for j in jobs]  # each job gets its own result
    for batch, rows in recorder.batches:
        assert len({batch_key(j) for j in batch}) == 1, batch  # one key per call
        assert sum(j.n for j in batch) <= rows == ROWS
    index = {id(j): i for i, j in enumerate(jobs)}  # equal jobs compare equal: tell them apart by identity
    grouped = sorted(sorted(index[id(j)] for j in batch) for batch, _ in recorder.batches)
    # 64x64 at 2 steps: 1 + 2 + 1 rows fill the first batch (arrival order), the later n=2 waits for the next
    assert grouped == [[0, 2, 4], [1, 7], [3], [5], [6]], grouped
    stats = batcher.stats.snapshot()
    assert stats["batches"] == 5 and stats["batched_requests"] == 8
    assert stats["requests_per_batch"] == {"1": 3, "2": 1, "3": 1}
    assert stats["images_per_batch"] == {"1": 2, "2": 2, "4": 1} and stats["filler_rows"] == 5 * ROWS - 10
    assert stats["wait_s"]["count"] == 8 and stats["wait_s"]["max"] >= stats["wait_s"]["mean"] > 0


def test_a_lone_request_waits_at_most_the_window():
    recorder = _Recorder()
    batcher, worker = _batcher(recorder, window_s=0.2)
    try:
        start = time.perf_counter()
        batcher.submit(_fake_job("64x64")).result(timeout=30)
        waited = time.perf_counter() - start
    finally:
        batcher.stop()
        worker.stop()
    assert 0.2 <= waited < 5.0
    assert 0.2 <= batcher.stats.snapshot()["wait_s"]["max"] < 5.0


class _ClosedLoop:
    """Closed-loop clients of a batcher: each sends a request, waits for its answer, takes ``round_trip_s``
    (a stand-in for PNG encoding and HTTP), sends the next. ``late`` clients start once the first call runs."""

    def __init__(self, batcher, recorder, clients: int, late: int, requests: int, round_trip_s: float):
        self.batcher, self.requests, self.round_trip_s = batcher, requests, round_trip_s
        self.latencies: list[float] = []
        first_call = threading.Event()
        recorder.on_call = first_call.set
        threads = [threading.Thread(target=self._client, args=(first_call if i >= clients - late else None,))
                   for i in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)

    def _client(self, start_after: threading.Event | None):
        if start_after is not None:
            start_after.wait(30)
        for _ in range(self.requests):
            sent = time.perf_counter()
            self.batcher.submit(_fake_job("64x64")).result(timeout=30)
            self.latencies.append(time.perf_counter() - sent)
            time.sleep(self.round_trip_s)


def _closed_loop(window_s: float, clients: int, late: int, requests: int, round_trip_s: float, call_s: float):
    recorder = _Recorder(delay_s=call_s)
    batcher, worker = _batcher(recorder, window_s=window_s, rows=8)
    try:
        loop = _ClosedLoop(batcher, recorder, clients, late, requests, round_trip_s)
    finally:
        batcher.stop()
        worker.stop()
    return [len(jobs) for jobs, _ in recorder.batches], batcher.stats.snapshot(), loop.latencies


def test_closed_loop_clients_fill_every_batch_once_the_previous_clients_are_back():
    # 3 clients start, 5 more once the first call runs (they queue behind it): the old rule ran those 5 alone
    # while the 3 were on their round trip, and 3 and 5 alternated for good; now the 5 wait for the 3 to return
    sizes, stats, _ = _closed_loop(window_s=0.5, clients=8, late=5, requests=5, round_trip_s=0.08, call_s=0.2)
    assert sizes == [3, 8, 8, 8, 8, 5], sizes  # the last: the 5 late clients' last requests, nobody else left
    assert stats["requests_per_batch"] == {"3": 1, "5": 1, "8": 4}, stats
    assert stats["closed_by"] == {"full": 4, "returns": 0, "window": 2}, stats
    assert stats["return_s"]["count"] >= 4 * 8 - 5 and 0.08 <= stats["return_s"]["mean"] < 0.5, stats


def test_a_window_shorter_than_the_round_trip_splits_the_clients():
    # why the window must cover a round trip: with 20 ms against 80 ms, the queued 5 run before the 3 are back
    sizes, stats, _ = _closed_loop(window_s=0.02, clients=8, late=5, requests=4, round_trip_s=0.08, call_s=0.2)
    assert sizes[:6] == [3, 5, 3, 5, 3, 5], sizes
    assert stats["closed_by"]["full"] == 0, stats


def test_a_single_client_waits_the_window_once_then_runs_at_once():
    sizes, stats, latencies = _closed_loop(window_s=0.3, clients=1, late=0, requests=5, round_trip_s=0.02,
                                           call_s=0.05)
    assert sizes == [1] * 5
    assert stats["closed_by"] == {"full": 0, "returns": 4, "window": 1}, stats
    assert 0.3 + 0.05 <= latencies[0] < 0.3 + 0.05 + 0.5, latencies  # the first: no return expected
    assert all(latency < 0.05 + 0.2 for latency in latencies[1:]), latencies  # then: its own return, no wait
    assert max(latencies) - 0.05 < 0.3 + 0.5  # never more than the window (plus scheduling) over the call


def test_a_failed_batch_fails_each_of_its_requests_and_the_batcher_goes_on():
    recorder = _Recorder(fail=True)
    batcher, worker = _batcher(recorder, window_s=0.3)
    try:
        futures = [batcher.submit(_fake_job("64x64")) for _ in range(3)]
        for future in futures:
            with pytest.raises(RuntimeError, match="batch failed"):
                future.result(timeout=30)
        recorder.fail = False
        assert batcher.submit(_fake_job("64x64")).result(timeout=30)[1].startswith("result-")
    finally:
        batcher.stop()
        worker.stop()
    assert [len(b) for b, _ in recorder.batches] == [3, 1]


def test_stopping_refuses_the_waiting_requests():
    recorder = _Recorder()
    batcher, worker = _batcher(recorder, window_s=60.0)
    future = batcher.submit(_fake_job("64x64"))
    batcher.stop()
    worker.stop()
    with pytest.raises(RuntimeError, match="stopping"):
        future.result(timeout=10)
    assert not recorder.batches
    assert isinstance(future, concurrent.futures.Future)


# -------------------------------------------------------------------------------------------------------
# a live server
# -------------------------------------------------------------------------------------------------------
SERVER_ARGS = ("--model flux --device cpu --steps 2 --warmup 64x64 --max-steps 8 --max-pixels 16384 "
               f"--max-batch {ROWS} --batch-window-ms 400 --batch-work-limit 0")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("serve_batching")
    with spawned_servers([SERVER_ARGS], log_dir, START_TIMEOUT_S, faults=["error:__fail__"]) as (spawned,):
        yield spawned


def test_the_server_says_how_it_batches(server):
    log = server.log_path.read_text()
    assert "batching: up to 4 images per call, window 400 ms" in log, log
    assert "64x64: batched, 4 rows per call" in log, log
    stats = server_stats(server.url)
    assert stats["batching"]["enabled"] is True and stats["batching"]["max_batch"] == ROWS
    assert stats["server"]["max_n"] == ROWS


def test_concurrent_requests_form_batches_and_each_image_equals_it_alone(server):
    bodies = [{"prompt": "a red fox", "size": "64x64", "seed": 1},
              {"prompt": "a lighthouse", "size": "64x64", "seed": 2, "n": 2},
              {"prompt": "a red fox", "size": "64x64", "seed": 3},
              {"prompt": "a red fox", "size": "64x80", "seed": 1},  # another size: never in the 64x64 batch
              {"prompt": "a red fox", "size": "64x64", "seed": 1, "num_inference_steps": 3}]  # other steps
    before = server_stats(server.url)["batching"]
    with ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(lambda b: post(server.url, b), bodies))
    batched = [pixels(r) for r in together]
    sizes = [int(r.headers["x-batch-requests"]) for r in together]
    assert max(sizes[:3]) > 1, sizes  # the three 64x64 2-step requests shared calls
    assert sizes[3] == 1 and sizes[4] == 1, sizes  # nothing shares a call with another size or step count
    assert all(r.headers["x-batch-rows"] == str(ROWS) for r in together)
    after = server_stats(server.url)["batching"]
    assert after["batched_requests"] - before["batched_requests"] == len(bodies)
    assert after["batches"] - before["batches"] < len(bodies)
    assert any(int(k) > 1 for k in after["requests_per_batch"]), after
    assert after["wait_s"]["count"] >= len(bodies) and after["wait_s"]["max"] > 0
    alone = []
    for body in bodies:  # one at a time: each runs in a batch of its own
        response = post(server.url, body)
        assert response.headers["x-batch-requests"] == "1"
        alone.append(pixels(response))
    assert batched == alone


def test_a_failure_in_a_batch_fails_its_requests_and_later_images_are_unchanged(server):
    body = {"prompt": "a quiet harbor", "size": "64x64", "seed": 4}
    reference = pixels(post(server.url, body))
    with ThreadPoolExecutor(2) as pool:
        failed, other = pool.map(lambda b: post(server.url, b), [{**body, "prompt": "__fail__"}, body])
    assert failed.status_code == 500 and "InjectedFailure" in failed.json()["error"]["message"]
    if other.status_code == 500:  # it shared the failing call
        assert "InjectedFailure" in other.json()["error"]["message"]
    else:
        assert pixels(other) == reference
    assert pixels(post(server.url, body)) == reference


def test_closed_loop_clients_fill_every_call_of_a_live_server(tmp_path):
    """8 closed-loop HTTP clients, ``--max-batch 8``: after the first call or two, every call carries 8 requests
    (the old 20 ms window, shorter than a round trip, split them into 3 and 5). The window here is 3 s, longer
    than the default 500 ms, so that a round trip on a loaded CI machine still fits it; the calls close because
    they are full or their clients are back, not by the window."""
    clients, per_client, window_s = 8, 4, 3.0
    args = ("--model flux --device cpu --steps 2 --warmup 64x64 --max-steps 8 --max-pixels 16384 "
            f"--max-batch {clients} --batch-window-ms {window_s * 1000:g}")
    with spawned_servers([args], tmp_path, START_TIMEOUT_S) as (spawned,):

        def client(i: int) -> list[int]:
            sizes = []
            with httpx.Client(base_url=spawned.url, timeout=REQUEST_TIMEOUT_S, trust_env=False) as http:
                for k in range(per_client):
                    body = {"prompt": f"client {i}", "size": "64x64", "seed": 100 * i + k}
                    response = http.post("/v1/images/generations", json=body)
                    assert response.status_code == 200, response.text
                    sizes.append(int(response.headers["x-batch-requests"]))
            return sizes

        with ThreadPoolExecutor(clients) as pool:
            seen = list(pool.map(client, range(clients)))
        batching = server_stats(spawned.url)["batching"]
    assert f"window {window_s * 1000:g} ms" in spawned.log_path.read_text()
    hist = batching["requests_per_batch"]
    assert batching["batched_requests"] == clients * per_client, batching
    partial = sum(v for k, v in hist.items() if k != str(clients))
    assert partial <= 2 and hist.get(str(clients), 0) >= per_client - 1, batching  # full but for the first call or two
    # a slow start may split the first requests (5, then 3 with 5 returns): each client's first and last aside,
    # every request went in a full call
    assert all(size == clients for sizes in seen for size in sizes[1:-1]), seen
    assert batching["closed_by"]["window"] <= 2, batching  # the first call and the tail only
    assert 0 < batching["return_s"]["max"] < window_s, batching  # a round trip fits the window


# -------------------------------------------------------------------------------------------------------
# the load test against a batching server
# -------------------------------------------------------------------------------------------------------
def test_load_reports_batching_models_and_the_alone_check(server, tmp_path, capsys):
    import json

    from bcg_diffusion.serving.load import command as load_test

    out = tmp_path / "load.json"
    code = load_test.main(["--url", server.url, "--requests", "8", "--concurrency", "4", "--sizes", "64x64",
                           "--prompts", "a fox|a cat", "--seeds", "2", "--models", "flux", "--check-alone",
                           "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    result = json.loads(out.read_text())
    (summary,) = result["servers"]
    assert summary["per_model"] == {"flux": {"requests": 8, "ok": 8, "p50": summary["per_model"]["flux"]["p50"]}}
    batching = summary["batching"]
    assert batching["batched_requests"] == 8 + 0 and batching["batches"] <= 8 and batching["max_batch"] == ROWS
    assert sum(batching["closed_by"].values()) == batching["batches"] and "closed by: full" in text, batching
    check = summary["alone_check"]
    assert check["distinct"] == check["equal"] == check["compared"] >= 2 and not check["mismatched"], check
    assert "alone check" in text and "requests per batched call" in text and "result: PASS" in text
    assert all(o["model"] == "flux" for o in result["outcomes"][summary["label"]])


def test_load_fails_on_an_unknown_model_and_on_a_missed_throughput_target(server, capsys):
    from bcg_diffusion.serving.load import command as load_test

    code = load_test.main(["--url", server.url, "--requests", "2", "--concurrency", "1", "--sizes", "64x64",
                           "--models", "flux,no-such-adapter", "--mix-seed", "3"])
    text = capsys.readouterr().out
    assert code == 1 and "404" in text and "ok at model no-such-adapter" in text, text
    assert load_test.main(["--url", server.url, "--min-throughput-ratio", "2"]) == 2  # needs two servers


def test_throughput_ratio_target():
    from bcg_diffusion.serving.load.report import throughput_ratio

    off = {"throughput_rps": 2.0, "latency_s": {"p99": 4.0}}
    on = {"throughput_rps": 4.0, "latency_s": {"p99": 3.0}}
    assert throughput_ratio(off, on, 1.8, 1.0) == {"throughput_ratio": 2.0, "p99_ratio": 0.75,
                                                    "min_throughput_ratio": 1.8, "max_p99_ratio": 1.0, "passed": True}
    assert throughput_ratio(off, on, 2.5, None)["passed"] is False
    assert throughput_ratio(off, on, None, 0.5)["passed"] is False
    assert throughput_ratio(off, on, None, None)["passed"] is None
