"""Step-level batching: requests join and leave a running batch at every denoising step (issue 46).

No HTTP here: :class:`StepScheduler` takes :class:`StepRequest` (a stock pipeline call, a seed, a group) and answers
each with a future of :class:`StepResult`. Family loops (:mod:`.loop`, ``family_*.py``) split diffusers' denoising
loops into prepare / step / finish; :class:`~.rows.RunningBatch` holds the slots of one shape; :mod:`.host_work`
prepares requests on arrival and finishes them on their own threads; :class:`StepStats` counts, and
:mod:`.step_clock` times each step's parts on the host and the device; :mod:`.text_reuse` keeps negative prompts'
encodings. The server's wiring is :mod:`bcg_diffusion.serving.batching.step_batching`. See docs/serving.md#step-
batching.

The settings (:mod:`.config`) import nothing heavy, so the server's options read them for ``--help``; the rest
(diffusers' pipeline modules) is imported on first use of a name below.
"""

from __future__ import annotations

import importlib
from typing import Any

from .config import FILLER_PROMPT, FILLER_SEED, POLICIES, STEP_PIPELINES, StepConfig, StepError, row_seeds

__all__ = ["FILLER_PROMPT", "FILLER_SEED", "POLICIES", "STEP_PIPELINES", "StepConfig", "StepError", "StepRequest",
           "StepResult", "StepScheduler", "StepStats", "StepTicket", "loop_for", "row_seeds"]

_LAZY = {"StepRequest": ".scheduler", "StepResult": ".scheduler", "StepScheduler": ".scheduler",
         "StepTicket": ".scheduler", "StepStats": ".stats", "loop_for": ".loops"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
