"""The choices and help texts of the commands' options, importing nothing heavy.

The parsers are built from these before torch, diffusers or ``bcg_pipelines`` are imported, so ``--help``
and a mistyped option answer at once. :data:`SIZES` and :data:`DTYPE_NAMES` repeat ``bcg_pipelines.SIZES``
and ``bcg_pipelines.DTYPE_NAMES`` (a CPU test checks that they agree); the others are defined here and
re-exported by the modules that use them (``speedups``, ``media``). (``cache_option`` is light itself.)
"""

from __future__ import annotations

__all__ = ["CP_MODES", "DTYPE_NAMES", "IMAGE_SUFFIXES", "MAX_BATCH", "MAX_SIDE_FACTOR", "MAX_STEPS",
           "MIN_MAX_SIDE", "SIDE_LIMIT_RULE", "SIZES", "VIDEO_SUFFIXES"]

#: ``--size``: the model size of a family (``bcg_pipelines.SIZES``).
SIZES = ("tiny", "full")
#: ``--dtype`` (``bcg_pipelines.DTYPE_NAMES``).
DTYPE_NAMES = ("bf16", "bfloat16", "fp16", "float16", "half", "fp32", "float32", "float")

#: ``--cp``: the ``ContextParallelConfig`` degree each one sets (``ulysses_degree``, ``ring_degree``).
CP_MODES = ("ulysses", "ring")

#: ``--out``: the suffixes of images and videos.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
VIDEO_SUFFIXES = (".mp4", ".gif")

#: ``--height``/``--width`` at most this many times the largest side of the family's published default size
#: (Flux.1: 1024 px -> 4096 px), and never below :data:`MIN_MAX_SIDE` (a checkpoint of no known family).
MAX_SIDE_FACTOR = 4
MIN_MAX_SIDE = 4096
#: The rule above in words, as the help, the errors and docs/generate.md state it (an upper bound).
SIDE_LIMIT_RULE = (f"{MAX_SIDE_FACTOR}x the largest side of the family's published size, or {MIN_MAX_SIDE} px where "
                   "that is more")

#: ``--steps`` at most this many: serve.py's default ``--max-steps`` (a larger count is a typo or hours of work).
MAX_STEPS = 100
#: ``--batch`` at most this many outputs per prompt (each one is a full generation's memory).
MAX_BATCH = 64
