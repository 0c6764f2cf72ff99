"""Small helpers over nested tensors (tuples, lists, dicts) of a transformer call."""

from __future__ import annotations

import copy

import torch


def clone_tree(x):
    """A copy of ``x`` with every tensor cloned (named tuples and other objects are kept as they are)."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, dict):
        return {k: clone_tree(v) for k, v in x.items()}
    if isinstance(x, list):
        return [clone_tree(v) for v in x]
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(clone_tree(v) for v in x)
    return x


def copy_tree_(dst, src) -> None:
    """Copy the tensors of ``src`` into those of ``dst`` (same structure) in place."""
    if isinstance(dst, torch.Tensor):
        dst.copy_(src)
    elif isinstance(dst, dict):
        for k in dst:
            copy_tree_(dst[k], src[k])
    elif isinstance(dst, (list, tuple)):
        for d, s in zip(dst, src):
            copy_tree_(d, s)


def first_tensor(out) -> torch.Tensor:
    """The output tensor of a transformer call (a tensor, the first of a tuple, or ``.sample``)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (list, tuple)) and out:
        return first_tensor(out[0])
    sample = getattr(out, "sample", None)
    if isinstance(sample, torch.Tensor):
        return sample
    raise TypeError(f"cannot find the output tensor in a {type(out).__name__}")


def describe_tree(x, depth: int = 0):
    """A JSON-able summary: ``"bfloat16[2, 4096, 64]"`` per tensor, three levels deep."""
    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).replace('torch.', '')}{list(x.shape)}"
    if depth > 2:
        return type(x).__name__
    if isinstance(x, dict):
        return {k: describe_tree(v, depth + 1) for k, v in x.items() if v is not None}
    if isinstance(x, (list, tuple)):
        return [describe_tree(v, depth + 1) for v in x][:8]
    if isinstance(x, (int, float, bool, str)) or x is None:
        return x
    return type(x).__name__


def weight_sharing_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``module``'s structure that shares its parameters and buffers (no extra weight memory)."""
    memo = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return copy.deepcopy(module, memo)
