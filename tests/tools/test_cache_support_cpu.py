"""CPU tests: ``pipelines.caches.CACHE_FAMILIES`` says where each step cache runs, and it is true.

Every (cache, family) pair runs on the tiny pipeline with the family's default call (the call the
scripts make): where the table says the cache runs, it runs and its cached modules see passes; where it
says it does not, diffusers fails eagerly or caches nothing. ``generate.py --cache`` and the benchmark's
cache row refuse the pairs the table excludes, before building anything, with the reason.
"""

import traceback
from pathlib import Path

import diffusers
import pytest
import torch

import bcg_pipelines as pipelines
from bcg_diffusion.step_caches import count_cache_passes
from bcg_diffusion.toolkit.cache_option import (
    CACHE_FAMILIES, CACHE_NAMES, CacheSpec, cache_config, cache_unsupported_reason, check_cache, disable_cache, enable_cache,
    reset_cache_state)
from bcg_diffusion.toolkit.speedups import quiet_library_warnings

STEPS = 4
PAIRS = [(name, family) for name in CACHE_NAMES for family in pipelines.list_families()]
DIFFUSERS = Path(diffusers.__file__).resolve().parent
# How diffusers 0.42 fails, eagerly, where a cache does not run: (exception type, part of its message).
DIFFUSERS_FAILURES = [
    (ValueError, "No cache context is set"),  # a pipeline that does not wrap its calls in cache_context
    (ValueError, "Model class"),  # the cache does not know the transformer's blocks
    (ValueError, "not found in function signature"),
    (KeyError, "hidden_states"),
    (AttributeError, "has no attribute 'current_timestep'"),  # PAB and FasterCache read the pipeline's timestep
    (RuntimeError, "The size of tensor a"),  # PAB shares one cache between CFG calls of other text lengths
    (TypeError, "'NoneType' object is not subscriptable"),  # FasterCache without batched CFG
    (RuntimeError, "permute(sparse_coo)"),  # FasterCache on LTX's packed latents
]


def _raised_by_diffusers(exc: BaseException) -> bool:
    """The exception was raised in diffusers' own code (its innermost Python frame is in the package)
    with one of the known messages: not by this project's code, and not by an unexpected bug."""
    innermost = Path(traceback.extract_tb(exc.__traceback__)[-1].filename).resolve()
    known = any(isinstance(exc, kind) and fragment in str(exc) for kind, fragment in DIFFUSERS_FAILURES)
    return DIFFUSERS in innermost.parents and known


def _run_with_cache(family: str, name: str):
    """One whole tiny generation with the cache; the CachePasses (raises where diffusers fails)."""
    pipe = pipelines.build_pipeline(family, "tiny", device="cpu")
    pipe.set_progress_bar_config(disable=True)
    call, _ = pipelines.fit_call(pipe, pipelines.plan_call(family, "tiny", prompt="a fox", steps=STEPS), batch=1)
    enable_cache(pipe.transformer, cache_config(name, pipe, family, STEPS, pipelines.get_family(family).cfg_mode))
    with count_cache_passes(pipe.transformer) as passes, torch.inference_mode():
        pipe(**call, generator=torch.Generator("cpu").manual_seed(0), output_type="latent")
    return pipe, passes


@pytest.fixture
def quiet():
    with quiet_library_warnings():
        yield


@pytest.mark.parametrize("name, family", PAIRS, ids=[f"{n}-{f}" for n, f in PAIRS])
def test_cache_families_table_is_true(quiet, name, family):
    runs = family in CACHE_FAMILIES[name]
    assert (cache_unsupported_reason(name, family) is None) == runs
    try:
        _, passes = _run_with_cache(family, name)
    except Exception as exc:  # noqa: BLE001 - checked below: diffusers' own, known failure
        assert not runs, f"{name} on {family} is listed as running but failed: {type(exc).__name__}: {exc}"
        assert _raised_by_diffusers(exc), (
            f"{name} on {family} failed, but not as diffusers fails:\n{''.join(traceback.format_exception(exc))}")
        return
    if runs:
        assert passes.calls > 0 and passes.computed > 0, f"{name} on {family}: {passes}"
    else:
        assert passes.calls == 0, f"{name} on {family} is listed as not running, but it cached: {passes}"


