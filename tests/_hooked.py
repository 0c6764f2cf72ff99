"""The one hooked-call set-up (a step cache around a captured body) of the core tests, CPU and GPU."""

from __future__ import annotations

import torch

FEATURES = 64  # the body's width; its input is (ROWS, FEATURES)
ROWS = 32


def hooked_setup(device):
    """``(f, body, body_fn, state)``: ``f(x)`` calls ``body_fn(x * 3)`` through a hooked call whose
    hooks (a step cache) compute the body on odd calls and reuse it, scaled by 2, on even calls;
    ``state["n"]`` counts the hooks' calls. Inputs are ``(ROWS, FEATURES)`` tensors on ``device``."""
    from bcg_diffusion.core.hooked_calls import CapturedBody, hooked_call

    torch.manual_seed(0)
    w = torch.randn(FEATURES, FEATURES, device=device) / FEATURES**0.5
    state = {"n": 0, "kept": None}

    def body_fn(x):
        return torch.tanh(x @ w) + 1

    body = CapturedBody(body_fn, "body")

    def chain(x):  # a step cache: computes on odd calls, reuses (scaled) on even ones
        state["n"] += 1
        if state["n"] % 2 == 1:
            state["kept"] = body(x)
            return state["kept"]
        return state["kept"] * 2

    def f(x):
        return hooked_call(chain, body, (x * 3,), {}, fresh_outputs=True) - 1

    return f, body, body_fn, state


def hooked_input(device, generator=None):
    return torch.randn(ROWS, FEATURES, device=device, generator=generator)
