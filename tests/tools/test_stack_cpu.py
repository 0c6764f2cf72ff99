"""The speed stack (issue 47) on the CPU: one parser for ``bcg-generate`` and ``bcg-serve`` (every stack option
accepted or refused alike, with the same message, by both commands and the replicas' parser), the warm-up plan of a
stacked server, the batching rule with a step cache (requests run alone, said at start), a step cache's state
reset before every call (a failed call changes no later image), and the stack benchmark's code path.

The servers here are built in this process (``replica_state.build_server_state``, ``bcg-serve``'s own start-up)
and served through FastAPI's test client: nothing listens on a port.
"""

from __future__ import annotations

import contextlib
import io
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from _faults import installed
from _serve_http import pixels
from bcg_diffusion.benchmarks.stack import stack_bench
from bcg_diffusion.benchmarks.stack.layers import layer_modes
from bcg_diffusion.cli import args as cli_args
from bcg_diffusion.cli import generate
from bcg_diffusion.cli import plan as cli_plan
from bcg_diffusion.serving import command_line, serve_command, server_plan
from bcg_diffusion.serving.http.app import create_app
from bcg_diffusion.serving.replicas.state import (
    ServerOptionsError,
    build_server_state,
    check_server_args,
    parse_server_args,
    stop_server_state,
)
from bcg_diffusion.serving.assembly.batching import CACHED_UNBATCHED
from bcg_diffusion.serving.startup_warmup import WARMUP_STEPS, plan_warmup
from bcg_diffusion.toolkit.sizes import Size
from bcg_diffusion.toolkit.stack import compiled_graphs
from bcg_diffusion.toolkit.stack_options import StackOptions

# -------------------------------------------------------------------------------------------------------
# one parser: both commands accept or refuse every stack option alike
# -------------------------------------------------------------------------------------------------------
YAML = Path(__file__).resolve().parents[2] / "scripts" / "stack_cache_dit.yaml"
ACCEPTED = [
    ([], StackOptions()),
    (["--quant", "int8wo"], StackOptions(quant="int8wo")),
    (["--cache", "fbc:0.2"], None),
    (["--cache", "dbcache:0.1"], None),
    (["--cache", "cache-dit:{yaml}"], None),  # the load run's settings file (docs/serving.md)
    (["--model", "pixart", "--cache", "magcache"], None),
    (["--compile"], StackOptions(compile=True)),
    (["--compile", "--compile-cache", "{dir}"], None),
    (["--attention-backend", "NATIVE"], StackOptions(attention_backend="native")),
    (["--quant", "int8", "--cache", "taylorseer:3", "--compile", "--attention-backend", "native"], None),
]
REFUSED = [
    (["--quant", "bogus"], "invalid choice: 'bogus'"),
    (["--quant", "fp8"], "--quant fp8: fp8 runs torchao's float8 kernels"),  # on the CPU
    (["--cache", "bogus:1"], "unknown cache 'bogus:1'"),
    (["--cache", "fbc:abc"], "must be a number"),
    (["--cache", "fbc:-1"], "must be positive"),
    (["--cache", "cache-dit:/no/such/settings.yaml"], "no file"),
    (["--model", "pixart", "--cache", "fbc"], "cannot run on pixart"),
    (["--compile-cache", "{dir}"], "nothing compiles without --compile"),
    (["--compile", "--compile-cache", "{file}"], "is a file; give a folder"),
    (["--attention-backend", "bogus"], "is not a diffusers backend"),
    (["--attention-backend", "flash"], "--attention-backend flash:"),
]
COMMANDS = {
    "bcg-generate": (cli_args.build_parser, cli_plan.make_plan),
    "bcg-serve": (command_line.build_parser, server_plan.read_plan),
}


@pytest.fixture
def no_flash_attn(monkeypatch):
    from diffusers.models import attention_dispatch

    monkeypatch.setattr(attention_dispatch, "_CAN_USE_FLASH_ATTN", False)  # as where flash-attn is not installed


