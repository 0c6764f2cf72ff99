"""Fault rules for the servers the load tools start: a request whose prompt is exactly ``PROMPT`` fails inside the
pipeline at the end of its first denoising step (``error``: :class:`~..faults.InjectedFailure`, answered 500;
``oom``: a ``torch.OutOfMemoryError``, answered 503) or stalls there :data:`SLOW_FAULT_S` seconds (``slow``).
A batch holding such a prompt fails (or stalls) as a whole.

:class:`PromptFaults` is a :class:`~..faults.FaultHook`; :mod:`.fault_server` starts ``bcg-serve`` with it installed.
"""

from __future__ import annotations

import logging
from typing import Iterable, Mapping, Sequence

from ..faults import Fault, InjectedFailure

logger = logging.getLogger(__name__)

__all__ = ["FAULT_KINDS", "SLOW_FAULT_S", "PromptFaults", "parse_rule"]

FAULT_KINDS = ("error", "oom", "slow")
SLOW_FAULT_S = 2.0


def parse_rule(text: str) -> tuple[str, str]:
    """``"KIND:PROMPT"`` -> ``(kind, prompt)``; ``ValueError`` saying what is allowed."""
    kind, sep, prompt = text.partition(":")
    if not sep or kind not in FAULT_KINDS or not prompt:
        raise ValueError(f"--fault {text!r}: expected KIND:PROMPT with KIND one of {', '.join(FAULT_KINDS)}")
    return kind, prompt


class PromptFaults:
    """The rules ``prompt -> kind`` (:data:`FAULT_KINDS`) as a fault hook."""

    def __init__(self, rules: Mapping[str, str]):
        self.rules = dict(rules)

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> "PromptFaults":
        """The rules of ``KIND:PROMPT`` texts (:func:`parse_rule`)."""
        return cls({prompt: kind for kind, prompt in map(parse_rule, texts)})

    def fault(self, prompts: Sequence[str]) -> Fault | None:
        prompt = next((p for p in prompts if p in self.rules), None)
        if prompt is None:
            return None
        kind = self.rules[prompt]

        def fire() -> None:
            import time

            import torch

            if kind == "error":
                raise InjectedFailure(f"injected failure (error:{prompt}) after denoising step 1")
            if kind == "oom":
                raise torch.OutOfMemoryError(f"CUDA out of memory (injected: oom:{prompt})")
            logger.info("fault slow:%s: sleeping %.0f s inside the pipeline", prompt, SLOW_FAULT_S)
            time.sleep(SLOW_FAULT_S)

        return fire
