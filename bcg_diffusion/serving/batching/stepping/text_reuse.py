"""Unconditional text encodings reused (:class:`ReusedEncodings`): under classifier-free guidance every request
encodes its negative prompt, which is the same text for most requests (the empty prompt by default). A family loop
keeps the last few of these encodings, by what they were encoded from (the negative prompt and the settings the
family's text encoding reads) and by the text encoders' weights, and a request whose negative prompt was encoded
before reuses it instead of encoding it again.

Why the bits do not change: a request's negative prompt is encoded in a call of its own, of ``encode_rows`` rows
with fixed filler prompts, so the same text always gives the same encoder inputs at the same shapes, hence the same
kernels and the same values; a reused encoding is the one such a call gave. The weights are part of the key (each
parameter's identity, storage and version counter, which every in-place write bumps): an adapter loaded into a text
encoder, weights loaded or edited in place, make the next request encode again. Where a version counter or a storage
cannot be read (inference tensors, some tensor subclasses) nothing is reused.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Hashable, Iterable

import torch

__all__ = ["ReusedEncodings", "text_encoders", "weights_signature"]


def text_encoders(pipe) -> list[torch.nn.Module]:
    """The pipeline's text encoders (``text_encoder``, ``text_encoder_2``, ...), in name order."""
    components = getattr(pipe, "components", {}) or {}
    return [module for name, module in sorted(components.items())
            if name.startswith("text_encoder") and isinstance(module, torch.nn.Module)]


def weights_signature(modules: Iterable[torch.nn.Module]) -> tuple | None:
    """What the modules' weights are now: per parameter and buffer its identity, storage address and version;
    ``None`` where a version cannot be read."""
    try:
        return tuple((id(t), t.data_ptr(), t._version) for m in modules for t in (*m.parameters(), *m.buffers()))
    except Exception:  # noqa: BLE001 - inference tensors keep no version counter; some subclasses have no storage
        return None


class ReusedEncodings:
    """The last ``size`` unconditional encodings of a loop (dicts of tensors), by key and by the weights of
    ``modules()``'s text encoders when they were made."""

    def __init__(self, modules: Callable[[], list[torch.nn.Module]], size: int = 8):
        self._modules, self.size = modules, size
        self._entries: OrderedDict[tuple, Any] = OrderedDict()
        self.hits = self.misses = 0

    def lookup(self, key: Hashable) -> tuple[tuple | None, Any]:
        """The key to :meth:`store` under (``None``: do not store) and the encoding kept for it (``None``: none)."""
        weights = weights_signature(self._modules())
        if weights is None or self.size < 1:
            return None, None
        full = (key, weights)
        found = self._entries.get(full)
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
            self._entries.move_to_end(full)
        return full, found

    def counts(self) -> dict[str, int]:
        """Encodings reused (``hits``), made (``misses``) and kept now."""
        return {"hits": self.hits, "misses": self.misses, "kept": len(self._entries)}

    def store(self, full_key: tuple | None, encoding: Any) -> None:
        if full_key is None:
            return
        self._entries[full_key] = encoding
        self._entries.move_to_end(full_key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