def _argv(words: list[str], tmp_path) -> list[str]:
    (tmp_path / "file").write_text("x")
    fill = {"{dir}": str(tmp_path / "cc"), "{file}": str(tmp_path / "file"), "cache-dit:{yaml}": f"cache-dit:{YAML}"}
    return ["--device", "cpu", *(fill.get(w, w) for w in words)]


def _outcome(command: str, argv: list[str], capsys):
    """``(0, the plan's stack)``, or ``(exit code, the error message without the program's name)``."""
    build_parser, read = COMMANDS[command]
    parser = build_parser()
    try:
        return 0, read(parser.parse_args(argv), parser).stack
    except SystemExit as exc:
        last = capsys.readouterr().err.strip().splitlines()[-1]
        return exc.code, last.split(": error: ", 1)[1]


@pytest.mark.parametrize("words, expected", ACCEPTED)
def test_both_commands_accept_a_stack_alike(words, expected, tmp_path, capsys):
    argv = _argv(words, tmp_path)
    outcomes = {command: _outcome(command, argv, capsys) for command in COMMANDS}
    (code, stack), (code_serve, stack_serve) = outcomes.values()
    assert code == code_serve == 0 and stack == stack_serve, outcomes
    if expected is not None:
        assert stack == expected
    assert stack.describe() == " + ".join(stack.layers) or "none"


@pytest.mark.parametrize("words, needle", REFUSED)
def test_both_commands_refuse_a_stack_alike_with_the_same_message(words, needle, tmp_path, capsys, no_flash_attn):
    argv = _argv(words, tmp_path)
    outcomes = {command: _outcome(command, argv, capsys) for command in COMMANDS}
    (code, message), (code_serve, message_serve) = outcomes.values()
    assert code == code_serve == 2 and message == message_serve, outcomes
    assert needle in message, message
    if "--quant fp8" not in message:  # the replicas' head checks no device (their machines may differ)
        with pytest.raises(ServerOptionsError) as refused:
            check_server_args(parse_server_args(argv))
        assert str(refused.value) == message


@pytest.mark.parametrize("words", [["--quant", "bogus"], ["--cache", "bogus:1"]])
def test_bogus_quant_and_cache_exit_2_from_both_commands_with_one_message(words, capsys):
    assert generate.main(words) == 2
    generate_error = capsys.readouterr().err.strip().splitlines()[-1]
    assert serve_command.main(words) == 2
    serve_error = capsys.readouterr().err.strip().splitlines()[-1]
    assert generate_error.split(": error: ", 1)[1] == serve_error.split(": error: ", 1)[1], (generate_error, serve_error)


# -------------------------------------------------------------------------------------------------------
# the warm-up plan of a stacked server
# -------------------------------------------------------------------------------------------------------
def test_the_warmup_plan_follows_the_stack():
    from bcg_diffusion.toolkit.cache_spec import CacheSpec

    sizes, default = (Size(512, 512), Size(512, 768)), Size(1024, 1024)
    plain = plan_warmup(sizes, default, 28, StackOptions())
    assert (plain.sizes, plain.steps, plain.notes) == (sizes, WARMUP_STEPS, ())
    assert plan_warmup((), default, 28, StackOptions(quant="fp8")).sizes == ()  # nothing that compiles or caches
    compiled = plan_warmup((), default, 28, StackOptions(compile=True))  # no --warmup: the default size is warmed
    assert (compiled.sizes, compiled.steps) == ((default,), WARMUP_STEPS) and "default size 1024x1024" in compiled.notes[0]
    cached = plan_warmup(sizes, default, 28, StackOptions(cache=CacheSpec.parse("dbcache"), compile=True))
    assert (cached.sizes, cached.steps) == (sizes, 28)  # the default step count: the cached steps' paths too
    assert any("28 steps per size" in note for note in cached.notes)


# -------------------------------------------------------------------------------------------------------
# a stacked server: batching off with a step cache, the stack named, its state reset before every call
# -------------------------------------------------------------------------------------------------------
STACKED = "--model flux --device cpu --steps 4 --cache fbc:0.5 --max-batch 4 --bcg"


