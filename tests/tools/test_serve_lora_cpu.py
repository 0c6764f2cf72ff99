"""LoRA adapters per request (issue 35), on the CPU with tiny Flux: the application in-process (FastAPI's test
client), the start-up failures through the serve command's ``main``.

Three random adapters (ranks 4 and 8, one with alpha != rank, one on fewer modules) are written once for the
module. What is checked: an adapter changes the image; base requests equal a server without adapters bitwise;
an adapter's image equals a twin pipeline with the same file loaded by diffusers' ``load_lora_weights`` (and
``set_adapters`` for a scale) bitwise; switching adapters leaves BCG's weight fingerprint as it was (so a GPU
replays, never recaptures); one device slot (LRU) gives the images of three; unknown ``model`` is a 404; every
start-up failure names its adapter.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import httpx
import pytest
import torch

pytest.importorskip("peft")
pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

import bcg_pipelines as pipelines  # noqa: E402
from bcg_diffusion.integration.fingerprint import WeightsFingerprint  # noqa: E402
from bcg_diffusion.serving import command_line, serve_command  # noqa: E402
from bcg_diffusion.serving.adapters.bank import AdapterBank  # noqa: E402
from bcg_diffusion.serving.adapters.options import AdapterSpec  # noqa: E402
from bcg_diffusion.serving.http.app import create_app  # noqa: E402
from bcg_diffusion.serving.catalog import ModelCatalog  # noqa: E402
from bcg_diffusion.serving.http.png import encode_png_b64  # noqa: E402
from bcg_diffusion.serving.granularity import pixel_granularity  # noqa: E402
from bcg_diffusion.serving.assembly.model import BuiltModel  # noqa: E402
from bcg_diffusion.serving.assembly.planner import make_planner  # noqa: E402
from bcg_diffusion.serving.server_build import build_server  # noqa: E402
from bcg_diffusion.serving.server_plan import ServerPlan, read_plan  # noqa: E402
from bcg_diffusion.serving.calls import Batch  # noqa: E402
from bcg_diffusion.serving.runner import CallRunner  # noqa: E402
from bcg_diffusion.serving.worker import ServerCounters  # noqa: E402

from _loras import ADAPTERS, unknown_module, write_adapters, wrong_shapes  # noqa: E402

PATH = "/v1/images/generations"
BASE = "flux"
BODY = {"prompt": "a red fox in the snow", "size": "64x64", "seed": 7, "num_inference_steps": 2}
NAMES = list(ADAPTERS)


@pytest.fixture(scope="module")
def loras(tmp_path_factory) -> dict[str, Path]:
    return write_adapters(tmp_path_factory.mktemp("loras"))


def _pipe():
    return pipelines.build_pipeline("flux", "tiny", device="cpu", dtype=torch.float32, seed=0)


def _plan(*extra: str) -> ServerPlan:
    parser = command_line.build_parser()
    argv = ["--model", BASE, "--device", "cpu", "--steps", "2", "--max-pixels", str(128 * 128), "--max-steps", "8",
            "--max-n", "2", *extra]
    return read_plan(parser.parse_args(argv), parser)


def _lora_options(loras: dict[str, Path] | None, slots: int | None = None, rank: int | None = None) -> list[str]:
    words = [w for n, p in (loras or {}).items() for w in ("--lora", f"{n}={p}")]
    words += ["--lora-gpu-slots", str(slots)] if slots is not None else []
    return words + (["--lora-rank", str(rank)] if rank is not None else [])


@contextlib.contextmanager
def serving(loras: dict[str, Path] | None, slots: int | None = None, rank: int | None = None):
    """A test client of the application as ``bcg-serve`` builds it (nothing to warm: the CPU runs eagerly, no
    --warmup; the adapters' pass still selects the first adapter), and the server's state."""
    state = build_server(_plan(*_lora_options(loras, slots, rank)))
    try:
        with TestClient(create_app(state)) as client:
            yield client, state
    finally:
        state.stop()


def image(client, **fields) -> str:
    response = client.post(PATH, json={**BODY, **fields})
    assert response.status_code == 200, response.text
    (entry,) = response.json()["data"]
    return entry["b64_json"]


@pytest.fixture(scope="module")
def plain():
    with serving(None) as (client, _):
        yield client


@pytest.fixture(scope="module")
def adapted(loras):
    with serving(loras) as served:
        yield served


def test_base_requests_equal_a_server_without_adapters_and_adapters_change_the_image(plain, adapted):
    client, _ = adapted
    base = image(plain)
    assert image(client) == base
    assert image(client, model=BASE) == base
    per_adapter = {name: image(client, model=name) for name in NAMES}
    assert image(client) == base  # after adapters, the base model again
    assert all(p != base for p in per_adapter.values()), "an adapter left the image as it was"
    assert len(set(per_adapter.values())) == len(NAMES), "two adapters gave the same image"
    assert image(client, model="anime", lora_scale=0.5) not in (base, per_adapter["anime"])
    assert image(plain, seed=8) == image(client, seed=8)


def _twin_image(path: Path, name: str, scale: float | None, planner) -> str:
    pipe = _pipe()
    pipe.load_lora_weights(str(path), adapter_name=name)
    if scale is not None:
        pipe.set_adapters(name, scale)
    job = planner.parse(json.dumps(BODY).encode())
    (result,) = CallRunner(pipe, torch.device("cpu"), ServerCounters()).run(Batch.alone(job).call())
    (picture,) = result.images
    return encode_png_b64(picture)


@pytest.mark.parametrize("name, scale", [("anime", None), ("sketch", None), ("noir", None), ("sketch", 0.5)])
def test_an_adapter_equals_a_twin_with_diffusers_load_lora_weights(loras, adapted, name, scale):
    client, state = adapted
    plan = _plan()
    built = BuiltModel(state.runner.pipe, pipelines.get_family("flux"), plan.model.model_size,
                       state.planner.default_steps, pixel_granularity(state.runner.pipe, 16), takes_batch=True)
    planner = make_planner(built, plan)
    served = image(client, model=name, **({} if scale is None else {"lora_scale": scale}))
    assert served == _twin_image(loras[name], name, scale, planner)


def test_unknown_model_is_a_404_and_lora_scale_needs_an_adapter(adapted):
    client, state = adapted
    calls = state.runner.counters.pipeline_calls
    response = client.post(PATH, json={**BODY, "model": "no-such-lora"})
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model" and "anime" in error["message"]
    for fields, needle in (({"lora_scale": 0.5}, "applies to an adapter"),
                           ({"model": "anime", "lora_scale": 100.0}, "out of range"),
                           ({"model": "anime", "lora_scale": "1"}, "lora_scale")):
        response = client.post(PATH, json={**BODY, **fields})
        assert response.status_code == 400 and needle in response.json()["error"]["message"], response.text
    assert state.runner.counters.pipeline_calls == calls  # none reached the pipeline


def test_models_lists_the_base_model_and_every_adapter(adapted):
    client, _ = adapted
    body = client.get("/v1/models").json()
    assert [m["id"] for m in body["data"]] == [BASE, *NAMES]


def test_one_device_slot_gives_the_images_of_three_and_counts_swaps(loras):
    order = ["anime", "sketch", "noir", "anime", None, "sketch", "sketch"]
    runs = {}
    for slots in (1, 3):
        with serving(loras, slots=slots) as (client, _):
            runs[slots] = [image(client, **({} if n is None else {"model": n})) for n in order]
            stats = client.get("/stats").json()["adapters"]
        assert stats["gpu_slots"] == slots and stats["base_requests"] == 1
        assert {n: a["requests"] for n, a in stats["adapters"].items()} == {"anime": 2, "sketch": 3, "noir": 1}
        # the warm-up left anime in the slot and on the device; then sketch, noir, anime, sketch change the slot,
        # each a copy from the CPU with one device slot, only sketch's and noir's first with three
        assert stats["switches"] == 4
        assert stats["swaps"] == (4 if slots == 1 else 2), stats
        assert len(stats["on_device"]) == slots
        assert stats["captures_after_warmup"] is None  # no BCG on the CPU
    assert runs[1] == runs[3]


def test_switching_adapters_keeps_the_weight_fingerprint(loras):
    """BCG keys graphs on this fingerprint: equal fingerprints mean a replay, so a switch captures nothing. The
    base model (adapters disabled) is a key of its own, captured at warm-up as well."""
    pipe = _pipe()
    bank = AdapterBank(pipe, [AdapterSpec(n, str(p)) for n, p in loras.items()], ModelCatalog(BASE, tuple(loras)),
                       gpu_slots=1)
    bank.load()
    fingerprint = WeightsFingerprint(pipe.transformer)
    base = fingerprint.compute()
    seen = []
    for name, scale in (("anime", 1.0), ("sketch", 1.0), ("noir", 0.25), ("anime", 2.0)):
        bank.select(name, scale)
        seen.append(fingerprint.compute())
    bank.select(None)
    assert fingerprint.compute() == base
    assert all(f == seen[0] for f in seen) and seen[0] != base


# -- start-up failures ----------------------------------------------------------------------------------------
def _serve(capsys, *argv) -> tuple[int, str, str]:
    code = serve_command.main(["--model", "flux", "--device", "cpu", "--steps", "2", "--port", "0", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_start_up_failures_name_the_adapter(loras, tmp_path, capsys):
    bad_shapes = wrong_shapes(loras["anime"], tmp_path / "shapes.safetensors")
    bad_module = unknown_module(loras["anime"], tmp_path / "module.safetensors")
    cases = [
        (["--lora", f"ghost={tmp_path / 'missing.safetensors'}"], ["ghost", "does not exist"]),
        (["--lora", f"shapes={bad_shapes}"], ["shapes", "input features"]),
        (["--lora", f"elsewhere={bad_module}"], ["elsewhere", "no_such_block", "does not have"]),
        (["--lora", f"anime={loras['anime']}", "--lora", f"sketch={loras['sketch']}", "--lora-rank", "4"],
         ["sketch", "rank 8 is above the hot-swap rank --lora-rank 4"]),
        (["--lora", f"anime={loras['anime']}", "--lora", f"anime={loras['sketch']}"], ["anime", "twice"]),
        (["--lora", f"{BASE}={loras['anime']}"], [BASE, "base model"]),
    ]
    for argv, needles in cases:
        code, out, err = _serve(capsys, *argv)
        assert code == 2 and all(n in err for n in needles), (argv, err)
        assert "listening on" not in out


@pytest.mark.parametrize("argv, needle", [
    (["--lora", "no-equals-sign"], "expected NAME=PATH"),
    (["--lora", "=x.safetensors"], "must start with a letter"),
    (["--lora", "bad name=x.safetensors"], "must start with a letter"),
    (["--lora-rank", "8"], "--lora-rank applies to adapters"),
    (["--lora", "a=x", "--lora-gpu-slots", "0"], "--lora-gpu-slots must be >= 1"),
])
def test_bad_lora_options_exit_2_before_building(capsys, argv, needle):
    code, out, err = _serve(capsys, *argv)
    assert code == 2 and needle in err, err
    assert "building" not in out


def test_a_pipeline_without_lora_support_is_refused_by_name(loras, capsys):
    code = serve_command.main(["--model", "pixart", "--device", "cpu", "--steps", "2", "--port", "0",
                        "--lora", f"anime={loras['anime']}"])
    err = capsys.readouterr().err
    assert code == 2 and "PixArtSigmaPipeline" in err and "takes no LoRA" in err, err


# -- a live server and the load test ----------------------------------------------------------------------------
def test_the_mix_draws_models_only_when_given():
    from bcg_diffusion.serving.load.mix import MixSpec, build_mix

    plain = build_mix(MixSpec(), 12)
    with_models = build_mix(MixSpec(models=(BASE, "anime")), 12)
    assert all("model" not in b for b in plain) and {b["model"] for b in with_models} == {BASE, "anime"}
    assert [{k: v for k, v in b.items() if k != "model"} for b in with_models][:1] == plain[:1]


def test_a_live_server_serves_adapters_to_the_load_test(loras, tmp_path, capsys):
    from _scripts import load_script
    from bcg_diffusion.serving.load.spawn import start_server, stop_server, wait_ready

    options = " ".join(f"--lora {name}={path}" for name, path in loras.items())
    spawned = start_server(f"--model flux --device cpu --steps 2 --warmup 64x64 --max-pixels 16384 --lora-gpu-slots 1 "
                           f"{options}", tmp_path / "server.log")
    try:
        wait_ready([spawned], 300)
        out = tmp_path / "load.json"
        code = load_script("load").main(["--url", spawned.url, "--requests", "8", "--concurrency", "2", "--sizes",
                                          "64x64", "--seeds", "2", "--models", f"{BASE},{','.join(NAMES)}",
                                          "--out", str(out), "--request-timeout", "120", "--time-limit", "240"])
        report = capsys.readouterr().out
        assert code == 0, report
        assert f"ok at model {NAMES[0]}" in report
        (summary,) = json.loads(out.read_text())["servers"]
        assert sum(m["ok"] for m in summary["per_model"].values()) == 8
        adapters = summary["adapters"]
        assert adapters["base_requests"] == summary["per_model"].get(BASE, {}).get("ok", 0)
        assert {n: a["requests"] for n, a in adapters["adapters"].items()} == {
            n: summary["per_model"].get(n, {}).get("ok", 0) for n in NAMES}
        models = httpx.get(f"{spawned.url}/v1/models", timeout=30, trust_env=False).json()
        assert [m["id"] for m in models["data"]] == [BASE, *NAMES]
    finally:
        stop_server(spawned)


def test_a_batch_serves_one_adapter_and_equals_its_requests_alone(adapted):
    _, state = adapted
    planner, runner = state.planner, state.runner

    def job(**fields):
        return planner.parse(json.dumps({**BODY, **fields}).encode())

    def run(jobs, rows):
        return runner.run(Batch(tuple(jobs), rows).call())

    pair = [job(model="sketch", seed=1), job(model="sketch", seed=2)]
    batched = [encode_png_b64(r.images[0]) for r in run(pair, rows=3)]
    assert batched == [encode_png_b64(run([j], rows=3)[0].images[0]) for j in pair]
    with pytest.raises(ValueError, match="different adapters"):
        run([job(model="sketch"), job(model="noir")], rows=2)
    with pytest.raises(ValueError, match="different adapters"):
        run([job(model="sketch"), job(model="sketch", lora_scale=0.5)], rows=2)


def test_a_replica_state_serves_the_adapters_too(loras):
    """Ray Serve replicas build their state as bcg-serve does (replica_state.py): with the adapters."""
    from bcg_diffusion.serving.replicas.state import build_server_state, parse_server_args, stop_server_state

    args = parse_server_args(f"--model flux --device cpu --steps 2 --lora anime={loras['anime']} "
                             f"--lora noir={loras['noir']} --lora-gpu-slots 1")
    state = build_server_state(args)
    try:
        assert state.model_ids() == [BASE, "anime", "noir"]
        assert state.runner.adapters is not None and state.runner.adapter_stats["gpu_slots"] == 1
    finally:
        stop_server_state(state)
