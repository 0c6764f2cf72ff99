"""What to measure: the case syntax, the default matrices, shards.

A case is ``family[:size][:HxW][:fFRAMES][:bBATCH][:bin][:cpN[r]][@VARIANT]``, e.g. ``pixart:full:512x512:b2``.
``bin`` keeps the pipeline's resolution binning on (PixArt, Sana: the asked size snaps to the model's aspect-ratio
bins, as diffusers does by default; without it the transformer runs exactly the asked size). ``cpN`` runs the
transformer with diffusers context parallelism of degree N, Ulysses (``cpNr``: ring), under
``torchrun --nproc_per_node N`` (:mod:`.parallel`). A variant
names an entry of :data:`VARIANTS`: a function that changes the built pipeline before anything is measured
(``@fp8``, ``@fp8wo``, ``@int8wo``, ``@int8``: the transformer quantized with torchao); add one there to get
a new kind of case. A variant with an ``unavailable(cuda)`` method that returns a reason (torchao missing, float8
without a float8 GPU) makes a case of the matrix skipped with that reason, and a case named in ``--cases`` a usage
error (exit code 2) before anything runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Callable

import bcg_pipelines as pipelines
from bcg_diffusion.toolkit.quant_option import QUANT_NAMES, apply_quant, device_problem, torchao_problem

from .modes import DEFAULT_MODES

# The default matrix: a launch-bound (small) and a compute-bound (large) shape per family, in the order
# that --shard deals out by family (K/3: pixart+qwenimage, sd3+flux, sana+wan take similar time).
# Launch-bound shapes run every mode and the end-to-end row. Compute-bound shapes skip reduce_overhead,
# the costliest set-up of the matrix (a whole-module compile per shape, 0.5-2 min): its CUDA graphs remove
# launch gaps that a compute-bound step does not have, and `compile` already measures fusion there.
# Their end-to-end row is skipped too (it would repeat the per-step ratio over 20-50 long steps).
COMPUTE_BOUND_MODES = ("eager", "bcg", "whole_graph", "compile", "compile_bcg")
MODES = DEFAULT_MODES  # the launch-bound cases' modes (new modes are chosen with --modes)
DEFAULT_MATRIX = (
    ("pixart:full:512x512:b1", MODES, True),
    ("pixart:full:1024x1024:b1", COMPUTE_BOUND_MODES, False),
    ("sd3:full:512x512:b1", MODES, True),
    ("sd3:full:1024x1024:b1", COMPUTE_BOUND_MODES, False),
    ("sana:full:512x512:b1", MODES, True),
    ("sana:full:1024x1024:b4", COMPUTE_BOUND_MODES, False),
    ("qwenimage:full:512x512:b1", MODES, True),
    ("qwenimage:full:1024x1024:b1", COMPUTE_BOUND_MODES, False),
    ("flux:full:512x512:b1", MODES, True),
    ("flux:full:1024x1024:b1", COMPUTE_BOUND_MODES, False),
    ("wan:full:240x416:f5:b1", MODES, True),
    ("wan:full:480x832:f81:b1", COMPUTE_BOUND_MODES, False),
)
DEFAULT_CASES = tuple(text for text, _, _ in DEFAULT_MATRIX)
# --quick: under 5 minutes on one H200. Launch-bound shapes only; compile for one case.
QUICK_MATRIX = (
    ("pixart:full:512x512:b1", ("eager", "bcg", "whole_graph", "compile"), True),
    ("sd3:full:512x512:b1", ("eager", "bcg", "whole_graph"), True),
)

class QuantVariant:
    """``@fp8`` and its siblings: the transformer quantized with torchao (:mod:`bcg_diffusion.toolkit.quant_option`) right after the
    build, the same quantization in every mode of the case."""

    def __init__(self, name: str):
        self.name = name

    def unavailable(self, cuda: bool) -> str | None:
        """Why this quantization cannot run here: torchao missing, or float8 without a float8 GPU."""
        import torch

        return torchao_problem() or device_problem(self.name, torch.device("cuda" if cuda else "cpu"))

    def __call__(self, pipe) -> str:
        return apply_quant(pipe, self.name)


#: Case variants: name -> function(pipe) -> a note for the report; applied right after the build.
VARIANTS: dict[str, Callable[[object], str]] = {name: QuantVariant(name) for name in QUANT_NAMES}


def variant_problem(case: "Case", cuda: bool) -> str | None:
    """Why ``case``'s variant cannot run here (``None`` if it can, or the case has none)."""
    check = getattr(VARIANTS.get(case.variant), "unavailable", None)
    return check(cuda) if check else None


