"""One zoo case (a tiny config of a diffusers transformer and a valid forward call) and its builders."""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

__all__ = ["InputMaker", "ZooCase", "build_tiny", "tiny_inputs", "transformer_class"]


class InputMaker:
    """Seeded makers of forward inputs on one device and dtype.

    Random values are drawn on the CPU from one ``torch.Generator`` and then moved, so a case gives the
    same values on every device for the same seed. Floating inputs get ``dtype`` unless told otherwise;
    ``config`` is the case's init config (input shapes often follow it).
    """

    def __init__(self, device: torch.device | str, dtype: torch.dtype, seed: int, config: Mapping[str, Any]):
        self.device = torch.device(device)
        self.dtype = dtype
        self.config = config
        self._generator = torch.Generator("cpu").manual_seed(seed)

    def randn(self, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        values = torch.randn(shape, generator=self._generator, dtype=torch.float32)
        return values.to(self.device, dtype or self.dtype)

    def randint(self, low: int, high: int, *shape: int) -> torch.Tensor:
        return torch.randint(low, high, shape, generator=self._generator).to(self.device)

    def timestep(self, batch: int, value: float = 500.0, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A denoising timestep per sample (a pipeline's ``t.expand(batch)``)."""
        return torch.full((batch,), value, device=self.device, dtype=dtype or self.dtype)

    def ones(self, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.ones(shape, device=self.device, dtype=dtype or self.dtype)

    def zeros(self, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.zeros(shape, device=self.device, dtype=dtype or self.dtype)

    def mask(self, batch: int, length: int, valid: int | None = None, dtype: torch.dtype = torch.long) -> torch.Tensor:
        """A text padding mask: the first ``valid`` tokens of each row on (all when ``None``)."""
        valid = length if valid is None else valid
        mask = torch.zeros(batch, length, dtype=dtype)
        mask[:, :valid] = 1
        return mask.to(self.device)

    def tensor(self, data: Any, dtype: torch.dtype | None = None, on_device: bool = True) -> torch.Tensor:
        """A tensor of fixed values (ids, sizes); ``on_device=False`` keeps it on the CPU, as pipelines
        that pass host-side metadata do."""
        value = torch.tensor(data, dtype=dtype)
        return value.to(self.device) if on_device else value


@dataclass(frozen=True)
class ZooCase:
    """A diffusers transformer class at a tiny size, with a valid forward call.

    Attributes:
        class_name: the class in ``diffusers.models.transformers``.
        config: init keyword arguments: small widths and 1-2 layers of each block kind, so a forward
            takes milliseconds while the block structure stays the published one.
        make_inputs: ``make_inputs(maker) -> kwargs`` of one forward call, with the shapes and devices a
            real pipeline passes (see :class:`InputMaker`). ``return_dict=False`` is added when the
            forward takes it.
        variant: ``None`` for the case that calls the model as its pipeline does; otherwise the name of
            another call path of the same class (the case's ``name`` is then ``Class[variant]``).
        note: what the case exercises or why it is shaped so (facts for the reader of a probe table).
        family: the ``bcg_pipelines`` family name when the class is one of :data:`bcg_pipelines.families.FAMILIES`.
        atomic_adds: its forward adds with atomics on CUDA (``scatter_add_`` in an expert routing), so its eager
            output is not bitwise repeatable from run to run; checks run it under :meth:`determinism`.
    """

    class_name: str
    config: Mapping[str, Any]
    make_inputs: Callable[[InputMaker], dict[str, Any]]
    variant: str | None = None
    note: str = ""
    family: str | None = None
    atomic_adds: bool = False

    @property
    def name(self) -> str:
        return self.class_name if self.variant is None else f"{self.class_name}[{self.variant}]"

    @contextlib.contextmanager
    def determinism(self):
        """For a case with :attr:`atomic_adds`: torch's deterministic algorithms for the block (warnings only where
        an op has none), as they were after it; nothing for the others. Run its eager and accelerated calls under
        it alike, so that a difference between them is the accelerated one's."""
        if not self.atomic_adds:
            yield
            return
        before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def transformer_class(case: ZooCase) -> type:
    """The diffusers class of ``case``; ``LookupError`` naming it when this diffusers has no such class."""
    from .catalog import transformer_classes

    classes = transformer_classes()
    if case.class_name not in classes:
        raise LookupError(
            f"zoo case {case.name}: diffusers.models.transformers has no class {case.class_name} "
            "(another diffusers version?); drop the case or install diffusers 0.42.1"
        )
    return classes[case.class_name]


class _ZeroedEmpty(torch.overrides.TorchFunctionMode):
    """``torch.empty`` returns zeros: a parameter a class leaves uninitialised (``nn.Parameter(torch.empty(...))``,
    Nucleus's experts) is then deterministic, and :func:`_fill_zero_parameters` gives it values."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.empty:
            kwargs.pop("memory_format", None)
            return torch.zeros(*args, **kwargs)
        return func(*args, **kwargs)


def _fill_zero_parameters(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Give parameters that their init leaves all-zero (output projections, gates) small random values,
    so every layer shapes the output and a wrong replay cannot hide behind a zero."""
    with torch.no_grad():
        for param in model.parameters():
            if param.numel() and param.is_floating_point() and not param.any():
                noise = torch.randn(param.shape, generator=generator, dtype=torch.float32) * 0.02
                param.copy_(noise.to(param.dtype))


def _keep_fp32_modules(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Parameters and buffers of the class's ``_keep_in_fp32_modules`` back in float32 for half dtypes, as
    ``from_pretrained(torch_dtype=...)`` leaves them (a module matches by a component of its qualified name)."""
    keep = getattr(model, "_keep_in_fp32_modules", None) or []
    if dtype not in (torch.float16, torch.bfloat16) or not keep:
        return
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if tensor.is_floating_point() and any(part in keep for part in name.split(".")):
                tensor.data = tensor.data.to(torch.float32)


def build_tiny(
    case: ZooCase, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0
) -> torch.nn.Module:
    """The model of ``case`` with random weights (seeded), in eval mode, on ``device`` in ``dtype`` (with the
    class's ``_keep_in_fp32_modules`` in float32 for half dtypes, as ``from_pretrained`` loads them).

    Parameters that the class initialises to all zeros, or leaves uninitialised, get small random values
    (see :func:`_fill_zero_parameters`), so outputs are not trivially constant and two builds are equal.
    """
    cls = transformer_class(case)
    with torch.random.fork_rng(devices=[]), _ZeroedEmpty():  # the caller's CPU RNG state is left as it was
        torch.manual_seed(seed)
        model = cls(**dict(case.config))
    _fill_zero_parameters(model, torch.Generator("cpu").manual_seed(seed + 1))
    # torch's own ``to``: ModelMixin.to warns about _keep_in_fp32_modules, which the next line honours
    model = torch.nn.Module.to(model, device=device, dtype=dtype).eval()
    _keep_fp32_modules(model, dtype)
    return model


def tiny_inputs(
    case: ZooCase, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0
) -> dict[str, Any]:
    """Keyword inputs of one valid forward of ``case``'s model on ``device`` with floating inputs in
    ``dtype``; the same values for the same ``seed`` on every device."""
    kwargs = case.make_inputs(InputMaker(device, dtype, seed, case.config))
    forward = transformer_class(case).forward
    if "return_dict" in inspect.signature(forward).parameters:
        kwargs.setdefault("return_dict", False)
    return kwargs
