"""A seam for tests: faults a test installs inside the server's pipeline calls, as the sabotage of the library's
replays is a watcher that the tests install (docs/testing.md).

The server installs nothing. A :class:`FaultHook` that :func:`install_fault_hook` installed is asked, for every
pipeline call (and every step-batched request), about the prompts it holds; a fault it returns runs at the end of
the call's first denoising step (before the call, for a pipeline without a step callback), where it may raise
(:class:`InjectedFailure`, or a ``torch.OutOfMemoryError``) or stall. A failure there fails the call as any
failure inside the pipeline does. The rules ``bcg-load``'s soak uses are
:class:`~bcg_diffusion.serving.load.fault_rules.PromptFaults`.
"""

from __future__ import annotations

import threading
from typing import Callable, Protocol, Sequence

__all__ = ["Fault", "FaultHook", "InjectedFailure", "fault_for", "install_fault_hook"]

#: What a hook returns for a call: run once, at the end of the call's first denoising step.
Fault = Callable[[], None]


class InjectedFailure(RuntimeError):
    """The failure a fault raises inside the pipeline (logged without a traceback: it is expected)."""


class FaultHook(Protocol):
    def fault(self, prompts: Sequence[str]) -> Fault | None:
        """The fault of a call holding ``prompts`` (every row's, fillers aside), or ``None`` for none."""


_hooks: list[FaultHook] = []
_lock = threading.Lock()


def install_fault_hook(hook: FaultHook) -> Callable[[], None]:
    """Install ``hook`` in this process; the undo (which removes it)."""
    with _lock:
        _hooks.append(hook)

    def remove() -> None:
        with _lock:
            if hook in _hooks:
                _hooks.remove(hook)

    return remove


def fault_for(prompts: Sequence[str]) -> Fault | None:
    """The fault of the first installed hook that has one for ``prompts`` (``None`` without hooks: every call of a
    server nobody tests)."""
    with _lock:
        hooks = list(_hooks)
    for hook in hooks:
        fault = hook.fault(prompts)
        if fault is not None:
            return fault
    return None
