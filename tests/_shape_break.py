"""A model with an eager break whose output shape follows a host value the graph key does not hold: a replay
after that value changed stops at the break (``BreakOutputMismatchError``). For the tests of the runner's one
replay path, whole-call and in module mode (tests/integrations/test_debug_replay_cpu.py on the CPU in debug
mode, tests/library/test_accelerate_gpu.py with captured graphs)."""

from __future__ import annotations

import warnings

import torch
from diffusers import ModelMixin

import bcg_diffusion as bcg

WIDTH = {"n": 4}  # the host value: the width of the break's output


@bcg.eager_on_graph()
def widen(x: torch.Tensor) -> torch.Tensor:
    """``(rows, WIDTH)``: each row's sum, repeated; what follows reads its mean, the same at any width."""
    return x.sum(-1, keepdim=True).expand(x.shape[0], WIDTH["n"]).contiguous()


class Block(torch.nn.Module):
    def __init__(self, widening: bool) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.widening = widening

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.widening:
            x = x * widen(x).mean(-1, keepdim=True)
        return self.proj(x)


class WideningModel(ModelMixin):
    """Two blocks; only the first calls the break."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(True), Block(False)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def opaque_forward(model: torch.nn.Module) -> None:
    """Replace ``model.forward`` on the instance with Python the key cannot see: module mode from its first call."""
    original = model.forward

    def forward(x):
        return original(x)

    model.forward = forward


def models(device: str, seed: int = 0) -> tuple[WideningModel, WideningModel]:
    """The model and its eager twin (same weights)."""
    torch.manual_seed(seed)
    model = WideningModel().to(device)
    twin = WideningModel().to(device)
    twin.load_state_dict(model.state_dict())
    return model, twin


def calls_until_a_break_changes_shape(model, twin, device: str) -> tuple[list[bool], list[str]]:
    """Four calls of the accelerated ``model`` against ``twin``: a key's first call, its capture, a replay on new
    inputs, then the break's output widened. Returns per call whether it equalled the twin, and the
    BCGCaptureWarnings of the last call."""
    inputs = [torch.randn(2, 4, device=device, generator=torch.Generator(device).manual_seed(s)) for s in (0, 0, 1, 2)]
    equal = []
    WIDTH["n"] = 4
    try:
        with torch.no_grad():
            for x in inputs[:3]:
                equal.append(torch.equal(model(x), twin(x)))
            WIDTH["n"] = 8
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                equal.append(torch.equal(model(inputs[3]), twin(inputs[3])))
    finally:
        WIDTH["n"] = 4
    messages = [str(w.message) for w in caught if issubclass(w.category, bcg.BCGCaptureWarning)]
    return equal, messages
