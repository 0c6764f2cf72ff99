"""GPU tests: a replay is never silently wrong when users change host state after capture.

Each test compares an accelerated pipeline with an un-accelerated twin built with the same seed
and given the same change, bitwise, and checks on the runner's counters that the change was
recaptured and the calls after it replayed (tests/_replay.py): a comparison alone passes when
every call ran eagerly.
"""

import threading

import pytest
import torch

import bcg_diffusion as bcg

from _pipes import build, run, transformer_calls
from _replay import assert_recaptured, assert_replayed, counters

pytestmark = pytest.mark.gpu
STEPS = 3  # _pipes.run's default


def _halving_processor():
    from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

    class Halving(FluxAttnProcessor):
        def __call__(self, *args, **kwargs):
            out = super().__call__(*args, **kwargs)
            return tuple(o * 0.5 for o in out) if isinstance(out, tuple) else out * 0.5

    return Halving()


def test_set_attn_processor_after_capture_recaptures():
    """A processor of the user's own class, declared pure (``BCGConfig.pure_forwards``), is captured
    with the rest: the swap is a structure change, one recapture, and every later call replays.
    (Undeclared, it runs eagerly in module mode: tests/library/test_python_around_gpu.py.)"""
    family = "flux"
    calls = transformer_calls(family, STEPS)
    twin, accelerated = build(family), build(family)
    # the test's processor is not diffusers' own: declared pure, it is captured (else it runs eagerly)
    bcg.accelerate_pipeline(accelerated, bcg.BCGConfig(pure_forwards=(f"{__name__}.",)))
    assert torch.equal(run(accelerated, family), run(twin, family))
    assert_replayed(accelerated, calls)
    for pipe in (twin, accelerated):
        pipe.transformer.set_attn_processor(_halving_processor())
    before = counters(accelerated)
    changed = run(accelerated, family)
    assert torch.equal(changed, run(twin, family))
    assert not any(e.module_mode for e in bcg.get_stats(accelerated).entries), str(bcg.get_stats(accelerated))
    assert_recaptured(accelerated, calls, before, captures=1, structure_changes=1)
    before = counters(accelerated)
    assert torch.equal(run(accelerated, family), run(twin, family))
    assert_replayed(accelerated, calls, before)
    bcg.remove_acceleration(accelerated)


def test_attention_backend_switches_recapture():
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry, attention_backend

    previous = _AttentionBackendRegistry._active_backend
    family = "flux"
    calls = transformer_calls(family, STEPS)
    twin, accelerated = build(family), build(family)

    def recaptured_and_equal():
        before = counters(accelerated)
        assert torch.equal(run(accelerated, family), run(twin, family))
        assert_recaptured(accelerated, calls, before, captures=1)

    try:
        for pipe in (twin, accelerated):
            pipe.transformer.set_attention_backend("_native_math")
        bcg.accelerate_pipeline(accelerated)
        recaptured_and_equal()
        for pipe in (twin, accelerated):
            pipe.transformer.set_attention_backend("_native_efficient")
        recaptured_and_equal()
        for pipe in (twin, accelerated):
            pipe.transformer.reset_attention_backend()  # processors name no backend: the global one decides
        with attention_backend("_native_math"):
            recaptured_and_equal()
        with attention_backend("_native_efficient"):
            recaptured_and_equal()
        with attention_backend("_native_math"):  # a key captured before: replayed
            before = counters(accelerated)
            assert torch.equal(run(accelerated, family), run(twin, family))
            assert_replayed(accelerated, calls, before)
    finally:
        _AttentionBackendRegistry.set_active_backend(previous)
        bcg.remove_acceleration(accelerated)


def test_hooks_added_after_capture_run_on_every_call():
    from diffusers.hooks import HookRegistry, ModelHook

    class Scale(ModelHook):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def post_forward(self, module, output):
            self.calls += 1
            return tuple(o * 1.01 for o in output) if isinstance(output, tuple) else output * 1.01

    family = "flux"
    calls = transformer_calls(family, STEPS)
    twin, accelerated = build(family), build(family)
    bcg.accelerate_pipeline(accelerated)
    run(accelerated, family)
    counts = {}
    for name, pipe in (("twin", twin), ("accelerated", accelerated)):
        block = pipe.transformer.transformer_blocks[0]
        hook = Scale()
        HookRegistry.check_if_exists_or_initialize(block).register_hook(hook, "user_scale")
        seen = []
        pipe.transformer.single_transformer_blocks[0].register_forward_hook(lambda m, a, o, seen=seen: seen.append(1))
        counts[name] = (hook, seen)
    before = counters(accelerated)
    out = run(accelerated, family)
    assert torch.equal(out, run(twin, family))
    assert_recaptured(accelerated, calls, before, captures=1, structure_changes=1)  # hooked blocks: breaks
    assert counts["accelerated"][0].calls == counts["twin"][0].calls == calls
    assert len(counts["accelerated"][1]) == len(counts["twin"][1]) == calls
    before = counters(accelerated)
    assert torch.equal(run(accelerated, family), run(twin, family))
    assert_replayed(accelerated, calls, before)
    assert counts["accelerated"][0].calls == counts["twin"][0].calls == 2 * calls  # the hooks ran at every replay
    assert len(counts["accelerated"][1]) == len(counts["twin"][1]) == 2 * calls
    bcg.remove_acceleration(accelerated)


