"""The host state of a model that decides which kernels a capture records, besides its inputs.

Two parts, read together once per pipeline call (every call for a bare transformer, or with
``check_weights="every_call"``):

- the weight fingerprint (:mod:`.fingerprint`): parameter and buffer addresses and versions, LoRA
  state;
- the :class:`Structure`: the attention processor of every attention module (identity and the
  state it reads: ``_attention_backend``, scales, ...), the hooks of every submodule (diffusers
  ``ModelHook``s and torch forward hooks) and which submodules are in training mode.

A new fingerprint is part of the graph key; a new structure drops the transformer's graphs and
re-plans its hooked modules (see :mod:`.breaks.hooked_modules`). Hooks that move or re-cast weights per
call (group offloading, layerwise casting, accelerate's offload hooks) and caches keyed on tensor
addresses are refused with :class:`~bcg_diffusion.AccelerationError`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch

from diffusers.hooks._common import _ATTENTION_CLASSES

from . import fingerprint
from ..errors import AccelerationError
from .model_hooks import hooks_of, registry_of
from .python_code import OpaqueCode, class_forward_reassigned, classify_forward, custom_processor

OUR_HOOK_PREFIX = "bcg_"


@dataclass(frozen=True)
class HookRule:
    """How a hooked module is run under a replay.

    ``replay_body``: the module's own kernels (below its hooks) replay a captured sub-graph when
    the hooks call them; otherwise they run eagerly. ``fresh_outputs``: the hook keeps the body's
    outputs across calls, so it gets copies. ``retain_args``: the hook keeps its inputs until later
    in the same call.
    """

    replay_body: bool
    fresh_outputs: bool = False
    retain_args: bool = False


# diffusers 0.42 step-cache hooks: their Python (counters, decisions, kept tensors) runs on every call
# and the block or attention module below them replays. What each keeps was read from its source.
STEP_CACHE_HOOKS: dict[str, HookRule] = {
    "FBCHeadBlockHook": HookRule(True, fresh_outputs=True),  # keeps head_block_output across calls
    "FBCBlockHook": HookRule(True),  # the tail keeps a residual it computes (a new tensor)
    "MagCacheHeadHook": HookRule(True, retain_args=True),  # keeps the head input for the tail
    "MagCacheBlockHook": HookRule(True),
    "TaylorSeerCacheHook": HookRule(True, fresh_outputs=True),  # keeps outputs as Taylor factors
    "PyramidAttentionBroadcastHook": HookRule(True, fresh_outputs=True),  # keeps the attention output
    "FasterCacheBlockHook": HookRule(True, fresh_outputs=True),  # keeps the last two outputs
    "FasterCacheDenoiserHook": HookRule(True, fresh_outputs=True),  # on the transformer itself
}
# Any other hook: the module's body runs eagerly (its hooks may read or change anything).
UNKNOWN_HOOK = HookRule(False, fresh_outputs=True, retain_args=True)
# diffusers' context-parallel hooks run inline, captured with their module: the split is a view of its
# input, and the gather's collective is an eager break of its own (integration/breaks/cp_gather.py). Their
# modules are no hooked modules (integration/parallel.py, integration/cp_support.py).
INLINE_HOOKS = frozenset({"ContextParallelSplitHook", "ContextParallelGatherHook"})

_OFFLOAD = (
    "group offloading moves weights between devices on every call, and a CUDA graph replays fixed "
    "weight addresses. Turn it off (keep the transformer on the GPU) before accelerating; for a transformer "
    "larger than the GPU, load it without group offloading and stream its blocks instead: "
    "BCGConfig(offload=OffloadConfig(slots=2)) (weights at fixed addresses, graphs kept)"
)
_CASTING = (
    "layerwise casting re-casts the weights to the compute dtype on every call (new tensors each "
    "time), which a CUDA graph cannot replay. Load the weights in the compute dtype, or quantize with "
    "torchao (supported), and do not call enable_layerwise_casting"
)
REFUSED_HOOKS: dict[str, str] = {
    "GroupOffloadingHook": _OFFLOAD,
    "LazyPrefetchGroupOffloadingHook": _OFFLOAD,
    "LayerExecutionTrackerHook": _OFFLOAD,
    "LayerwiseCastingHook": _CASTING,
    "PeftInputAutocastDisableHook": _CASTING,
    "TextKVCacheTransformerHook": (
        "TextKVCache keys its cache on the data_ptr() of encoder_hidden_states, which under CUDA graphs is the "
        "same static buffer for every prompt, so prompts would share cached keys. Disable it (disable_cache())"
    ),
    "TextKVCacheBlockHook": "TextKVCache keys its cache on tensor addresses (see TextKVCacheTransformerHook)",
    "SeaCacheRootHook": (
        "SeaCache replaces the decoder stack and reads step values with .item() around the whole forward; "
        "bcg-diffusion cannot replay it exactly. Disable it (disable_cache()) or use FirstBlockCache, MagCache, "
        "TaylorSeer, PyramidAttentionBroadcast or FasterCache"
    ),
    "SeaCacheLeaderBlockHook": "SeaCache cannot be replayed exactly (see SeaCacheRootHook)",
    "SeaCacheBlockHook": "SeaCache cannot be replayed exactly (see SeaCacheRootHook)",
    "SeaCachePostNormHook": "SeaCache cannot be replayed exactly (see SeaCacheRootHook)",
}


@dataclass(frozen=True)
class HookedModule:
    """A submodule whose calls run hooks: each call is a hooked call of the replay."""

    path: str
    hooks: tuple[str, ...]  # hook class names, innermost first; torch hooks as "torch:<kind>"
    rule: HookRule


@dataclass(frozen=True)
class Structure:
    processors: tuple
    hooked: tuple[HookedModule, ...]
    training: tuple[str, ...]
    opaque: tuple[OpaqueCode, ...] = ()  # submodules whose Python the key cannot see (see python_code)

    def describe_difference(self, other: "Structure | None") -> str:
        if other is None:
            return "first call"
        parts = []
        if self.processors != other.processors:
            parts.append("attention processors or their state")
        if self.hooked != other.hooked:
            parts.append("hooks on submodules")
        if self.training != other.training:
            parts.append("submodules in training mode")
        if self.opaque != other.opaque:
            parts.append("replaced forwards or custom processors")
        return ", ".join(parts) or "nothing"


def rule_for(hook_names: tuple[str, ...]) -> HookRule:
    """The rule for a module with these hooks (our own excluded)."""
    rules = [STEP_CACHE_HOOKS.get(name, UNKNOWN_HOOK) for name in hook_names]
    return HookRule(
        replay_body=all(r.replay_body for r in rules),
        fresh_outputs=any(r.fresh_outputs for r in rules),
        retain_args=any(r.retain_args for r in rules),
    )


def refuse_hook(owner: str, hook_class: str) -> None:
    reason = REFUSED_HOOKS.get(hook_class)
    if reason is not None:
        raise AccelerationError(f"{owner} has the diffusers hook {hook_class}: {reason}.")


def diffusers_hook_names(module: torch.nn.Module) -> tuple[str, ...]:
    return tuple(type(h).__name__ for n, h in hooks_of(module) if not n.startswith(OUR_HOOK_PREFIX))


def _torch_hook_kinds(module: torch.nn.Module) -> tuple[str, ...]:
    d = module.__dict__
    kinds = []
    for attr in ("_forward_pre_hooks", "_forward_hooks"):
        if d.get(attr):
            kinds.append(f"torch:{attr.strip('_')}")
    return tuple(kinds)


def check_global_hooks() -> None:
    from torch.nn.modules import module as nn_module

    for attr in ("_global_forward_pre_hooks", "_global_forward_hooks"):
        if getattr(nn_module, attr, None):
            raise AccelerationError(
                f"global torch module hooks are registered (torch.nn.modules.module.{attr}): they run on every "
                "module call, which a CUDA graph replay does not make. Remove them before running an accelerated model."
            )


def _freeze(value: Any, depth: int = 0) -> Any:
    if isinstance(value, (int, float, bool, str, bytes, type(None), enum.Enum, torch.dtype, torch.device)):
        return value
    if isinstance(value, torch.Tensor):
        return ("tensor", value.data_ptr(), value._version, tuple(value.shape), value.dtype)
    if depth < 3 and isinstance(value, (list, tuple)):
        return tuple(_freeze(v, depth + 1) for v in value)
    if depth < 3 and isinstance(value, dict):
        return tuple((k, _freeze(v, depth + 1)) for k, v in value.items())
    return ("id", id(value))


def processor_state(processor: Any, with_attributes: bool = True) -> tuple:
    """Identity, class and (``with_attributes``) the frozen attributes of an attention processor.
    A custom processor runs eagerly on every call (python_code): its attributes are its own state."""
    attributes = vars(processor) if with_attributes and hasattr(processor, "__dict__") else {}
    return (id(processor), type(processor).__qualname__, _freeze(attributes))


def _path(item: tuple) -> str:
    return item[0]


def _base_forward(module: torch.nn.Module, d: dict) -> Any:
    """What ``module`` runs below its diffusers hooks (its own forward, or a replacement)."""
    registry = registry_of(module)
    if registry is not None and registry._fn_refs:
        ref = registry._fn_refs[0]
        return ref.original_forward if ref.original_forward is not None else ref.forward
    return d.get("forward")


class ModelState:
    """The weight fingerprint and the :class:`Structure` of one transformer, cached until
    :meth:`invalidate` (each pipeline call) unless ``every_call``; the forwards assigned to its
    submodules and their classes are compared on every call (:meth:`code_changed`)."""

    def __init__(self, root: torch.nn.Module, every_call: bool, pure_forwards: tuple[str, ...] = ()) -> None:
        self.root = root
        self.every_call = every_call
        self.pure_forwards = pure_forwards
        self._code_token: tuple | None = None
        self.weights = fingerprint.WeightsFingerprint(root, every_call=every_call)
        self._structure: Structure | None = None
        self._epoch = -1
        self._named: list[tuple[str, torch.nn.Module]] = []
        self._dicts: list[tuple[str, dict]] = []
        self._attention: list[tuple[str, torch.nn.Module]] = []
        self._classes: list[type] = []

    def invalidate(self) -> None:
        self.weights.invalidate()
        self._structure = None

    def structure(self) -> Structure:
        """The current structure; raises :class:`AccelerationError` for hooks that cannot replay."""
        if self.every_call or self._structure is None or self._epoch != fingerprint.registration_epoch() or self.code_changed():
            self._structure = self._scan()
            self._code_token = self._read_code_token()
        return self._structure

    def code_changed(self) -> bool:
        """Whether a forward was assigned to a submodule, or a class forward reassigned, since the
        last scan (one identity per module that has an instance forward, one per class)."""
        return self._code_token is not None and self._read_code_token() != self._code_token

    def _read_code_token(self) -> tuple:
        instance = tuple(id(d["forward"]) for _, d in self._dicts if "forward" in d)
        return instance, tuple(id(cls.forward) for cls in self._classes)

    def _modules(self) -> list[tuple[str, torch.nn.Module]]:
        if self._epoch != fingerprint.registration_epoch() or not self._named:
            self._named = list(self.root.named_modules())
            self._dicts = [(n, m.__dict__) for n, m in self._named]
            self._attention = [(n, m) for n, m in self._named if isinstance(m, _ATTENTION_CLASSES)]
            self._classes = list({type(m): None for _, m in self._named})
            self._epoch = fingerprint.registration_epoch()
        return self._named

    def _scan(self) -> Structure:
        check_global_hooks()
        self._modules()
        # one cheap pass over the modules' __dict__s finds the few that carry anything
        flagged = [
            (path, d) for path, d in self._dicts
            if d.get("_diffusers_hook") is not None or d.get("_hf_hook") is not None
            or d.get("_forward_hooks") or d.get("_forward_pre_hooks")
        ]
        hooked = []
        for path, d in flagged:
            module = self.root.get_submodule(path) if path else self.root
            owner = f"{type(self.root).__name__}{'.' + path if path else ''}"
            if d.get("_hf_hook") is not None:
                raise AccelerationError(
                    f"{owner} has accelerate hooks (enable_model_cpu_offload / enable_sequential_cpu_offload / "
                    "device_map): weights move between CPU and GPU per call, which a CUDA graph cannot replay. "
                    "Turn offloading off (keep the transformer on the GPU) before accelerating; for a transformer "
                    "larger than the GPU, stream its blocks instead: BCGConfig(offload=OffloadConfig(slots=2))."
                )
            names = diffusers_hook_names(module)
            for name in names:
                refuse_hook(owner, name)
            kinds = tuple(n for n in names if n not in INLINE_HOOKS) + _torch_hook_kinds(module)
            if path and kinds:  # the transformer's own hooks run outside its graphs, on every call
                hooked.append(HookedModule(path, kinds, rule_for(kinds)))
        training = tuple(sorted(path for path, d in self._dicts if path and d.get("training")))
        processors = tuple(
            (path, processor_state(getattr(module, "processor", None), custom_processor(
                getattr(module, "processor", None), path, self.pure_forwards) is None))
            for path, module in self._attention
        )
        # sorted by path: a block list put back in its parent (unittest.mock.patch.object, as cache-dit
        # does for every call) moves to the end of the parent's children, which changes nothing
        return Structure(tuple(sorted(processors, key=_path)), tuple(sorted(hooked, key=lambda h: h.path)), training,
                         self._opaque_code())

    def _opaque_code(self) -> tuple[OpaqueCode, ...]:
        """Submodules whose forward, class forward or attention processor is opaque Python."""
        found = []
        pure = self.pure_forwards
        for (path, module), (_, d) in zip(self._named, self._dicts):
            if not path:
                continue  # the transformer's own forward is the runner's (forward_chain)
            base = _base_forward(module, d)
            if base is not None:
                opaque = classify_forward(module, base, path, pure)
            else:
                reassigned = class_forward_reassigned(module, pure)
                opaque = OpaqueCode(path, "class forward reassigned", reassigned) if reassigned else None
            if opaque is None and isinstance(module, _ATTENTION_CLASSES):
                opaque = custom_processor(getattr(module, "processor", None), path, pure)
            if opaque is not None:
                found.append(opaque)
        return tuple(sorted(found, key=lambda o: o.path))
