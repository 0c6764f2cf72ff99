"""The ``--quant NAME`` option of the commands: torchao quantization of a pipeline's transformer, by short
name (``fp8``, ``fp8wo``, ``int8wo``, ``int8``).

Used by ``generate --quant``, the benchmark's ``@fp8``-style case variants and the tests. torchao is
optional (``pip install -e ".[quant]"``); :func:`require_torchao` says how to install it.

The configs are made with ``set_inductor_config=False``: torchao's default changes Inductor's settings for
the whole process when ``quantize_`` runs (coordinate-descent tuning of every Triton kernel), which made
the first regional compile of Flux.1 fp8 take 182 s instead of about 25 s (measured on one H200 GPU) and
also slows every later compile in the process, quantized or not. Call
``torchao.quantization.utils.recommended_inductor_config_setter()`` yourself to have those settings.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

QUANT_NAMES = ("fp8", "fp8wo", "int8wo", "int8")
QUANT_HELP = (
    "fp8 (float8 dynamic activations + float8 weights, Hopper fp8 tensor cores), fp8wo (float8 weight-only), "
    "int8wo (int8 weight-only), int8 (int8 dynamic activations + int8 weights)"
)
INSTALL_HINT = 'torchao is not installed; install it with: pip install -e ".[quant]"'
_CONFIGS = {
    "fp8": "Float8DynamicActivationFloat8WeightConfig",
    "fp8wo": "Float8WeightOnlyConfig",
    "int8wo": "Int8WeightOnlyConfig",
    "int8": "Int8DynamicActivationInt8WeightConfig",
}


class TorchaoMissing(ImportError):
    """torchao is needed for quantization and is not installed."""


def require_torchao() -> Any:
    try:
        import torchao.quantization as quantization
    except ImportError as exc:
        raise TorchaoMissing(INSTALL_HINT) from exc
    return quantization


def torchao_config(name: str) -> Any:
    """The torchao config for ``name``, leaving Inductor's settings alone (``set_inductor_config=False``);
    ``ValueError`` for an unknown name, :class:`TorchaoMissing` without torchao."""
    if name not in _CONFIGS:
        raise ValueError(f"unknown quantization {name!r}; use one of: {QUANT_HELP}")
    return getattr(require_torchao(), _CONFIGS[name])(set_inductor_config=False)


def quantize(transformer: Any, name: str) -> Any:
    """Quantize ``transformer``'s linear layers in place with torchao (``quantize_``); returns it."""
    config = torchao_config(name)
    require_torchao().quantize_(transformer, config)
    return transformer


INT8_NOTE = ("torchao's int8 dynamic-activation matmul reads the host on every call (torchao 0.17), so its Linear "
             "layers cannot be captured: under BCG they run eagerly as breaks, with one warning, and the rest replays")


def torchao_problem() -> str | None:
    """``None`` where torchao can be imported, else the install hint."""
    try:
        require_torchao()
    except TorchaoMissing as exc:
        return str(exc)
    return None


#: The configs whose kernels need float8 tensor cores (CUDA compute capability 8.9 or newer: Ada, Hopper).
FLOAT8_NAMES = ("fp8", "fp8wo")


def device_problem(name: str, device) -> str | None:
    """Why ``--quant name`` cannot run on ``device`` (a ``torch.device``), or ``None``: torchao's float8 configs
    need a CUDA GPU of compute capability 8.9 or newer (torchao asserts it inside ``quantize_``)."""
    if name not in FLOAT8_NAMES:
        return None
    if device.type != "cuda":
        return (f"{name} runs torchao's float8 kernels, which need a CUDA GPU of compute capability 8.9 or newer "
                f"(Ada, Hopper); on {device.type} use int8wo or int8")
    import torch

    capability = torch.cuda.get_device_capability(device)
    if capability < (8, 9):
        return (f"{name} needs compute capability 8.9 or newer (float8 tensor cores); this GPU has "
                f"{capability[0]}.{capability[1]}: use int8wo or int8")
    return None


def torchao_version() -> str:
    try:
        return metadata.version("torchao")
    except metadata.PackageNotFoundError:
        return "unknown"


def apply_quant(pipe: Any, name: str) -> str:
    """Quantize ``pipe.transformer`` with torchao (:func:`quantize`); return a note naming the config."""
    config_name = type(torchao_config(name)).__name__
    quantize(pipe.transformer, name)
    note = f"quantized the transformer: torchao quantize_(transformer, {config_name}()) (--quant {name}, torchao {torchao_version()})"
    return note + (f"; {INT8_NOTE}" if name == "int8" else "")
