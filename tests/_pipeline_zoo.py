"""Shared by the pipeline zoo's CPU tests: one tiny pipeline of a case, called once eagerly on the CPU.

The zoo's cases are split over two test files (:func:`half`) so that the two CI workers of ``--dist loadfile``
share them.
"""

from __future__ import annotations

import math

import torch

from bcg_pipelines import pipeline_zoo

from _tensors import tensor_leaves

CASES = pipeline_zoo.pipeline_cases()


def half(index: int) -> list:
    """Every other case, starting at ``index`` (0 or 1)."""
    return CASES[index::2]


def transformer_calls(pipe) -> list[str]:
    """Hooks every transformer component; the returned list gets the component's name at each call."""
    calls: list[str] = []
    for name, module in pipe.components.items():
        if name.startswith("transformer") and isinstance(module, torch.nn.Module):
            module.register_forward_pre_hook(lambda *_, name=name: calls.append(name))
    return calls


def arrays(out) -> list[tuple[str, torch.Tensor]]:
    """The tensors of a pipeline output (PIL images and numpy arrays as tensors)."""
    from bcg_diffusion.benchmarks.zoo.pipeline_calls import output_tensors

    return output_tensors(out)


def run_eagerly(case):
    """Build the case's pipeline on the CPU, call it once; its transformer calls and output arrays."""
    pipe = pipeline_zoo.build(case, "cpu", torch.float32, seed=0)
    calls = transformer_calls(pipe)
    kwargs = pipeline_zoo.call_kwargs(case, pipe, seed=0)
    with torch.no_grad():
        out = pipe(**kwargs, generator=torch.Generator("cpu").manual_seed(0))
    return calls, arrays(out)


def check_ran(case) -> None:
    """The case's pipeline called its transformer and returned finite, non-constant arrays."""
    calls, outputs = run_eagerly(case)
    assert calls, f"{case.pipeline}: the transformer was never called"
    assert outputs, f"{case.pipeline}: the output holds no array"
    for path, value in outputs:
        if value.is_floating_point():
            assert torch.isfinite(value).all(), f"{case.pipeline}: {path} is not finite"
    flat = torch.cat([v.double().flatten() for _, v in outputs])
    assert flat.numel() > 1 and not math.isclose(float(flat.max()), float(flat.min())), \
        f"{case.pipeline}: the output is constant"