@pytest.fixture(scope="module")
def stacked():
    """``(state, start-up output, dynamo's graph count before the build)`` of an in-process stacked server (tiny Flux,
    FirstBlockCache, --max-batch 4). The count is process-wide: other tests in this process may have compiled."""
    output = io.StringIO()
    compiled_before = compiled_graphs()
    with contextlib.redirect_stdout(output):
        state = build_server_state(parse_server_args(STACKED))
    try:
        yield state, output.getvalue(), compiled_before
    finally:
        stop_server_state(state)


def test_a_stacked_server_names_its_stack_and_warms_the_cached_steps(stacked):
    state, started, compiled_before = stacked
    assert "stack: cache fbc:0.5, with BCG" in started, started
    assert "warming up 64x64 (WxH; bcg_diffusion.warmup, 4 steps)" in started, started  # no --warmup: the default
    with TestClient(create_app(state)) as client:
        info = client.get("/stats").json()
    stack = info["server"]["stack"]
    assert (stack["cache"], stack["layers"], stack["text"], stack["bcg"]) == ("fbc:0.5", ["cache fbc:0.5"], "cache fbc:0.5",
                                                                             True)
    assert info["server"]["warmup"]["sizes"] == ["64x64"] and info["server"]["warmup"]["steps"] == 4
    # nothing compiles here: the process-wide count is where it was before the build
    assert info["compiled_graphs"] == info["server"]["warmup"]["compiled_graphs"] == compiled_before


def test_a_step_cache_keeps_requests_unbatched_and_says_so(stacked):
    state, started, _ = stacked
    assert f"batching: off: {CACHED_UNBATCHED}" in started, started
    assert state.batcher is None and state.info["max_batch"] == 4 and state.info["batching_off"] == CACHED_UNBATCHED
    bodies = [{"prompt": p, "size": "64x64", "seed": s} for p, s in (("a fox", 1), ("a lighthouse", 2), ("a cat", 3))]
    with TestClient(create_app(state)) as client:
        post = lambda body: client.post("/v1/images/generations", json=body)  # noqa: E731
        with ThreadPoolExecutor(len(bodies)) as pool:  # sent together: one call each all the same
            together = list(pool.map(post, bodies))
        assert [r.headers["x-batch-requests"] for r in together] == ["1"] * len(bodies)
        alone = [pixels(post(body)) for body in bodies]
        assert [pixels(r) for r in together] == alone
        assert client.get("/stats").json()["batching"]["enabled"] is False


def test_a_failed_call_leaves_no_cache_state_behind(capsys):
    """PixArt's MagCache hooks (diffusers' apply_mag_cache: no CacheMixin) keep their state after a call that
    failed half-way; the server resets it before every call, so the next image is the one it would have been."""
    state = build_server_state(parse_server_args(
        "--model pixart --device cpu --steps 4 --no-resolution-binning --cache magcache"))
    try:
        with installed(["error:__fail__"]), TestClient(create_app(state)) as client:
            post = lambda prompt: client.post("/v1/images/generations", json={"prompt": prompt, "seed": 5})  # noqa: E731
            before = pixels(post("a red fox"))
            assert post("__fail__").status_code == 500
            assert pixels(post("a red fox")) == before
    finally:
        stop_server_state(state)


# -------------------------------------------------------------------------------------------------------
# the stack benchmark's code path
# -------------------------------------------------------------------------------------------------------
def test_layer_modes_pair_each_stack_with_its_twin():
    names = [m.name("fp8") for m in layer_modes(("graphs", "compile", "quant", "cache"))]
    assert names == ["eager", "graphs", "compile", "graphs+compile", "compile+fp8", "graphs+compile+fp8",
                     "compile+fp8+cache", "graphs+compile+fp8+cache"]
    assert [m.twin.name("fp8") for m in layer_modes(("graphs", "cache")) if m.twin] == ["eager", "cache"]
    assert [m.name("fp8") for m in layer_modes(("cache",))] == ["eager", "cache"]


