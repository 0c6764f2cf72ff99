"""CPU tests of the model zoo (``pipelines.zoo``) and of ``scripts/zoo_probe.py``.

Every zoo case builds and runs one forward in fp32 with a finite, repeatable output; the zoo covers every
``ModelMixin`` class of ``diffusers.models.transformers`` except the documented exclusions.
"""

from __future__ import annotations

import importlib
import json

import pytest
import torch

from bcg_pipelines.families import FAMILIES
from bcg_diffusion.core.tree import walk
from bcg_pipelines import zoo

from _tensors import tensor_leaves as _tensors

CASES = zoo.zoo_cases()


@pytest.fixture
def uncompiled_block_masks(monkeypatch):
    """Wan-Animate-2 builds its flex BlockMask with ``_compile=True``: inductor takes ~40 s for it on two CPU
    cores. The uncompiled builder makes the same mask."""
    from diffusers.models.transformers import transformer_wan_animate_2 as module

    build = module.create_block_mask
    monkeypatch.setattr(module, "create_block_mask", lambda *a, _compile=False, **k: build(*a, _compile=False, **k))


# -- coverage ----------------------------------------------------------------------------------------
def test_every_transformer_class_has_a_case_or_a_documented_exclusion():
    classes = set(zoo.transformer_classes())
    covered = {case.class_name for case in CASES}
    missing = sorted(classes - covered - set(zoo.EXCLUDED))
    assert not missing, f"diffusers has transformer classes the zoo neither covers nor excludes: {missing}"
    assert covered <= classes, f"zoo cases of classes diffusers does not have: {sorted(covered - classes)}"
    assert set(zoo.EXCLUDED) <= classes, f"exclusions of unknown classes: {sorted(set(zoo.EXCLUDED) - classes)}"
    assert not covered & set(zoo.EXCLUDED), "a class is both covered and excluded"
    assert all(len(reason) > 20 for reason in zoo.EXCLUDED.values()), "every exclusion says why"


def test_each_class_has_one_pipeline_faithful_case_and_unique_names():
    main_cases = [case.class_name for case in CASES if case.variant is None]
    assert len(main_cases) == len(set(main_cases))
    assert set(main_cases) == {case.class_name for case in CASES}
    assert len({case.name for case in CASES}) == len(CASES)


def test_known_families_are_zoo_cases_with_their_family():
    families = {case.class_name: case.family for case in CASES if case.family}
    assert families == {class_name: name for name, class_name in FAMILIES.items()}


# -- every case ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_case_builds_and_runs_finite_and_repeatable(case, request):
    if case.class_name == "WanAnimate2Transformer3DModel":
        request.getfixturevalue("uncompiled_block_masks")
    model = zoo.build_tiny(case)
    inputs = zoo.tiny_inputs(case)
    with torch.no_grad():
        first = _tensors(model(**inputs))
        second = _tensors(model(**inputs))
    assert first, f"{case.name}: the forward returned no tensor"
    assert [p for p, _ in first] == [p for p, _ in second]
    for (path, a), (_, b) in zip(first, second):
        assert torch.equal(a, b), f"{case.name}: {path} differs between two forwards on the same inputs"
        if a.is_floating_point():
            assert torch.isfinite(a).all(), f"{case.name}: {path} is not finite"
            assert a.abs().sum() > 0, f"{case.name}: {path} is all zeros"


def test_inputs_are_seeded():
    for case in CASES:
        a, b = _tensors(zoo.tiny_inputs(case, seed=0)), _tensors(zoo.tiny_inputs(case, seed=0))
        assert [p for p, _ in a] == [p for p, _ in b], case.name
        assert all(torch.equal(x, y) for (_, x), (_, y) in zip(a, b)), f"{case.name}: same seed, other inputs"
    flux = next(case for case in CASES if case.name == "FluxTransformer2DModel")
    other = zoo.tiny_inputs(flux, seed=1)["hidden_states"]
    assert not torch.equal(zoo.tiny_inputs(flux, seed=0)["hidden_states"], other)


@pytest.mark.parametrize("name", ["NucleusMoEImageTransformer2DModel", "LuminaNextDiT2DModel", "WanTransformer3DModel"])
def test_two_builds_are_equal_and_no_parameter_is_all_zero(name):
    case = next(case for case in CASES if case.name == name)
    before = torch.get_rng_state()
    first, second = zoo.build_tiny(case, seed=3).state_dict(), zoo.build_tiny(case, seed=3).state_dict()
    assert torch.equal(torch.get_rng_state(), before), "build_tiny changed the caller's RNG state"
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first), f"{name}: two builds with one seed differ"
    params = dict(zoo.build_tiny(case, seed=3).named_parameters())
    assert all(p.any() for p in params.values() if p.is_floating_point()), "an all-zero parameter is left"


