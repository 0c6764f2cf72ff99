"""GPU tests: torchao-quantized transformers under BCG are bitwise equal to the same quantized
pipeline run eagerly; re-quantizing a layer after capture recaptures."""

import copy

import pytest
import torch

import bcg_diffusion as bcg

pytest.importorskip("bcg_pipelines")
pytest.importorskip("torchao")
from _pipes import build, run  # noqa: E402

from bcg_diffusion.cli.quant_option import QUANT_NAMES, quantize  # noqa: E402

pytestmark = pytest.mark.gpu
FAMILIES = ["flux", "pixart", "wan", "sd3"]


def _quantized(family, name):
    pipe = build(family, dtype=torch.bfloat16)
    quantize(pipe.transformer, name)
    return pipe


@pytest.mark.parametrize("name", QUANT_NAMES)
@pytest.mark.parametrize("family", FAMILIES)
def test_quantized_transformer_bitwise_equal_to_eager(family, name):
    twin, accelerated = _quantized(family, name), _quantized(family, name)
    eager = run(twin, family)
    bcg.accelerate_pipeline(accelerated)
    first, second = run(accelerated, family), run(accelerated, family)
    stats = bcg.get_stats(accelerated)
    bcg.remove_acceleration(accelerated)
    assert torch.equal(first, eager) and torch.equal(second, eager), f"{family} {name}"
    if name == "int8":
        # torchao 0.17's int8 matmul formats its input (input.__repr__(), a host sync) on every eager
        # call: the capture fails there and the key runs eagerly, with one warning naming the line
        assert all("intmm.py" in (e.fallback or "") for e in stats.entries), str(stats)
    else:
        assert stats.entries and all(e.fallback is None for e in stats.entries), str(stats)


def test_a_layer_quantized_again_after_capture_recaptures():
    family = "flux"
    twin, accelerated = _quantized(family, "int8wo"), _quantized(family, "int8wo")
    bcg.accelerate_pipeline(accelerated)
    assert torch.equal(run(accelerated, family), run(twin, family))
    fresh = build(family, dtype=torch.bfloat16).transformer.proj_out
    for pipe in (twin, accelerated):
        pipe.transformer.proj_out = copy.deepcopy(fresh)
        quantize(pipe.transformer.proj_out, "fp8wo")
    assert torch.equal(run(accelerated, family), run(twin, family))
    stats = bcg.get_stats(accelerated)
    bcg.remove_acceleration(accelerated)
    assert stats.captures == 2, str(stats)


def test_diffusers_torchao_config_route_from_a_local_folder(tmp_path):
    """from_pretrained(..., quantization_config=TorchAoConfig(...)) from a local save, no hub download."""
    from diffusers import TorchAoConfig

    from bcg_diffusion.cli.quant_option import torchao_config

    family = "flux"
    source = build(family, dtype=torch.bfloat16)
    source.transformer.save_pretrained(tmp_path)
    cls = type(source.transformer)

    def loaded_pipe():
        pipe = build(family, dtype=torch.bfloat16)
        pipe.transformer = cls.from_pretrained(
            tmp_path, quantization_config=TorchAoConfig(torchao_config("fp8")), torch_dtype=torch.bfloat16
        ).to("cuda")
        return pipe

    twin, accelerated = loaded_pipe(), loaded_pipe()
    linears = [m for m in twin.transformer.modules() if isinstance(m, torch.nn.Linear)]
    assert any(hasattr(type(m.weight), "__tensor_flatten__") for m in linears)  # quantized on load
    eager = run(twin, family)
    bcg.accelerate_pipeline(accelerated)
    out = run(accelerated, family)
    stats = bcg.get_stats(accelerated)
    bcg.remove_acceleration(accelerated)
    assert torch.equal(out, eager)
    assert stats.entries and all(e.fallback is None for e in stats.entries), str(stats)


@pytest.mark.parametrize("family", ["flux", "wan"])
def test_compiled_fp8_blocks_with_acceleration_match_compiled_fp8_blocks_alone(family):
    """compile + BCG + fp8 against compile + fp8 (issue 13). Compiled code is not bitwise equal to eager
    and the attention op changes what Inductor fuses around attention; with fp8 activations a one-ulp
    bf16 difference can move an fp8 rounding, so the check is on the relative error of the whole result."""
    pipe = _quantized(family, "fp8")
    torch._dynamo.reset()
    pipe.transformer.compile_repeated_blocks(fullgraph=True, dynamic=False)
    compiled = run(pipe, family).float()
    bcg.accelerate_pipeline(pipe)
    first, second = run(pipe, family), run(pipe, family)
    stats = bcg.get_stats(pipe)
    bcg.remove_acceleration(pipe)
    torch._dynamo.reset()
    relative = ((first.float() - compiled).norm() / compiled.norm()).item()
    assert relative < 2e-2, f"{family}: relative error {relative:.3g} against compile + fp8 alone"
    assert torch.equal(first, second)
    assert stats.entries and all(e.fallback is None for e in stats.entries), str(stats)
