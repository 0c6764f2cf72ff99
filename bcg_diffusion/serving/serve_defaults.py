"""What ``bcg-serve``'s parser needs, importing nothing heavy: its name and the defaults it shows, so that ``--help``
and a mistyped option answer before torch, diffusers or the serve extra are imported.

The modules that own what these numbers do (:mod:`.batching.request_batching`) import them from here.
"""

from __future__ import annotations

import importlib.util

from bcg_diffusion.toolkit.options import command_name

__all__ = ["DEFAULT_TARGET_ONGOING_REQUESTS", "DEFAULT_WINDOW_MS", "DEFAULT_WORK_LIMIT", "SERVE_EXTRA_MODULES",
           "missing_serve_extra", "prog"]

#: ``--batch-window-ms``: the longest the oldest waiting request waits for others to join its batch (a batch
#: closes earlier once full or once the previous call's clients are back: :class:`.batching.RequestBatcher`). It must
#: cover a client's round trip, from its answer to its next request (PNG encoding, HTTP, the client's own work):
#: measured on the CPU against a live tiny Flux server, 8 closed-loop clients, ``--max-batch 8``, 2 shared
#: cores (``return_s`` in ``/stats``): 64x64 mean 26 ms, max 46 ms; 512x512 (8 PNGs of 512x512 per call)
#: mean 0.41 s, max 0.55 s. 20 ms, the first default, split 8 GPU clients into calls of 3 and 5.
DEFAULT_WINDOW_MS = 500.0
#: ``--batch-work-limit``: latent tokens x hidden size x CFG rows per row above which a size is not batched
#: (PixArt-Sigma at 512x512: 1024 x 1152 x 2 = 2.4M; Flux.1 at 512x512: 1024 x 3072 = 3.1M, at 1024x1024 12.6M).
#: From one H200 run (bench_results/batching_2026-12-02_153747): PixArt-Sigma 512 px, 20 steps, 8 rows per
#: call took 1.38 s against 8 x 0.234 s one by one, so even full batches would give at most 1.35x (a lone
#: request paying 5.9x), and Flux.1 512 px at most 1.15x (3.54 s against 8 x 0.51 s); both sizes are above
#: this limit. Smaller sizes were not measured: they are batched by default.
DEFAULT_WORK_LIMIT = 1 << 21
#: ``--target-ongoing-requests``: Ray Serve's own default of the autoscaler's target (ongoing requests per replica).
DEFAULT_TARGET_ONGOING_REQUESTS = 2.0
#: The modules of the serve extra (``pip install -e ".[serve]"``).
SERVE_EXTRA_MODULES = ("fastapi", "uvicorn", "starlette", "pydantic", "httpx")


def prog() -> str:
    """The command's name in usage and error lines: ``bcg-serve`` when run as that, else ``serve.py``."""
    return command_name("serve.py", "bcg-serve")


def missing_serve_extra() -> str | None:
    """What to install when a module of the serve extra is missing (found without importing it), else ``None``."""
    for name in SERVE_EXTRA_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return f"No module named {name!r}; install the server's packages with: pip install -e \".[serve]\""
    return None
