"""The compile-order check (bcg_diffusion.checks.compile_order) on the CPU, plumbing only (no compile, and without
CUDA acceleration is a no-op): each order's child gets the options it needs and saves its calls, every output is
compared with every other, a failed child is reported, unknown orders are refused."""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import pytest

from bcg_diffusion.checks import compile_order

ARGS = ["--family", "flux", "--size", "tiny", "--height", "64", "--width", "64", "--steps", "1", "--no-compile",
        "--device", "cpu"]


def test_each_order_runs_in_its_child_and_every_output_is_compared(tmp_path, monkeypatch):
    children = []
    real_run = subprocess.run

    def in_process(command, **kwargs):  # the child's command line, run here
        if "bcg_diffusion.checks.compile_order" not in command:
            return real_run(command, **kwargs)  # git, for the commit
        argv = command[command.index("bcg_diffusion.checks.compile_order") + 1:]
        children.append(argv)
        if "bcg_first" in argv:
            return SimpleNamespace(returncode=1, stdout="", stderr="the child failed")
        return SimpleNamespace(returncode=compile_order.main(argv), stdout="", stderr="")

    monkeypatch.setattr(subprocess, "run", in_process)
    code = compile_order.main([*ARGS, "--orders", "eager_first,warm_first,bcg_first", "--out", str(tmp_path)])
    assert code == 1  # a child failed
    assert [a[a.index("--child") + 1] for a in children] == ["eager_first", "warm_first", "bcg_first"]
    assert all("--no-compile" in a and "--inference-mode" in a and a[a.index("--out") + 1] == str(tmp_path)
               for a in children)  # the servers' grad mode by default
    report = json.loads((tmp_path / "compile_order.json").read_text())
    assert report["failures"] == {"bcg_first": "the child failed"} and report["inference_mode"] is True
    assert sorted(report["orders"]) == ["eager_first", "warm_first"]
    pairs = {(c["a"], c["b"]) for c in report["comparisons"]}
    assert len(pairs) == 15 and ("eager_first.E", "warm_first.B") in pairs  # 6 outputs, every pair
    assert all(c["equal"] for c in report["comparisons"])  # no acceleration on the CPU: the same calls
    assert "warmup" in report["orders"]["warm_first"] and "| eager_first.E | eager_first.B | yes |" in (
        tmp_path / "compile_order.md").read_text()


def test_an_order_given_twice_runs_twice_as_a_control(tmp_path, monkeypatch):
    children, real_run = [], subprocess.run

    def in_process(command, **kwargs):
        if "bcg_diffusion.checks.compile_order" not in command:
            return real_run(command, **kwargs)  # git, for the commit
        argv = command[command.index("bcg_diffusion.checks.compile_order") + 1:]
        children.append((argv[argv.index("--child") + 1], argv[argv.index("--label") + 1], kwargs.get("env")))
        return SimpleNamespace(returncode=compile_order.main(argv), stdout="child says hi\n", stderr="")

    monkeypatch.setattr(subprocess, "run", in_process)
    assert compile_order.main([*ARGS, "--orders", "eager_first,eager_first", "--fresh-caches",
                               "--out", str(tmp_path)]) == 0
    assert [(o, label) for o, label, _ in children] == [("eager_first", "eager_first"),
                                                        ("eager_first", "eager_first#2")]
    caches = {env["TORCHINDUCTOR_CACHE_DIR"] for _, _, env in children}
    assert len(caches) == 2  # each run compiles by itself with --fresh-caches
    report = json.loads((tmp_path / "compile_order.json").read_text())
    assert sorted(report["orders"]) == ["eager_first", "eager_first#2"]
    assert ("eager_first.E", "eager_first#2.E") in {(c["a"], c["b"]) for c in report["comparisons"]}
    assert "compile_caches" in report["orders"]["eager_first#2"]  # nothing compiled here (--no-compile)
    assert (tmp_path / "child_eager_first#2.log").read_text() == "child says hi\n"


def test_unknown_orders_are_refused(capsys):
    with pytest.raises(SystemExit) as exited:
        compile_order.parse_args(["--orders", "eager_first,sideways"])
    assert exited.value.code == 2 and "--orders: unknown sideways" in capsys.readouterr().err


