"""The names ``bcg-bench``'s parser offers, importing nothing heavy: its ``--help`` and a mistyped option answer
before torch is imported.

The registries own what each name does (:mod:`.modes`, :mod:`.first_image`); each checks at import that its names
are these, in this order, so the two cannot drift apart.
"""

from __future__ import annotations

__all__ = ["DEFAULT_FIRST_IMAGE_MODES", "DEFAULT_MODES", "FIRST_IMAGE_MODE_NAMES", "MODE_NAMES"]

#: The per-step modes of :data:`.modes.MODE_REGISTRY`, in its order.
MODE_NAMES = ("eager", "bcg", "bcg_break", "whole_graph", "compile", "compile_bcg", "compile_all", "compile_bcg_all",
              "compile_bcg_break", "compile_bcg_dynamic", "compile_full_bcg", "reduce_overhead", "partition_ceiling")
#: The modes of the default matrix, and of --cases without --modes (the others are chosen with --modes).
DEFAULT_MODES = ("eager", "bcg", "whole_graph", "compile", "compile_bcg", "reduce_overhead")
#: The first-image modes of :data:`.first_image.FIRST_IMAGE_MODES`, in its order.
FIRST_IMAGE_MODE_NAMES = ("eager", "bcg", "bcg_warmup", "compile", "compile_bcg", "compile_all", "compile_bcg_all")
DEFAULT_FIRST_IMAGE_MODES = ("eager", "bcg", "bcg_warmup", "compile_bcg")