@dataclass
class Case:
    family: str
    size: str = "full"
    height: int | None = None
    width: int | None = None
    frames: int | None = None
    batch: int = 1
    variant: str = ""
    binning: bool = False  # ``:bin``: the pipeline's resolution binning on (default: off, the exact asked size)
    cp: int | None = None  # ``:cpN``: context-parallel degree (None: one GPU)
    cp_ring: bool = False  # ``:cpNr``: ring attention instead of Ulysses
    modes: tuple[str, ...] | None = None  # per-case modes (the default matrix and the quick preset)
    rows: bool | None = None  # per-case whole-pipeline rows (the default matrix); None: the --e2e setting
    note: str = ""

    @property
    def label(self) -> str:
        parts = [self.family, self.size]
        if self.height is not None:
            parts.append(f"{self.height}x{self.width}")
        if self.frames is not None:
            parts.append(f"f{self.frames}")
        parts.append(f"b{self.batch}")
        if self.binning:
            parts.append("bin")
        if self.cp:
            parts.append(f"cp{self.cp}" + ("r" if self.cp_ring else ""))
        return ":".join(parts) + (f"@{self.variant}" if self.variant else "")

    @property
    def cp_kind(self) -> str | None:
        """``"ulysses"`` or ``"ring"`` for a context-parallel case, else ``None``."""
        return None if not self.cp else ("ring" if self.cp_ring else "ulysses")


def parse_case(text: str) -> Case:
    """``family[:size][:HxW][:fFRAMES][:bBATCH][:bin][:cpN[r]][@VARIANT]`` -> :class:`Case` (``ValueError``
    saying why not)."""
    text, _, variant = text.strip().partition("@")
    tokens = [t for t in text.split(":") if t]
    if not tokens:
        raise ValueError("empty case")
    if variant and variant not in VARIANTS:
        raise ValueError(f"case {text!r}: unknown variant {variant!r}; known: {', '.join(VARIANTS) or 'none'}")
    case = Case(tokens[0], variant=variant)
    for tok in tokens[1:]:
        if tok in pipelines.SIZES:
            case.size = tok
        elif m := re.fullmatch(r"(\d+)x(\d+)(?:x(\d+))?", tok):
            case.height, case.width = int(m.group(1)), int(m.group(2))
            if m.group(3):
                case.frames = int(m.group(3))
        elif m := re.fullmatch(r"f(\d+)", tok):
            case.frames = int(m.group(1))
        elif m := re.fullmatch(r"b(\d+)", tok):
            case.batch = int(m.group(1))
        elif tok in ("bin", "nobin"):
            case.binning = tok == "bin"
        elif m := re.fullmatch(r"cp(\d+)([ur]?)", tok):
            case.cp, case.cp_ring = int(m.group(1)), m.group(2) == "r"
        else:
            raise ValueError(f"case {text!r}: cannot read {tok!r} (expected tiny|full, HxW, fFRAMES, bBATCH, bin, "
                             "cpN or cpNr)")
    if case.batch < 1:
        raise ValueError(f"case {text!r}: batch must be >= 1")
    if case.cp is not None and case.cp < 2:
        raise ValueError(f"case {text!r}: a context-parallel degree must be >= 2 (got cp{case.cp})")
    return case