def test_weights_changed_between_calls_of_a_from_pipe_pipeline_recapture():
    import copy

    from diffusers import FluxPipeline

    family = "flux"
    calls = transformer_calls(family, STEPS)
    twin, accelerated = build(family), build(family)
    bcg.accelerate_pipeline(accelerated)
    other = FluxPipeline.from_pipe(accelerated, scheduler=copy.deepcopy(accelerated.scheduler))
    assert torch.equal(run(other, family), run(twin, family))
    assert_replayed(other, calls)  # the shared transformer's runner served the from_pipe pipeline
    for pipe in (twin, accelerated):
        with torch.no_grad():
            next(pipe.transformer.parameters()).mul_(1.5)
    before = counters(other)
    assert torch.equal(run(other, family), run(twin, family))
    assert_recaptured(other, calls, before, captures=1)  # the new weights are a new key
    bcg.remove_acceleration(other)
    assert not bcg.is_accelerated(accelerated)


def test_math_mode_switch_recaptures():
    family = "flux"
    calls = transformer_calls(family, STEPS)
    twin, accelerated = build(family), build(family)
    bcg.accelerate_pipeline(accelerated)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        for allow in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = allow
            before = counters(accelerated)
            assert torch.equal(run(accelerated, family), run(twin, family)), f"allow_tf32={allow}"
            assert_recaptured(accelerated, calls, before, captures=1)  # the math mode is part of the key
        torch.backends.cuda.matmul.allow_tf32 = False
        before = counters(accelerated)
        assert torch.equal(run(accelerated, family), run(twin, family))
        assert_replayed(accelerated, calls, before)  # back to the first mode: its graph replays
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    bcg.remove_acceleration(accelerated)


def test_two_pipelines_in_two_threads_with_eager_work_beside_them():
    families = ("flux", "pixart")
    pipes = {f: build(f) for f in families}
    eager = {f: run(p, f) for f, p in pipes.items()}
    for pipe in pipes.values():
        bcg.accelerate_pipeline(pipe)
    results, errors = {f: [] for f in families}, []
    stop = threading.Event()

    def worker(family):
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for _ in range(3):
                    results[family].append(run(pipes[family], family))
            stream.synchronize()
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(f"{family}: {type(exc).__name__}: {exc}")

    def eager_work():  # another worker's eager CUDA work (a VAE decode), read back to the host
        x = torch.randn(256, 256, device="cuda")
        try:
            while not stop.is_set():
                x = torch.tanh(x @ x)
                float(x.sum().cpu())  # a stream synchronisation (a device-wide one breaks any capture)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"eager: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=worker, args=(f,)) for f in families]
    side = threading.Thread(target=eager_work)
    side.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    side.join()
    assert not errors, errors
    for family in families:
        assert len(results[family]) == 3 and all(torch.equal(r, eager[family]) for r in results[family]), family
        assert_replayed(pipes[family], 3 * transformer_calls(family, STEPS))
        stats = bcg.get_stats(pipes[family])
        assert not any(e.eager_modules for e in stats.entries), str(stats)
        bcg.remove_acceleration(pipes[family])


def test_one_transformer_shared_by_two_threads_is_serialised():
    family = "flux"
    pipe = build(family)
    eager = run(pipe, family)
    bcg.accelerate_pipeline(pipe)
    # its own scheduler and tokenizers: shared fast tokenizers race (docs/accelerate.md "Threads"); the suite's one
    # failure of this test (13:49, 1 of 6 different) had them shared
    other = bcg.pipeline_for_thread(pipe)
    results, errors = [], []

    def worker(p):
        try:
            for _ in range(3):
                results.append(run(p, family))
        except Exception as exc:  # noqa: BLE001
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=worker, args=(p,)) for p in (pipe, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 6 and all(torch.equal(r, eager) for r in results)
    assert_replayed(pipe, 6 * transformer_calls(family, STEPS))  # every call of both threads through one runner
    bcg.remove_acceleration(pipe)