def test_half_builds_keep_the_classes_fp32_modules():
    case = next(case for case in CASES if case.name == "WanTransformer3DModel")
    model = zoo.build_tiny(case, dtype=torch.bfloat16)
    keep = set(model._keep_in_fp32_modules)
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    kept = [n for n in dtypes if keep & set(n.split("."))]
    assert kept and all(dtypes[n] == torch.float32 for n in kept)
    assert all(dtypes[n] == torch.bfloat16 for n in dtypes if n not in kept)


def test_a_case_that_adds_with_atomics_runs_under_deterministic_algorithms_and_only_there():
    cases = {case.name: case for case in zoo.zoo_cases()}
    assert [n for n, c in cases.items() if c.atomic_adds] == ["NucleusMoEImageTransformer2DModel"]
    assert not torch.are_deterministic_algorithms_enabled()
    with cases["FluxTransformer2DModel"].determinism():
        assert not torch.are_deterministic_algorithms_enabled()
    with pytest.raises(RuntimeError, match="inside"):
        with cases["NucleusMoEImageTransformer2DModel"].determinism():
            assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
            raise RuntimeError("inside")
    assert not torch.are_deterministic_algorithms_enabled()  # as it was, after an error too


def test_unknown_class_names_the_case():
    bad = zoo.ZooCase("NoSuchTransformer", {}, lambda m: {})
    with pytest.raises(LookupError, match="NoSuchTransformer"):
        zoo.build_tiny(bad)


# -- scripts/zoo_probe.py ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def probe():
    return importlib.import_module("bcg_diffusion.benchmarks.zoo.zoo_probe")


CPU_ONLY = pytest.mark.usefixtures("hide_cuda")  # checks the no-CUDA path of the script (CUDA hidden where present)


@CPU_ONLY
def test_probe_on_cpu_checks_eager_and_plumbing(probe, tmp_path, capsys):
    argv = ["--classes", "FluxTransformer2DModel,HunyuanDiT2DModel", "--dtype", "fp32", "--out", str(tmp_path)]
    assert probe.main(argv) == 0
    report = json.loads((tmp_path / "zoo_probe_fp32.json").read_text())
    results = {r["case"]: r for r in report["results"]}
    assert set(results) == {"FluxTransformer2DModel", "HunyuanDiT2DModel", "HunyuanDiT2DModel[cpu_rope]"}
    for r in results.values():
        assert r["status"] == "not accelerated" and r["eager_repeatable"] is True
        assert r["bitwise"] == [True] * 4 and r["error"] == ""
    assert report["header"]["counts"] == {"not accelerated": 3}
    table = (tmp_path / "zoo_probe_fp32.md").read_text()
    assert "| HunyuanDiT2DModel[cpu_rope] | not accelerated | yes | ==== |" in table
    assert "FluxTransformer2DModel: not accelerated" in capsys.readouterr().out


@CPU_ONLY
def test_probe_records_a_crash_and_goes_on(probe, tmp_path, monkeypatch):
    build = probe.zoo.build_tiny

    def failing(case, *args, **kwargs):
        if case.class_name == "SD3Transformer2DModel":
            raise ValueError("broken on purpose")
        return build(case, *args, **kwargs)

    monkeypatch.setattr(probe.zoo, "build_tiny", failing)
    probe.main(["--classes", "SD3Transformer2DModel,WanTransformer3DModel", "--dtype", "fp32", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "zoo_probe_fp32.json").read_text())["results"]
    assert [(r["case"], r["status"], r["phase"]) for r in results] == [
        ("SD3Transformer2DModel", "crash", "build"),
        ("WanTransformer3DModel", "not accelerated", ""),
    ]
    assert results[0]["error"].startswith("ValueError: broken on purpose")


def test_probe_time_budget_skips_the_rest(probe, tmp_path):
    probe.main(["--classes", "WanTransformer3DModel", "--time-budget", "-1", "--out", str(tmp_path), "--dtype", "fp32"])
    results = json.loads((tmp_path / "zoo_probe_fp32.json").read_text())["results"]
    assert [(r["status"], r["error"]) for r in results] == [("skipped", "time budget -1 s")]


def test_probe_unknown_class_exits_naming_it(probe):
    with pytest.raises(SystemExit, match="NoSuchModel"):
        probe.select_cases("FluxTransformer2DModel,NoSuchModel")


def test_probe_compare_tells_bits_values_and_structure(probe):
    reference = probe.snapshot((torch.tensor([1.0, 2.0]), [torch.tensor([3])]))
    assert probe.compare(reference, (torch.tensor([1.0, 2.0]), [torch.tensor([3])])) == (True, 0.0)
    assert probe.compare(reference, (torch.tensor([1.0, 2.5]), [torch.tensor([3])])) == (False, 0.5)
    assert probe.compare(reference, (torch.tensor([-0.0 + 1.0, 2.0]), [torch.tensor([4])])) == (False, float("inf"))
    assert probe.compare(reference, (torch.tensor([1.0, 2.0]),)) == (False, None)
    negative_zero = probe.snapshot(torch.tensor([0.0]))
    assert probe.compare(negative_zero, torch.tensor([-0.0]))[0] is False  # bitwise, not ==
