"""Fast tests of the Ray Serve parts that start no Ray: replica options, ``bcg-serve``'s replica flags,
``build_app``'s checks and the deployment it describes, the replica's in-process state build and its failures.
The replicas themselves run in ``test_ray_serve_cpu.py``."""

from __future__ import annotations

import argparse

import pytest

from bcg_diffusion.serving import command_line, serve_command, server_build
from bcg_diffusion.serving.assembly import warm
from bcg_diffusion.serving.replicas import ray_run
from bcg_diffusion.serving.replicas.options import (
    ReplicaOptions,
    ReplicaOptionsError,
    replica_options_from_args,
    replica_options_from_mapping,
)
from bcg_diffusion.serving.replicas.state import (
    ServerOptionsError,
    build_server_state,
    parse_server_args,
    stop_server_state,
)

TINY = "--model flux --device cpu --steps 2 --warmup 64x64"


def _flags(text: str):
    parser = argparse.ArgumentParser()
    command_line.add_replica_options(parser)
    return replica_options_from_args(parser.parse_args(text.split()))


def test_replica_options_fixed_and_autoscaled():
    assert _flags("") is None  # no --replicas: the single server, no Ray
    fixed = _flags("--replicas 3").deployment_options(on_cuda=True, max_queue=64)
    assert fixed == {"ray_actor_options": {"num_cpus": 1.0, "num_gpus": 1}, "max_ongoing_requests": 64,
                     "num_replicas": 3}
    scaled = _flags("--replicas 1 --max-replicas 4 --target-ongoing-requests 3").deployment_options(False, 8)
    assert scaled["ray_actor_options"]["num_gpus"] == 0 and "num_replicas" not in scaled
    assert scaled["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "initial_replicas": 1,
                                            "target_ongoing_requests": 3.0}
    assert _flags("--replicas 2 --gpus-per-replica 0.5").deployment_options(True, 8)["ray_actor_options"][
        "num_gpus"] == 0.5


@pytest.mark.parametrize("text, needle", [
    ("--max-replicas 3", "--max-replicas needs --replicas N"),
    ("--replicas 0", "--replicas must be a whole number >= 1"),
    ("--replicas 3 --max-replicas 2", "--max-replicas 2 is below --replicas 3"),
    ("--replicas 2 --target-ongoing-requests 0", "--target-ongoing-requests must be a number > 0"),
    ("--replicas 2 --gpus-per-replica -1", "--gpus-per-replica must be a number >= 0"),
])
def test_bad_replica_flags_say_what_to_change(text, needle):
    with pytest.raises(ReplicaOptionsError, match=needle):
        _flags(text)


def test_replica_options_from_a_config_read_strings_and_refuse_unknown_keys():
    assert replica_options_from_mapping({"replicas": "2", "max_replicas": 5, "target_ongoing_requests": "1.5"}) == \
        ReplicaOptions(replicas=2, max_replicas=5, target_ongoing_requests=1.5)
    with pytest.raises(ReplicaOptionsError, match="unknown replica option.*gpus; known"):
        replica_options_from_mapping({"gpus": 1})
    with pytest.raises(ReplicaOptionsError, match="replicas: 'two' is not a whole number"):
        replica_options_from_mapping({"replicas": "two"})


@pytest.mark.parametrize("argv, needle", [
    (["--max-replicas", "2"], "--max-replicas needs --replicas N"),
    (["--replicas", "0"], "--replicas must be a whole number >= 1"),
    (["--replicas", "2", "--device", "cuda:1"], "Ray gives each replica its own GPU"),
    (["--replicas", "2", "--steps", "0"], "--steps must be >= 1"),
])
def test_serve_refuses_bad_replica_options_before_starting_ray(argv, needle, capsys, monkeypatch):
    monkeypatch.setattr("ray.init", lambda *a, **k: pytest.fail("Ray was started"), raising=False)
    assert serve_command.main(argv) == 2
    assert needle in capsys.readouterr().err


