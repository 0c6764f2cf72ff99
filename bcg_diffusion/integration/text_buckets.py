"""Padding of the text sequence to fixed buckets, so that one graph serves prompts of many lengths."""

from __future__ import annotations


import torch

from ..families import TransformerInfo


def bucket_for(length: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket >= ``length``, or ``None`` when the text is longer than every bucket."""
    for bucket in buckets:
        if bucket >= length:
            return bucket
    return None


def pad_text_to_bucket(info: TransformerInfo, buckets: tuple[int, ...] | None, kwargs: dict) -> dict:
    """Return ``kwargs`` with the text input and its mask padded to the next bucket.

    Applies only where ``buckets`` is set and the transformer declares a text mask input (elsewhere
    padding would change the result and the key holds the exact length). Padded positions are
    zeros with mask 0, so attention ignores them; a call without a mask (pipelines drop an
    all-true mask) gets an all-true boolean mask for its real tokens.
    """
    if not buckets or info.text_kwarg is None or info.text_mask_kwarg is None:
        return kwargs
    text, mask = kwargs.get(info.text_kwarg), kwargs.get(info.text_mask_kwarg)
    if not isinstance(text, torch.Tensor) or text.dim() < 2:
        return kwargs
    if mask is None:
        mask = torch.ones(text.shape[:2], dtype=torch.bool, device=text.device)
    if not isinstance(mask, torch.Tensor):
        return kwargs
    length = text.shape[1]
    target = bucket_for(length, buckets)
    if target is None or target == length:
        return kwargs
    extra = target - length
    padded = dict(kwargs)
    padded[info.text_kwarg] = torch.cat([text, text.new_zeros(text.shape[0], extra, *text.shape[2:])], dim=1)
    padded[info.text_mask_kwarg] = torch.cat([mask, mask.new_zeros(mask.shape[0], extra, *mask.shape[2:])], dim=1)
    return padded