def test_images_are_compared_beside_latents_and_only_with_images(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(subprocess, "run", lambda command, **kw: SimpleNamespace(
        returncode=compile_order.main(command[command.index("bcg_diffusion.checks.compile_order") + 1:]), stdout="",
        stderr="")
        if "bcg_diffusion.checks.compile_order" in command else SimpleNamespace(returncode=1, stdout="", stderr=""))
    monkeypatch.setenv("TORCHINDUCTOR_DETERMINISTIC", "1")
    assert compile_order.main([*ARGS, "--images", "--orders", "eager_first", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "compile_order.json").read_text())
    pairs = {(c["a"], c["b"]) for c in report["comparisons"]}
    assert ("eager_first.E", "eager_first.B") in pairs and ("eager_first.E.image", "eager_first.B.image") in pairs
    assert ("eager_first.E.steps", "eager_first.B.steps") in pairs  # every step's latents, with their kind only
    assert all(compile_order.output_kind(a) == compile_order.output_kind(b) for a, b in pairs) and len(pairs) == 9
    saved = torch.load(tmp_path / "order_eager_first.pt")["outputs"]
    assert saved["E.steps"].shape[0] == 1 and torch.equal(saved["E.steps"][-1], saved["E"])
    assert report["images"] is True and report["env"] == {"TORCHINDUCTOR_DETERMINISTIC": "1"}


def test_a_difference_is_reported_with_its_size():
    import torch

    saved = {"o": {"outputs": {"E": torch.zeros(2), "B": torch.tensor([0.0, 0.5])}}}
    assert compile_order.compare(saved) == [{"a": "o.E", "b": "o.B", "equal": False, "max_abs": 0.5}]


def test_every_steps_latents_name_the_first_step_that_differs(tmp_path):
    import torch

    ones = torch.ones(4, 3)
    later = ones.clone()
    later[2:, 1] = 2.0  # the calls part at step 2
    saved = {"o": {"outputs": {"E.steps": ones, "B.steps": later, "E": ones[-1]}}}
    assert compile_order.compare(saved) == [{"a": "o.E.steps", "b": "o.B.steps", "equal": False, "max_abs": 1.0,
                                             "first_step": 2}]
    report = {"family": "flux", "size": "tiny", "height": 64, "width": 64, "steps": 4, "compile": True, "date": "d",
              "commit": "c", "orders": {}, "comparisons": compile_order.compare(saved)}
    assert "| o.E.steps | o.B.steps | NO (max abs 1, first at step 2) |" in compile_order.markdown(report)


def test_fresh_caches_give_each_child_empty_caches_of_its_own(tmp_path):
    args = compile_order.parse_args(["--fresh-caches", "--out", str(tmp_path)])
    env = compile_order.child_environment("warm_first", args)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "caches_warm_first" / "inductor")
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "caches_warm_first" / "triton") and "PATH" in env
    assert compile_order.child_environment("warm_first", compile_order.parse_args([])) is None  # shared by default


def test_in_thread_runs_the_calls_on_one_worker_thread_and_gives_the_same_outputs(tmp_path, monkeypatch):
    import threading

    threads = set()
    real_call = compile_order._call

    def recording_call(*args, **kwargs):
        threads.add(threading.current_thread().name)
        return real_call(*args, **kwargs)

    monkeypatch.setattr(compile_order, "_call", recording_call)
    results = {}
    for flag in ("--in-thread", "--no-in-thread"):
        out = tmp_path / flag
        args = compile_order.parse_args([*ARGS, flag, "--child", "eager_warm_first", "--out", str(out)])
        results[flag] = compile_order.run_order(args)
    assert results["--in-thread"]["info"]["in_thread"] is True
    assert len([t for t in threads if t.startswith("worker")]) == 1 and threading.main_thread().name in threads
    import torch

    for tag in ("E", "B", "B2"):
        assert torch.equal(results["--in-thread"]["outputs"][tag], results["--no-in-thread"]["outputs"][tag])


def test_the_cache_counters_say_hits_and_misses(monkeypatch):
    from collections import Counter, defaultdict

    from torch._dynamo import utils

    fake = defaultdict(Counter)
    fake["inductor"].update({"fxgraph_cache_hit": 3, "fxgraph_cache_miss": 1, "pattern_matcher_count": 9})
    fake["aot_autograd"].update({"autograd_cache_hit": 3, "total": 4})
    monkeypatch.setattr(utils, "counters", fake)
    assert compile_order.cache_counters() == {"inductor.fxgraph_cache_hit": 3, "inductor.fxgraph_cache_miss": 1,
                                              "aot_autograd.autograd_cache_hit": 3}


def test_the_eager_server_order_never_accelerates(tmp_path, monkeypatch):
    real_run = subprocess.run

    def in_process(command, **kwargs):
        if "bcg_diffusion.checks.compile_order" not in command:
            return real_run(command, **kwargs)
        argv = command[command.index("bcg_diffusion.checks.compile_order") + 1:]
        return SimpleNamespace(returncode=compile_order.main(argv), stdout="", stderr="")

    monkeypatch.setattr(subprocess, "run", in_process)
    assert compile_order.main([*ARGS, "--orders", "eager_only,eager_warm_first", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "compile_order.json").read_text())
    only = report["orders"]["eager_only"]
    assert "warmup" in only and {"E", "E2"} <= set(only) and "bcg" not in only and "B" not in only
    assert ("eager_only.E", "eager_warm_first.B") in {(c["a"], c["b"]) for c in report["comparisons"]}