def test_every_family_and_cache_has_a_reason_where_it_does_not_run():
    for name, family in PAIRS:
        reason = cache_unsupported_reason(name, family)
        if reason is not None:
            assert "not checked" not in reason, (name, family, reason)
            assert f"cannot run on {family}" in reason and "It runs on: " in reason
            with pytest.raises(ValueError, match=f"cannot run on {family}"):
                check_cache(name, family)
    assert check_cache("fbc:0.3", "flux") == CacheSpec("fbc", 0.3, "fbc:0.3")  # read once, handed on
    assert check_cache(CacheSpec.parse("fbc:0.3"), None) == CacheSpec("fbc", 0.3, "fbc:0.3")  # family not known yet
    with pytest.raises(ValueError, match="unknown cache"):
        check_cache("nocache", "flux")


@pytest.mark.parametrize("family, name", [("flux", "fbc"), ("pixart", "magcache")])
def test_disable_cache_removes_the_hooks_and_reset_restarts_the_decisions(quiet, family, name):
    """CacheMixin transformers (Flux) and those with diffusers' apply_* hooks (PixArt) alike."""
    from bcg_diffusion.step_caches import cached_modules

    pipe, _ = _run_with_cache(family, name)
    call, _ = pipelines.fit_call(pipe, pipelines.plan_call(family, "tiny", prompt="a fox", steps=STEPS), batch=1)

    def run(**overrides):
        with torch.inference_mode():
            return pipe(**{**call, **overrides}, generator=torch.Generator("cpu").manual_seed(0), output_type="latent")[0]

    reference = run()
    run(num_inference_steps=1)  # cut short: PixArt's MagCache (no cache_context) keeps its state mid-way
    reset_cache_state(pipe.transformer)
    assert torch.equal(run(), reference)  # a fresh state: the same generation
    assert cached_modules(pipe.transformer)
    disable_cache(pipe.transformer)
    assert not cached_modules(pipe.transformer)
    disable_cache(pipe.transformer)  # twice: nothing to do


def test_the_step_cache_hook_names_are_diffusers_hook_classes_and_the_library_replays_around_each():
    """One list (``bcg_diffusion.STEP_CACHE_HOOK_NAMES``) for the library's rules and the kit's disable and reset."""
    import importlib
    import pkgutil

    import diffusers.hooks
    from diffusers.hooks.hooks import ModelHook

    import bcg_diffusion
    from bcg_diffusion.integration.model_state import STEP_CACHE_HOOKS

    hook_classes = {name for info in pkgutil.iter_modules(diffusers.hooks.__path__)
                    for name, value in vars(importlib.import_module(f"diffusers.hooks.{info.name}")).items()
                    if isinstance(value, type) and issubclass(value, ModelHook)}
    assert set(bcg_diffusion.STEP_CACHE_HOOK_NAMES) <= hook_classes
    assert bcg_diffusion.STEP_CACHE_HOOK_NAMES == tuple(STEP_CACHE_HOOKS)
    assert all(STEP_CACHE_HOOKS[name].replay_body for name in bcg_diffusion.STEP_CACHE_HOOK_NAMES)


def test_docs_list_the_same_families():
    """docs/generate.md's table of where each cache runs is CACHE_FAMILIES."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "generate.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| ([a-z0-9, ]+) \|", text, re.M))
    assert {name: tuple(f.strip() for f in rows[name].split(",")) for name in CACHE_NAMES} == CACHE_FAMILIES


def test_a_failure_outside_diffusers_is_not_taken_for_diffusers_failing():
    try:
        raise ValueError("No cache context is set (raised by a test, not by diffusers)")
    except ValueError as exc:
        assert not _raised_by_diffusers(exc)
    try:
        {}["hidden_states"]  # a KeyError with a known message, raised outside diffusers
    except KeyError as exc:
        assert not _raised_by_diffusers(exc)