def test_bench_stack_runs_on_the_cpu_and_checks_each_graphs_mode_against_its_twin(tmp_path, capsys):
    code = stack_bench.main(["--device", "cpu", "--cases", "flux:tiny:64x64:5", "--layers", "graphs,cache",
                             "--cache-warmup", "2", "--reps", "1", "--out-dir", str(tmp_path)])
    assert code == 0, capsys.readouterr().out
    (result,) = tmp_path.glob("bench_stack_*.json")
    assert {p.suffix for p in tmp_path.iterdir()} == {".json", ".md", ".png"}
    modes = json.loads(result.read_text())["cases"][0]["modes"]
    assert list(modes) == ["eager", "graphs", "cache", "graphs+cache"]
    assert modes["graphs"]["bitwise_vs_twin"] is True and modes["graphs+cache"]["bitwise_vs_twin"] is True
    assert modes["graphs"]["deviation"]["identical"] and modes["graphs"]["deviation"]["psnr_db"] is None
    assert modes["cache"]["cached_calls"] == {"calls": 5, "cached": 1}  # warm-up 2, then never two in a row
    assert not modes["cache"]["deviation"]["identical"] and modes["cache"]["deviation"]["psnr_db"] > 0
    assert modes["graphs+cache"]["graph_counts"]["debug"] is True


@pytest.mark.parametrize("argv, needle", [
    (["--cases", "flux:tiny:64x64"], "want FAMILY:SIZE:WxH[xFRAMES]:STEPS"),
    (["--layers", "graphs,turbo"], "unknown turbo"),
    (["--quant", "fp8", "--layers", "quant"], "--quant fp8:"),
    (["--cached-steps", "0"], "--cached-steps must be >= 1"),
    (["--cache-front-blocks", "0"], "--cache-front-blocks is too small"),
    (["--cache-max-continuous", "0"], "--cache-max-continuous is too small"),
])
def test_bench_stack_bad_options_exit_2(argv, needle, capsys):
    assert stack_bench.main(["--device", "cpu", *argv]) == 2
    assert needle in capsys.readouterr().err


def test_the_cache_setting_states_what_it_caches():
    import torch

    from bcg_diffusion.benchmarks.stack.layers import CacheSetting

    assert CacheSetting.most_cached(28, 4) == 12  # never two in a row: every other step after the warm-up
    assert CacheSetting.most_cached(28, 4, max_continuous=2) == 16  # two of every three
    flux_like = torch.nn.Module()
    flux_like.transformer_blocks = torch.nn.ModuleList(torch.nn.Identity() for _ in range(19))
    flux_like.single_transformer_blocks = torch.nn.ModuleList(torch.nn.Identity() for _ in range(38))
    described = CacheSetting(4, 16, front_blocks=1, max_continuous=2).describe(flux_like)
    assert (described["Fn_compute_blocks"], described["max_cached_steps"], described["max_continuous_cached_steps"]) == (
        1, 16, 2)
    assert CacheSetting(4, 12).describe(flux_like)["Fn_compute_blocks"] == 8  # the default: DBCache's F8B0


@pytest.mark.parametrize("name, setting", [("stack_cache_dit.yaml", (4, 12, 8, 1)),
                                           ("stack_cache_dit_16of28.yaml", (4, 16, 1, 2))])
def test_the_served_cache_files_are_the_stack_benchmarks_settings(name, setting):
    """What `--cache cache-dit:scripts/FILE` serves is what the stack benchmark measured (--cache-warmup 4, and
    --cache-front-blocks / --cache-max-continuous), on Flux.1's block lists."""
    import cache_dit
    import torch

    from bcg_diffusion.benchmarks.stack.layers import CacheSetting

    warmup, cached, front, continuous = setting
    assert CacheSetting.most_cached(28, warmup, continuous) == cached  # the most a 28-step call can cache
    flux_like = torch.nn.Module()
    flux_like.transformer_blocks = torch.nn.ModuleList(torch.nn.Identity() for _ in range(19))
    flux_like.single_transformer_blocks = torch.nn.ModuleList(torch.nn.Identity() for _ in range(38))
    expected = CacheSetting(warmup, cached, front_blocks=front, max_continuous=continuous).describe(flux_like)
    served = cache_dit.load_configs(str(YAML.parent / name))["cache_config"]
    assert {k: getattr(served, k) for k in expected if hasattr(served, k)} == {
        k: v for k, v in expected.items() if hasattr(served, k)}
    assert type(served).__name__ == expected["config"]