def resolve_case(case: Case, cuda: bool) -> Case:
    """The case with its shape filled from the family's defaults and validated (``ValueError`` saying
    what is allowed). Without CUDA a case runs at its family's tiny size and default tiny shape."""
    if case.family not in pipelines.list_families():
        raise ValueError(f"unknown family {case.family!r}; known families: {', '.join(pipelines.list_families())}")
    pipelines.check_call(case.family, case.height, case.width, case.frames, size=case.size)  # valid as asked
    if not cuda and (case.size != "tiny" or case.height is not None or case.frames is not None):
        note = f"no CUDA: ran {case.label} as the tiny model at its default shape"
        case = replace(case, size="tiny", height=None, width=None, frames=None, note=note)
    shape = pipelines.check_call(case.family, case.height, case.width, case.frames, size=case.size)
    return replace(case, height=shape["height"], width=shape["width"], frames=shape.get("num_frames"))


def parse_cases_option(text: str) -> list[str]:
    """The cases of ``--cases`` (comma-separated); ``ValueError`` when it names none (e.g. ``","``)."""
    texts = [t.strip() for t in text.split(",") if t.strip()]
    if not texts:
        raise ValueError(f"--cases {text!r} names no case; give e.g. pixart:full:512x512:b1")
    return texts


def parse_shard(text: str) -> tuple[int, int]:
    """``K/N`` (1 <= K <= N) -> ``(K, N)``; ``ValueError`` otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ValueError(f"--shard wants K/N with 1 <= K <= N, e.g. 1/3 (got {text!r})")
    return int(m.group(1)), int(m.group(2))


def shard_cases(texts: list[str], k: int, n: int) -> list[int]:
    """Indices of the cases of shard ``k`` of ``n``: families are dealt out round-robin in order of first
    appearance, so all shapes of a family run in one shard (one process) and every case in exactly one."""
    family_of_case = [text.split(":", 1)[0].strip() for text in texts]
    families = list(dict.fromkeys(family_of_case))  # in order of first appearance
    mine = set(families[k - 1::n])
    return [i for i, family in enumerate(family_of_case) if family in mine]


def matrix_entries(cases: str | None, quick: bool) -> list[tuple[str, tuple[str, ...] | None, bool]]:
    """``(case text, modes, rows)`` of the run: ``--cases`` (a case of the default matrix keeps its modes
    and rows there), else the quick or the default matrix."""
    if not cases:
        return list(QUICK_MATRIX if quick else DEFAULT_MATRIX)
    matrix = {parse_case(text).label: (modes, rows) for text, modes, rows in DEFAULT_MATRIX}
    entries = []
    for text in parse_cases_option(cases):
        try:
            modes, rows = matrix.get(parse_case(text).label, (None, True))
        except ValueError:
            modes, rows = None, True  # reported when the case is resolved
        entries.append((text, modes, rows))
    return entries


def select_cases(entries, cuda: bool, strict: bool) -> tuple[list[Case], list[dict[str, str]]]:
    """Resolved cases and the skipped ones (``{"case", "error"}``); with ``strict`` a bad case, or one whose variant
    cannot run here, raises.

    Without CUDA, cases that resolve to the same tiny case run once."""
    cases, skipped, seen = [], [], set()
    for text, modes, rows in entries:
        try:
            case = resolve_case(replace(parse_case(text), modes=modes, rows=rows), cuda)
        except ValueError as exc:
            if strict:
                raise ValueError(f"--cases: {exc}") from exc
            skipped.append({"case": text, "error": str(exc)})
            continue
        problem = variant_problem(case, cuda)
        if problem and strict:  # a case asked for by name that cannot run here: said before anything runs
            raise ValueError(f"--cases {text}: {problem}")
        if problem:  # e.g. torchao missing: skipped with the install hint, the other cases of the matrix run
            skipped.append({"case": text, "error": problem})
            continue
        if cuda or case.label not in seen:
            seen.add(case.label)
            cases.append(case)
    return cases, skipped