def test_serve_without_ray_says_what_to_install(capsys, monkeypatch):
    monkeypatch.setattr(ray_run.importlib.util, "find_spec", lambda name: None)
    assert serve_command.main(["--replicas", "2"]) == 2
    assert 'pip install -e ".[serve,ray]"' in capsys.readouterr().err


def test_build_app_describes_the_deployment_and_refuses_bad_args():
    from bcg_diffusion.serving.replicas.ray_app import build_app

    app = build_app({"server_args": f"{TINY} --api-key k3y", "replicas": "2", "max_replicas": 3})
    deployment = app._bound_deployment
    assert deployment.ray_actor_options == {"num_cpus": 1.0, "num_gpus": 0}  # --device cpu: no GPU asked
    config = deployment._deployment_config
    assert (config.autoscaling_config.min_replicas, config.autoscaling_config.max_replicas) == (2, 3)
    assert config.max_ongoing_requests == command_line.DEFAULT_MAX_QUEUE
    options = deployment.init_args[0]
    assert options["model"] == "flux" and options["api_key"] == "k3y" and options["warmup"] == "64x64"
    for bad, needle in [({"server_args": "--model flux --port 9000"}, "--port does not belong in server_args"),
                        ({"server_args": "--model flux --replicas 2"}, "--replicas does not belong"),
                        ({"server_args": "--model flux --steps 0"}, "--steps must be >= 1"),
                        ({"server_args": "--model nope/none --bogus"}, "unrecognized arguments: --bogus"),
                        ({"server_args": TINY, "replicas": 0}, "replicas must be a whole number >= 1")]:
        with pytest.raises(ValueError, match=needle):
            build_app(bad)


def test_build_app_takes_the_api_key_from_the_environment(monkeypatch):
    from bcg_diffusion.serving.replicas.ray_app import build_app

    monkeypatch.setenv(command_line.API_KEY_VARIABLE, "from-env")
    assert build_app({"server_args": TINY})._bound_deployment.init_args[0]["api_key"] == "from-env"


def test_a_replica_builds_and_warms_its_state_or_fails_before_serving(monkeypatch):
    """The replica's constructor: the state of the single server (warmed); a failed warm-up raises (so Ray never
    routes to that replica) and stops the worker thread it started."""
    state = build_server_state(parse_server_args(f"{TINY} --max-batch 2"))
    try:
        assert state.info["warmup"]["sizes"] == ["64x64"] and state.alive and state.batcher is not None
        assert state.planner.default_steps == 2 and state.api_key is None and state.info["max_batch"] == 2
    finally:
        stop_server_state(state)
    assert not state.worker.alive and not state.batcher.alive
    workers = []
    real_worker = server_build.PipelineWorker

    def tracked_worker():
        workers.append(real_worker())
        return workers[-1]

    monkeypatch.setattr(server_build, "PipelineWorker", tracked_worker)
    monkeypatch.setattr(warm, "run_warmup", lambda *a: (_ for _ in ()).throw(RuntimeError("no memory left")))
    with pytest.raises(ServerOptionsError, match="warm-up failed: RuntimeError: no memory left"):
        build_server_state(parse_server_args(TINY))
    assert workers and not workers[0].alive


def test_a_part_that_fails_stops_the_threads_of_the_parts_before_it(monkeypatch):
    """The parts are built in order: the worker and the batcher start before the planner; a planner that fails
    (here: planted) stops both, and the build fails as the options say."""
    from bcg_diffusion.toolkit.options import Failure

    made = []
    real_worker, real_batching = server_build.PipelineWorker, server_build.set_up_batching
    monkeypatch.setattr(server_build, "PipelineWorker", lambda: made.append(real_worker()) or made[-1])
    monkeypatch.setattr(server_build, "set_up_batching", lambda *a: made.append(real_batching(*a)) or made[-1])
    monkeypatch.setattr(server_build, "make_planner", lambda *a: (_ for _ in ()).throw(Failure(2, "planted")))
    with pytest.raises(ServerOptionsError, match="planted"):
        build_server_state(parse_server_args(f"{TINY} --max-batch 2"))
    worker, batching = made
    assert batching.batcher is not None and not batching.batcher.alive and not worker.alive
