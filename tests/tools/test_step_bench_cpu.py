"""The step batching benchmark's plan, without servers: which servers the chosen scenarios need and their options,
what the time budget skips or shortens, the capacity the open-loop run offers 90 % of, the report's columns."""

from __future__ import annotations


from bcg_diffusion.serving.load import step_bench
from bcg_diffusion.serving.load.step_bench import Budget, build_parser, roles_for, run_scenarios, server_args


def parse(*extra: str):
    return build_parser().parse_args(["--out-dir", "/tmp/unused", *extra])


def test_each_rows_has_its_step_server_and_only_the_chosen_scenarios_start_one():
    args = parse("--eager-check")
    assert roles_for(["mixed-c8", "s256-c8", "poisson"], args) == ["off", "step", "eager-step"]
    assert roles_for(["mixed-c8", "mixed-c8-r4"], args) == ["off", "step", "step-r4", "eager-step"]
    assert "--max-batch 4 --batching step" in server_args("step-r4", args)
    assert "--max-batch 8 --batching step" in server_args("step", args)
    assert "--batching" not in server_args("off", args) and "--bcg" not in server_args("eager-step", args)
    assert roles_for(["mixed-c8-r4"], parse("--max-batch", "4")) == ["off", "step"]  # 4 rows is --max-batch


def test_with_request_adds_the_request_batching_server_and_its_run_to_the_cost():
    args = parse("--eager-check", "--with-request", "--time-limit", "10")
    assert roles_for(["mixed-c8", "mixed-c8-r4"], args) == ["off", "step", "step-r4", "request", "eager-step"]
    options = server_args("request", args)
    assert "--max-batch 8 --batching request --batch-work-limit 0" in options and "--bcg" in options
    assert "--step-policy" not in options
    plain = parse("--time-limit", "10")
    assert "request" not in roles_for(["mixed-c8"], plain)
    # each closed-loop run is bounded by --time-limit + DRAIN_S: off, step, request (+ eager and alone for the first)
    assert step_bench.scenario_cost("s256-c8", args, first=False) == 3 * (10 + step_bench.DRAIN_S)
    assert step_bench.scenario_cost("s256-c8", plain, first=True) == 4 * (10 + step_bench.DRAIN_S)


def test_the_request_verdict_states_both_ratios_without_judging():
    def summary(rps, p99, per_call=None):
        return {"throughput_rps": rps, "latency_s": {"p99": p99},
                "batching": {"mean_requests_per_batch": per_call} if per_call else None}

    ratio, verdict = step_bench.request_verdict("s512-c8", {"off": summary(4.0, 2.0), "step": summary(6.0, 1.0),
                                                            "request": summary(5.0, 1.6, 7.5)})
    assert ratio["throughput_ratio"] == 1.25 and ratio["passed"] is None and verdict["passed"] is None
    assert verdict["detail"] == ("request/off throughput 1.25x, p99 0.80x; step/request throughput 1.20x, p99 0.62x; "
                                 "requests per call 7.50")


def test_the_steady_throughput_leaves_out_the_fill_and_the_drain():
    from bcg_diffusion.serving.load.report import steady_throughput
    from bcg_diffusion.serving.load.run import Outcome

    def answers(times):
        return [Outcome(i, "x", "64x64", 200, 0.1, done_at=t) for i, t in enumerate(times)]

    # 2 clients, 10 answers: the first two (a slow fill) and the last two (a slow drain) left out; 5 answers, one
    # every 0.5 s, between the answer at 3.0 and the one at 5.5
    times = [2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 9.0, 12.0]
    assert steady_throughput(answers(times), 2) == 5 / 2.5
    assert steady_throughput(answers(times[:5]), 2) is None  # not more than 2 * clients + 1 answers
    assert steady_throughput(answers(times), None) is None  # an open loop
    assert steady_throughput(answers(times) + [Outcome(99, "x", "64x64", 0, 0.1)], 2) == 5 / 2.5  # no time: left out


def test_the_steady_verdict_states_each_ratio_without_judging():
    summaries = {"off": {"throughput_steady_rps": 8.0}, "step": {"throughput_steady_rps": 18.0},
                 "request": {"throughput_steady_rps": None}}
    verdict = step_bench.steady_verdict("s256-c16", summaries, 16)
    assert verdict["passed"] is None and verdict["name"] == "s256-c16: steady state (first and last 16 answers left out)"
    assert verdict["detail"] == "throughput step/off 2.25x, request/off -; off 8.00 req/s"


def test_the_stack_goes_to_every_server_alike():
    args = parse("--eager-check", "--stack=--compile")  # one option: written with "=", as argparse needs
    assert all(" --compile" in server_args(role, args) for role in ("off", "step", "step-r4", "eager-step"))
    assert "--compile" not in server_args("off", parse())


def _fake_summary(rps: float) -> dict:
    return {"throughput_rps": rps}


