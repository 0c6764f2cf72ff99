"""What a transformer's calls run besides their inputs, followed call by call.

Three things decide which kernels a call records, and none of them is in its key: the forward a
call at each level of the forward chain runs (:mod:`.forward_chain`; Python the key cannot see
there runs eagerly, :mod:`.python_code`), the model's :class:`~.model_state.Structure` (attention
processors, hooks, opaque submodules, training flags) and its context parallelism. The
:class:`StructureWatch` reads them at the start of every call (the structure as often as
``check_weights`` says) and, when one changed, drops the transformer's graphs (``drop_graphs``) and
plans anew: the breaks the structure needs are installed (:mod:`.breaks`), a lockstep watches the
runner under context parallelism (:mod:`.parallel`), and module mode follows the opaque Python.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from . import cp_support, parallel
from ..config import BCGConfig
from ..errors import AccelerationError
from .breaks.installed import InstalledBreaks
from .events import RunnerEvents
from .forward_chain import ForwardChain
from .model_state import ModelState, Structure
from .module_mode import replay_units, spine_of
from .python_code import OpaqueCode, classify_forward, is_pure
from ..stats import CallCounters

logger = logging.getLogger("bcg_diffusion")


class StructureWatch:
    """The forward chain, structure and parallelism of one transformer (see the module docstring).

    ``breaks`` are the eager breaks installed on it; ``lockstep`` its ranks' watcher under context
    parallelism (``None`` without); ``spine`` the opaque submodules and their ancestors.
    """

    def __init__(
        self, state: ModelState, config: BCGConfig, breaks: InstalledBreaks, events: RunnerEvents, counts: CallCounters,
        drop_graphs: Callable[[], None],
    ) -> None:
        self.state = state
        self.config = config
        self.breaks = breaks
        self.events = events
        self.counts = counts
        self.chain: ForwardChain | None = None
        self.structure: Structure | None = None
        self.spine: set[str] = set()
        self.lockstep: parallel.Lockstep | None = None
        self._drop_graphs = drop_graphs
        self._code: tuple | None = None  # the forward chain's levels and the class forward, as last planned
        self._opaque: dict[int, OpaqueCode | None] = {}  # per level: the transformer's own opaque Python
        self._compiled: tuple[Any, Callable] | None = None
        self._noted: set[str] = set()

    @property
    def root(self) -> torch.nn.Module:
        return self.state.root

    def attach(self, below: Callable, link: Callable, hook_ref: Any, enter: Callable) -> None:
        """Follow the forward chain from now (see :meth:`~.runner.GraphRunner.attach`); the structure
        is read at once, so that refusals raise at acceleration."""
        self.chain = ForwardChain(self.root, below, link, hook_ref, enter, self.state.invalidate)
        self.follow()
        if self.config.compile and (self.opaque_root(0) is not None or self.spine):
            self.refuse_compile(self.opaque_root(0))
        self.state.invalidate()  # the first call reads again what changed since (a cache enabled now)

    def close(self) -> None:
        """Undo every break and the lockstep; the forward chain stays until :meth:`detach`."""
        self.breaks.remove(self.root)
        self._follow_lockstep(None)
        self.structure = None

    def detach(self) -> None:
        if self.chain is not None:
            self.chain.remove()

    # -- following ---------------------------------------------------------------------------
    def follow(self) -> None:
        """Read parallelism, forward chain and structure now; drop the graphs and plan anew where
        one changed. Refusals raise :class:`~bcg_diffusion.AccelerationError`."""
        if getattr(self.root, "_parallel_config", None) is not (self.lockstep.parallel_config if self.lockstep else None):
            self._follow_lockstep(parallel.lockstep_for(self.root, self.config))  # refusals first: nothing changed yet
            self.state.invalidate()
            self.structure = None  # planned again at once: hooks, breaks, graphs
        if self._code is None:
            self._code = self._chain_code()
        elif self._code != self._chain_code():
            self.counts.structure_changes += 1
            self._replan("its forward was replaced, set back, or its class forward reassigned")
        structure = self.state.structure()
        if structure is self.structure:
            return
        if structure == self.structure:
            self.structure = structure
            return
        self._plan(structure)

    def _follow_lockstep(self, lockstep: parallel.Lockstep | None) -> None:
        if self.lockstep is not None:
            self.events.unsubscribe(self.lockstep)
            self.lockstep.close()
        self.lockstep = lockstep
        if lockstep is not None:
            self.events.subscribe(lockstep)

    def _chain_code(self) -> tuple:
        return (tuple(map(id, self.chain.forwards)), id(type(self.root).forward))

    def _replan(self, why: str) -> None:
        logger.info("bcg: %s: %s; its graphs are dropped and the call is planned again", type(self.root).__name__, why)
        self._drop_graphs()
        self._opaque = {}
        self._compiled = None
        self._code = self._chain_code()

    def _plan(self, structure: Structure) -> None:
        name = type(self.root).__name__
        if self.config.compile and structure.hooked:
            raise AccelerationError(
                f"BCGConfig(compile=True) compiles {name}'s whole forward, which would trace through the hooks on "
                f"{', '.join(h.path for h in structure.hooked[:3])}; with hooks (step caches) compile the blocks "
                "(compile_repeated_blocks) and leave compile=False"
            )
        if self.lockstep is not None:
            cp_support.check_structure(self.root, self.breaks.eager.names)
        if self.structure is not None:
            self.counts.structure_changes += 1
            logger.info("bcg: %s changed (%s): its graphs are dropped and recaptured", name,
                        structure.describe_difference(self.structure))
        self._drop_graphs()
        self.breaks.apply(self.root, structure)
        self.structure = structure
        self.spine = spine_of([o.path for o in structure.opaque])
        for opaque in structure.opaque:
            self._note_opaque(opaque)

    # -- what a call runs ----------------------------------------------------------------------
    def forward_for(self, level: int) -> Callable:
        """What a call at ``level`` runs eagerly and captures (compiled whole with ``BCGConfig.compile``)."""
        forward = self.chain.forward_at(level)
        if not self.config.compile:
            return forward
        if self._compiled is None or self._compiled[0] != (level, self._code):
            self._compiled = ((level, self._code), torch.compile(forward, dynamic=False))
        return self._compiled[1]

    def opaque_root(self, level: int) -> OpaqueCode | None:
        """The transformer's own Python at ``level`` when the key cannot see it (cached per plan)."""
        if level not in self._opaque:
            if level > 0:
                forward = self.chain.forwards[level]
                opaque = None if is_pure(forward, self.config.pure_forwards) else OpaqueCode(
                    "", "forward replaced after acceleration", self.chain.describe(level)
                )
            else:
                opaque = classify_forward(self.root, self.chain.forward_at(0), "", self.config.pure_forwards)
            self._opaque[level] = opaque
            if opaque is not None:
                self._note_opaque(opaque)
        return self._opaque[level]

    def in_module_mode(self, level: int) -> bool:
        """Whether calls at ``level`` run in module mode from their first call (opaque Python)."""
        return self.opaque_root(level) is not None or bool(self.spine)

    def hooked_paths(self) -> set[str]:
        """The hooked modules of the structure (in module mode they run as they do, never as units)."""
        return {h.path for h in self.structure.hooked} if self.structure else set()

    def units(self) -> list[tuple[str, torch.nn.Module]]:
        """The replay units of module mode for this structure."""
        return replay_units(self.root, self.spine, self.hooked_paths())

    def opaque_summary(self, level: int) -> str:
        """What runs eagerly in module mode and why, for stats: the transformer's own Python and
        opaque submodules."""
        name = type(self.root).__name__
        opaque = self.opaque_root(level)
        found = ([opaque] if opaque is not None else []) + list(self.structure.opaque if self.structure else ())
        shown = "; ".join(o.describe(name) for o in found[:3])
        more = f" and {len(found) - 3} more" if len(found) > 3 else ""
        spine = f" ({len(self.spine)} modules on the eager spine)" if self.spine else ""
        return f"{shown}{more}{spine}"

    def refuse_compile(self, opaque: OpaqueCode | None) -> None:
        name = type(self.root).__name__
        where = opaque.describe(name) if opaque is not None else "replaced submodule forwards"
        raise AccelerationError(
            f"BCGConfig(compile=True) compiles {name}'s whole forward, but Python the graph key cannot see runs in it "
            f"({where}): it must run eagerly on every call. Compile the blocks instead "
            "(transformer.compile_repeated_blocks()) and leave compile=False"
        )

    def _note_opaque(self, opaque: OpaqueCode) -> None:
        message = opaque.describe(type(self.root).__name__)
        if message not in self._noted:
            self._noted.add(message)
            logger.info(
                "bcg: %s: its Python runs eagerly on every call and the modules it calls replay their graphs "
                "(module mode). If it decides nothing per call, name it in BCGConfig.pure_forwards to capture it.",
                message,
            )
