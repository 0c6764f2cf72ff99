"""The one way tests list the tensors in a nested value (outputs, inputs, break results).

Descends like the library's walker (``bcg_diffusion.core.tree.node_of`` with ``objects=True``): tuples
(and boxed tuples), lists, dicts, dataclass instances and the ``vars()`` of plain objects (inputs
hold cache objects); every other value is a leaf.
"""

from __future__ import annotations

from typing import Any

import torch

from bcg_diffusion.core.tree import node_of


def tensor_leaves(value: Any, path: str = "x") -> list[tuple[str, torch.Tensor]]:
    """``(path, tensor)`` of every tensor in ``value``, in walking order (the same objects, not copies).
    A tensor is a leaf (its own attributes are not walked)."""
    if isinstance(value, torch.Tensor):
        return [(path, value)]
    node = node_of(value, objects=True)
    if node is None:
        return []
    return [leaf for label, child in node[1] for leaf in tensor_leaves(child, path + label)]


def tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in ``value`` (the same objects)."""
    return [t for _, t in tensor_leaves(value)]


def cloned(value: Any) -> list[torch.Tensor]:
    """Copies of every tensor in ``value`` (safe from a later call that overwrites its buffers)."""
    return [t.clone() for t in tensors(value)]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes: NaNs with the same bits compare equal (``torch.equal`` says NaN != NaN)."""
    flat = t.detach().reshape(-1)
    flat = torch.view_as_real(flat).reshape(-1) if flat.is_complex() else flat
    return flat.contiguous().view(torch.uint8)


def all_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """The same number of tensors, each bitwise equal (same shape, dtype and bits: a NaN equals a NaN
    with the same bits, as an eager rerun gives) to its partner."""
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and torch.equal(_bits(x), _bits(y)) for x, y in zip(a, b))


def latents_of(inputs: Any) -> torch.Tensor:
    """The largest floating-point tensor of a call's inputs (the latents): what changes from step to step."""
    floats = [t for _, t in tensor_leaves(inputs) if t.is_floating_point()]
    assert floats, "the inputs hold no floating-point tensor"
    return max(floats, key=torch.Tensor.numel)


def latent_variants(base: torch.Tensor, n: int, seed: int = 1) -> list[torch.Tensor]:
    """``base`` and ``n - 1`` seeded perturbations of it: latents that change from call to call, as
    in a denoising loop (a replay of stale inputs or a skipped segment gives another output)."""
    g = torch.Generator(base.device).manual_seed(seed)
    noise = [torch.randn(base.shape, generator=g, device=base.device).to(base.dtype) for _ in range(n - 1)]
    return [base.clone()] + [base + 0.25 * e for e in noise]


def calls_on_variants(model: torch.nn.Module, inputs: dict, variants: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """One call of ``model(**inputs)`` per variant of the latents, each written into the same input
    objects first (a pipeline reuses its input objects, such as a KV cache, across the steps of one
    image); the outputs' tensors, copied."""
    latents = latents_of(inputs)
    outs = []
    for variant in variants:
        latents.copy_(variant)
        outs.append(cloned(model(**inputs)))
    return outs