def test_the_budget_skips_what_no_longer_fits_and_shortens_the_open_loop_run(monkeypatch):
    ran, offered, now = [], [], [0.0]
    budget = Budget(100.0, clock=lambda: now[0])

    def run_scenario(name, urls, args, first):
        ran.append((name, first))
        now[0] += 40.0 if first else 35.0  # what the runs took
        return {"scenario": name, "server": step_bench.step_role(step_bench.SCENARIOS[name].rows, args),
                "summaries": {"step": _fake_summary(10.0 if name == "mixed-c8" else 30.0)}, "checks": []}

    def run_poisson(url, args, capacity, alone_s, duration_s):
        offered.append((capacity, duration_s))
        return {"scenario": "poisson", "checks": []}

    monkeypatch.setattr(step_bench, "run_scenario", run_scenario)
    monkeypatch.setattr(step_bench, "run_poisson", run_poisson)
    args = parse("--time-limit", "10", "--poisson-s", "60")
    urls = {"off": "o", "step": "s", "step-r4": "r"}
    results = run_scenarios(["mixed-c8", "mixed-c8-r4", "s512-c8", "poisson"], urls, args, budget)
    # the first may cost 4 runs x 14 s = 56 s (took 40), the second 28 s (took 35): both fit; the third (28 s) no
    # longer fits the 25 s left
    assert ran == [("mixed-c8", True), ("mixed-c8-r4", False)]
    assert results[2]["skipped"] and "skipped" in results[2]["checks"][0]["detail"]
    # the open loop offers 90 % of the best mixed rate of the rows-8 server (not the rows-4 one's 30 req/s), for
    # what the budget has left (not its 60 s)
    assert offered == [(10.0, 25.0 - 2 * step_bench.DRAIN_S)]


def test_the_report_names_rows_occupancy_wait_and_step_time_and_its_parts():
    timing = {"mean": 0.015}
    step = {"ok": 8, "requests": 8, "throughput_rps": 15.8, "throughput_steady_rps": 16.25, "latency_s": {"p50": 0.47, "p99": 0.5},
            "batching": {"max_batch": 4, "occupancy": 0.9, "mean_rows_per_step": 3.6, "step_s": timing,
                         "wait_s": {"mean": 0.04}, "prepare_s": {"mean": 0.02}, "finish_s": {"mean": 0.01},
                         "step_launch_s": {"mean": 0.004}, "predict_device_s": {"mean": 0.012},
                         "advance_device_s": {"mean": 0.002}}}
    results = [{"scenario": "mixed-c8-r4", "rows": 4, "summaries": {"step": step}, "checks": [],
                "ratio": {"throughput_ratio": 2.0, "p99_ratio": 0.5},
                "request_ratio": {"throughput_ratio": 1.1, "p99_ratio": 0.9}},
               {"scenario": "poisson", "rate": 9.0, "duration_s": 60, "p99_over_alone": 1.5, "checks": []}]
    text = step_bench.markdown(results, parse(), {"total_s": 360, "used_s": 300})
    assert "| mixed-c8-r4 | step | 4 | 8/8 | 15.80 | 16.25 | 0.470 | 0.500 | 0.90 | 3.60 | 15.0 | 4.0 | 12.0 | 2.0 | 40.0 | 20.0 | 10.0 |" in text
    assert "(step server rows 4): throughput step/off 2.00x, p99 step/off 0.50x; request/off 1.10x, p99 0.90x" in text
    assert "p99 / a request alone 1.50x" in text and "request-batching server" not in text
    assert "and the request-batching server" in step_bench.markdown(results, parse("--with-request"), {})
    assert "Time budget 360 s, used 300 s" in text


def test_an_unknown_scenario_is_refused(capsys):
    assert step_bench.main(["--out-dir", "/tmp/unused", "--scenarios", "mixed-c99"]) == 2
    assert "argument --scenarios: unknown 'mixed-c99'; give one or more of mixed-c8," in capsys.readouterr().err


def test_the_load_report_says_where_a_steps_time_went_where_the_server_measured_it():
    """``/stats`` step timings during the load (end minus start), and the report's line: the device's split only
    where there is one (CUDA), as on the GPU machine; none on the CPU."""
    from bcg_diffusion.serving.load.report import _step_line, step_batching_during

    def timing(count, total):
        return {"count": count, "sum": total, "mean": None, "max": 0.03, "p50": None, "p99": None}

    def stats(steps, device_steps):
        return {"rows": 8, "policy": "round_robin", "steps": steps, "occupied_rows": 6 * steps,
                "active_rows_per_step": {"6": steps}, "requests": {"finished": steps // 20},
                "step_s": timing(steps, 0.020 * steps), "queue_wait_s": timing(1, 0.1),
                "step_launch_s": timing(steps, 0.005 * steps),
                "predict_device_s": timing(device_steps, 0.016 * device_steps),
                "advance_device_s": timing(device_steps, 0.002 * device_steps)}

    during = step_batching_during(stats(100, 99), stats(300, 299))
    assert during["steps"] == 200 and during["predict_device_s"]["count"] == 200
    line = _step_line("step", during)
    assert "step mean 20.0 ms (host 5.0 ms to queue; device 16.0 ms model + 2.0 ms rows' scheduler steps)" in line
    assert "device" not in _step_line("step", step_batching_during(stats(100, 0), stats(300, 0)))
