"""The runner-events seam: a graph runner tells its watchers what it does, and they may take part.

Public (``bcg_diffusion.RunnerWatcher``, ``bcg_diffusion.watch_every_runner``; docs/api.md). A watcher
subclasses :class:`RunnerWatcher` and overrides what it needs (every method does nothing here). The runner
tells it, in this order for one transformer call:

- ``call_began()``, then ``call_ended()`` or ``call_failed(exc)`` (the exception still propagates):
  one transformer call through the runner (a nested eager call inside it is not one);
- ``planned(path, key)``: the path of a keyed call, one of :data:`~.slots.PATHS` (``warmup``,
  ``capture``, ``replay``, ``fallback``, ``eager``, ``module``), before anything of it runs
  (``key.summary()`` describes the key); or ``planned_eager(reason, args, kwargs)`` for a call that
  runs eagerly before it has a key (inputs that cannot be keyed, none on the device);
- ``ran_eagerly(reason)``: the call runs eagerly for ``reason`` (it has no key, or its key is never
  captured: its calls change their own inputs), on every such call;
- ``capturing(ctx)`` returns the :class:`~.entries.CaptureContext` a capture is given (a watcher
  may change its config, or what it may evict); ``captured(entry)`` returns the entry the runner
  keeps: the capture's outcome (a :class:`~.entry_kinds.GraphEntry`: ``EagerFallback`` with its
  ``reason``, ``CapturedGraph``, ``DebugRun`` or ``ModuleModeEntry``; every kind has
  ``eager_modules``, ``capture_time_s``, ``memory_bytes``), or ``entry.fall_back(reason)`` to give it
  up (``None``: keep it as it is); both for every capture, a transformer's or a unit's in module mode;
- ``replay_failed(exc)``: a replay stopped part-way (a break returned another shape); the call
  then runs eagerly, unless a watcher raises.

Each runner's :class:`RunnerEvents` tells its watchers: those of every runner of the process first
(:func:`watch_every_runner`: tools, the test suite's deliberately broken replays), then its own
(:meth:`RunnerEvents.subscribe`: context parallelism's lockstep, :mod:`.parallel`), so a runner's own
watchers see the outcome the others made. Watchers are told in the runner's thread, under its lock.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

from ..core.handles import RemovableHandle

_lock = threading.Lock()
_everywhere: list["RunnerWatcher"] = []


class RunnerWatcher:
    """A watcher of graph runners: every method does nothing (see the module docstring)."""

    def call_began(self) -> None:
        pass

    def call_ended(self) -> None:
        pass

    def call_failed(self, exc: BaseException) -> None:
        pass

    def planned(self, path: str, key: Any) -> None:
        pass

    def planned_eager(self, reason: str, args: tuple, kwargs: dict) -> None:
        pass

    def ran_eagerly(self, reason: str) -> None:
        pass

    def capturing(self, ctx: Any) -> Any:
        return ctx

    def captured(self, entry: Any) -> Any:
        return entry

    def replay_failed(self, exc: BaseException) -> None:
        pass


def watch_every_runner(watcher: RunnerWatcher) -> RemovableHandle:
    """Tell ``watcher`` what every runner of the process does, until the handle is removed."""
    with _lock:
        _everywhere.append(watcher)

    def remove() -> None:
        with _lock:
            if watcher in _everywhere:
                _everywhere.remove(watcher)

    return RemovableHandle(remove, f"{type(watcher).__name__} watching every runner", listed=False)


class RunnerEvents:
    """The watchers of one runner: the process's (:func:`watch_every_runner`), then its own."""

    def __init__(self) -> None:
        self._own: list[RunnerWatcher] = []

    def subscribe(self, watcher: RunnerWatcher) -> None:
        self._own.append(watcher)

    def unsubscribe(self, watcher: RunnerWatcher) -> None:
        if watcher in self._own:
            self._own.remove(watcher)

    def watchers(self) -> list[RunnerWatcher]:
        return [*_everywhere, *self._own]

    @contextlib.contextmanager
    def calling(self) -> Iterator[None]:
        """One transformer call: begun, then ended or failed, for the watchers of that moment (one
        subscribed during the call is told its end)."""
        for watcher in self.watchers():
            watcher.call_began()
        try:
            yield
        except BaseException as exc:
            for watcher in self.watchers():
                watcher.call_failed(exc)
            raise
        finally:
            for watcher in self.watchers():
                watcher.call_ended()

    def planned(self, path: str, key: Any) -> None:
        for watcher in self.watchers():
            watcher.planned(path, key)

    def planned_eager(self, reason: str, args: tuple, kwargs: dict) -> None:
        for watcher in self.watchers():
            watcher.planned_eager(reason, args, kwargs)

    def ran_eagerly(self, reason: str) -> None:
        for watcher in self.watchers():
            watcher.ran_eagerly(reason)

    def capturing(self, ctx: Any) -> Any:
        for watcher in self.watchers():
            ctx = watcher.capturing(ctx)
        return ctx

    def captured(self, entry: Any) -> Any:
        """The entry the runner keeps: each watcher's answer in turn (``None``: the entry as it was)."""
        for watcher in self.watchers():
            kept = watcher.captured(entry)
            entry = entry if kept is None else kept
        return entry

    def replay_failed(self, exc: BaseException) -> None:
        for watcher in self.watchers():
            watcher.replay_failed(exc)
