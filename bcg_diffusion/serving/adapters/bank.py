"""LoRA adapters chosen per request: one hot-swap slot in the transformer, an LRU cache of adapters on the device.

How it works (docs/serving.md, "Adapters (LoRA)"):

- At start every adapter is checked (file, keys, target modules, shapes, rank) and loaded once through
  diffusers into **one** peft adapter of the transformer, the *slot* (:data:`SLOT`), prepared for hot-swap
  at the target rank (``enable_lora_hotswap(target_rank=R)``: every LoRA matrix padded to rank ``R`` with
  zeros, every scaling a 0-dim tensor). After each load the slot's LoRA tensors and scalings are copied out:
  that copy, kept on the CPU, is the adapter from then on.
- Serving adapter ``a`` at scale ``s`` copies ``a``'s tensors into the slot's (``param.data.copy_``: the same
  tensors, so the same addresses, and no version bump) and writes each scaling tensor in place with
  ``s x`` the adapter's own ``alpha / rank``: a captured graph reads the new values on its next replay, so a
  switch costs no capture. ``gpu_slots`` adapters stay on the device (least recently used leaves first);
  the others are copied from the CPU when asked for (a *swap*).
- The base model is the slot **disabled** (``transformer.disable_adapters()``): every LoRA layer then calls its
  base layer alone, the same kernels on the same inputs as a transformer without adapters, so base images are
  bitwise those of a server with no adapters. Disabled and enabled are two graph keys (the adapter state is in
  BCG's weight fingerprint), both captured at warm-up.

Everything that touches the pipeline runs on the worker thread.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import torch

from bcg_diffusion.toolkit.options import Failure

from ..catalog import ModelCatalog
from .options import AdapterPlan, AdapterSpec

logger = logging.getLogger(__name__)

__all__ = ["SLOT", "AdapterBank", "AdapterError", "attach_adapters"]

#: The name of the one peft adapter that holds the adapter being served.
SLOT = "bcg_serving_slot"
_LORA_DOWN = (".lora_A.", ".lora_down.")
_LORA_UP = (".lora_B.", ".lora_up.")


class AdapterError(ValueError):
    """An adapter that cannot be served; the message names it and says what to do."""


@dataclass
class _Adapter:
    """One adapter as served: its rank, its slot image on the CPU (tensors by parameter name) and the
    scaling (``alpha / rank``) of every LoRA layer, as loading it into the slot left them."""

    spec: AdapterSpec
    rank: int
    modules: frozenset
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    scalings: dict[str, float] = field(default_factory=dict)
    requests: int = 0
    swaps: int = 0


@contextlib.contextmanager
def _quiet_diffusers():
    """diffusers warns, for every load, that the text encoders got no LoRA keys (true and expected here)."""
    from diffusers.utils import logging as dlogging

    level = dlogging.get_verbosity()
    dlogging.set_verbosity_error()
    try:
        yield
    finally:
        dlogging.set_verbosity(level)


@dataclass
class _Slot:
    """The hot-swap slot: its LoRA parameters and layers (found once the first adapter is loaded), whose adapter's
    tensors it holds (``live``) at what scale, and whether it is enabled (disabled: the base model)."""

    params: dict[str, torch.nn.Parameter] = field(default_factory=dict)
    layers: dict[str, Any] = field(default_factory=dict)
    live: str | None = None
    live_scale: float | None = None
    enabled: bool = True


class AdapterBank:
    """The adapters of one pipeline's transformer (see the module docstring), those of ``catalog`` in its order.

    ``target_rank``: the hot-swap rank (default: the largest rank among the adapters); ``gpu_slots``: adapters
    kept on the device (default: all); both checked by the command line (``--lora-rank``, ``--lora-gpu-slots``).
    :meth:`load` checks and loads them (:class:`AdapterError` naming the adapter); :meth:`select` sets what the next
    pipeline call serves.
    """

    def __init__(self, pipe, specs: Iterable[AdapterSpec], catalog: ModelCatalog, *, target_rank: int | None = None,
                 gpu_slots: int | None = None):
        self.pipe = pipe
        self.transformer = pipe.transformer
        by_name = {s.name: s for s in specs}
        self.specs = [by_name[name] for name in catalog.adapters]
        self.catalog = catalog
        self.target_rank = target_rank
        self.gpu_slots = gpu_slots if gpu_slots is not None else max(1, len(self.specs))
        self.device = next(self.transformer.parameters()).device
        self._adapters: dict[str, _Adapter] = {}
        self._slot = _Slot()
        self._on_device: collections.OrderedDict[str, dict[str, torch.Tensor]] = collections.OrderedDict()
        self.base_requests = 0
        self.switches = 0
        self._captures_at_ready: int | None = None

    # -- start-up ---------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return list(self.catalog.adapters)

    def load(self) -> None:
        """Check every adapter, then load each into the slot once and keep its image; :class:`AdapterError`
        naming the first adapter that cannot be served. Leaves the slot disabled (the base model)."""
        if not self.specs:
            return
        if not hasattr(self.transformer, "load_lora_adapter") or not hasattr(self.pipe, "load_lora_weights"):
            raise AdapterError(f"--lora: {type(self.pipe).__name__} (transformer {type(self.transformer).__name__}) "
                               "takes no LoRA adapters in diffusers (no load_lora_weights); serve a model whose "
                               "pipeline does, e.g. flux, sd3, sana, qwenimage")
        order = self._slot_order([self._check(spec) for spec in self.specs])
        self.transformer.enable_lora_hotswap(target_rank=self.target_rank)
        for i, adapter in enumerate(order):
            self._load_into_slot(adapter, first=i == 0)
        self._adapters = {s.name: self._adapters[s.name] for s in self.specs}  # the command line's order
        self._slot.live, self._slot.live_scale = order[-1].spec.name, 1.0
        self.transformer.disable_adapters()
        self._slot.enabled = False
        logger.info("adapters: %s (hot-swap rank %d, %d on the device)", ", ".join(self.names), self.target_rank,
                    self.gpu_slots)

    def _slot_order(self, checked: list[_Adapter]) -> list[_Adapter]:
        """The order of loading: the adapter with the most target modules first (its LoRA layers are the slot's);
        sets the hot-swap rank. :class:`AdapterError` for an adapter above the rank or outside the slot's modules."""
        if self.target_rank is None:
            self.target_rank = max(a.rank for a in checked)
        for adapter in checked:
            if adapter.rank > self.target_rank:
                raise AdapterError(f"--lora {adapter.spec.name}: rank {adapter.rank} is above the hot-swap rank "
                                   f"--lora-rank {self.target_rank}; raise --lora-rank to at least {adapter.rank} "
                                   "(or leave it out: the default is the largest rank)")
        first = max(checked, key=lambda a: len(a.modules))
        for adapter in checked:
            outside = sorted(adapter.modules - first.modules)
            if outside:
                raise AdapterError(
                    f"--lora {adapter.spec.name}: targets {len(outside)} module(s) that {first.spec.name} (the adapter "
                    f"with the most target modules, whose layers make the hot-swap slot) does not, e.g. {outside[0]}; "
                    "every adapter's target modules must be among one adapter's")
        return [first] + [a for a in checked if a is not first]

    def _load_into_slot(self, adapter: _Adapter, first: bool) -> None:
        """Load ``adapter`` into the slot through diffusers (hot-swapped after the first) and keep its image."""
        try:
            with _quiet_diffusers(), torch.no_grad():
                self.pipe.load_lora_weights(adapter.spec.path, adapter_name=SLOT, hotswap=not first)
        except Exception as exc:  # noqa: BLE001 - reported with the adapter's name
            raise AdapterError(f"--lora {adapter.spec.name}: diffusers could not load {adapter.spec.path}: "
                               f"{type(exc).__name__}: {exc}") from exc
        if first:
            self._find_slot()
        self._keep_image(adapter)
        self._adapters[adapter.spec.name] = adapter

    def _check(self, spec: AdapterSpec) -> _Adapter:
        """Read one adapter's state dict; :class:`AdapterError` for a missing file, keys outside the transformer,
        modules the transformer lacks, or shapes that do not fit them."""
        state = self._state_dict(spec)
        prefix = f"{getattr(self.pipe, 'transformer_name', 'transformer')}."
        outside = sorted(k for k in state if not k.startswith(prefix))
        if outside:
            raise AdapterError(f"--lora {spec.name}: {len(outside)} key(s) are not the transformer's (e.g. "
                               f"{outside[0]}); the server swaps transformer LoRAs only (no text-encoder LoRA)")
        rank, modules = 0, set()
        for key, tensor in state.items():
            down = any(m in key for m in _LORA_DOWN)
            if not down and not any(m in key for m in _LORA_UP):
                continue  # alphas, DoRA magnitudes: diffusers and peft judge them
            modules.add(self._check_matrix(spec, key[len(prefix):], key, tensor, down))
            if down:
                rank = max(rank, tensor.shape[0])
        if not modules:
            raise AdapterError(f"--lora {spec.name}: {spec.path} holds no LoRA matrices (lora_A/lora_B) for the "
                               "transformer")
        return _Adapter(spec, rank, frozenset(modules))

    def _state_dict(self, spec: AdapterSpec) -> dict[str, torch.Tensor]:
        """The adapter's state dict as diffusers reads it; :class:`AdapterError` for a missing or unreadable file."""
        path = Path(spec.path)
        if not (path.is_file() or (path.is_dir() and any(path.glob("*.safetensors")))):
            what = "is a folder without a .safetensors file" if path.is_dir() else "does not exist"
            raise AdapterError(f"--lora {spec.name}: {spec.path} {what}; give a LoRA .safetensors file (or its folder)")
        try:
            with _quiet_diffusers():
                loaded = self.pipe.lora_state_dict(spec.path)
        except Exception as exc:  # noqa: BLE001
            raise AdapterError(f"--lora {spec.name}: {spec.path} is not a LoRA diffusers can read: "
                               f"{type(exc).__name__}: {exc}") from exc
        return loaded[0] if isinstance(loaded, tuple) else loaded

    def _check_matrix(self, spec: AdapterSpec, name: str, key: str, tensor: torch.Tensor, down: bool) -> str:
        """The module one LoRA matrix (``key``, ``name`` without the transformer's prefix) targets;
        :class:`AdapterError` when the transformer has no such linear layer or the shape does not fit it."""
        module_name = re.split(r"\.lora_(?:A|B|up|down)\.", name)[0]
        try:
            module = self.transformer.get_submodule(module_name)
        except AttributeError:
            raise AdapterError(f"--lora {spec.name}: targets {module_name!r}, which "
                               f"{type(self.transformer).__name__} does not have; is it an adapter for another "
                               "model?") from None
        base = getattr(module, "base_layer", module)
        want = getattr(base, "in_features", None) if down else getattr(base, "out_features", None)
        if want is None:
            raise AdapterError(f"--lora {spec.name}: targets {module_name!r}, a {type(base).__name__}; the server "
                               "swaps LoRA on linear layers only")
        if tensor.dim() != 2 or (tensor.shape[1] if down else tensor.shape[0]) != want:
            side = "input" if down else "output"
            raise AdapterError(f"--lora {spec.name}: {key} has shape {tuple(tensor.shape)}, but {module_name!r} "
                               f"has {want} {side} features; is it an adapter for another model or size?")
        return module_name

    def _find_slot(self) -> None:
        for name, param in self.transformer.named_parameters():
            if f".{SLOT}." in name and ".lora_" in name:
                self._slot.params[name] = param
        for name, module in self.transformer.named_modules():
            scaling = getattr(module, "scaling", None)
            if isinstance(scaling, dict) and SLOT in scaling:
                if not isinstance(scaling[SLOT], torch.Tensor):
                    raise AdapterError("--lora: the hot-swap preparation left a LoRA scaling as a number; this "
                                       "peft version is not supported (peft >= 0.17 makes them tensors)")
                self._slot.layers[name] = module

    def _keep_image(self, adapter: _Adapter) -> None:
        pin = self.device.type == "cuda"
        for name, param in self._slot.params.items():
            kept = param.detach().to("cpu", copy=True)
            adapter.weights[name] = kept.pin_memory() if pin else kept
        adapter.scalings = {name: float(m.scaling[SLOT]) for name, m in self._slot.layers.items()}

    # -- requests ----------------------------------------------------------------------------------
    def select(self, name: str | None, scale: float | None = None, requests: int = 1) -> None:
        """Make the next pipeline calls serve adapter ``name`` at ``scale`` (default 1.0; ``name=None``: the base
        model), for ``requests`` requests (counted). Call it on the worker thread, between pipeline calls."""
        scale = 1.0 if scale is None else float(scale)
        if name is None:
            self.base_requests += requests
            if self._slot.enabled:
                self.transformer.disable_adapters()
                self._slot.enabled = False
            return
        adapter = self._adapters[name]
        adapter.requests += requests
        with torch.no_grad():
            if self._slot.live != name:
                source = self._device_image(adapter)
                for pname, param in self._slot.params.items():
                    param.data.copy_(source[pname], non_blocking=True)  # .data: no version bump, no recapture
                self._slot.live, self._slot.live_scale = name, None
                self.switches += 1
            if self._slot.live_scale != scale:
                for lname, layer in self._slot.layers.items():
                    layer.scaling[SLOT].fill_(scale * adapter.scalings[lname])
                self._slot.live_scale = scale
        if not self._slot.enabled:
            self.transformer.enable_adapters()
            self._slot.enabled = True

    def _device_image(self, adapter: _Adapter) -> dict[str, torch.Tensor]:
        name = adapter.spec.name
        image = self._on_device.get(name)
        if image is not None:
            self._on_device.move_to_end(name)
            return image
        image = {k: v.to(self.device, non_blocking=True) if self.device.type == "cuda" else v.clone()
                 for k, v in adapter.weights.items()}
        adapter.swaps += 1
        self._on_device[name] = image
        while len(self._on_device) > self.gpu_slots:
            self._on_device.popitem(last=False)
        return image

    # -- reporting ---------------------------------------------------------------------------------
    def mark_ready(self, bcg_stats: dict[str, Any] | None) -> None:
        """The warm-up is over: counts start from zero, and captures from here on are counted as after it."""
        self.base_requests = self.switches = 0
        for adapter in self._adapters.values():
            adapter.requests = adapter.swaps = 0
        self._captures_at_ready = _captures(bcg_stats)

    def stats(self, bcg_stats: dict[str, Any] | None = None) -> dict[str, Any]:
        """For ``/stats``: per adapter its requests and swaps (copies from the CPU to the device), switches of the
        slot, base-model requests, and BCG's graph captures at the end of the warm-up and since (``None``
        without BCG): after a warm-up of every size served, ``captures_after_warmup`` stays 0 however requests
        switch adapters."""
        captures = _captures(bcg_stats)
        ready = self._captures_at_ready
        return {"base_model": self.catalog.base, "target_rank": self.target_rank, "gpu_slots": self.gpu_slots,
                "base_requests": self.base_requests, "switches": self.switches,
                "swaps": sum(a.swaps for a in self._adapters.values()), "on_device": list(self._on_device),
                "captures_at_warmup": ready,
                "captures_after_warmup": None if captures is None or ready is None else captures - ready,
                "adapters": {n: {"path": os.fspath(a.spec.path), "rank": a.rank, "requests": a.requests,
                                 "swaps": a.swaps} for n, a in self._adapters.items()}}


def _captures(bcg_stats: dict[str, Any] | None) -> int | None:
    return None if bcg_stats is None else int(bcg_stats.get("captures", 0))


def attach_adapters(pipe, adapters: AdapterPlan, catalog: ModelCatalog, prog: str) -> AdapterBank | None:
    """Load the adapters of ``adapters`` (the specs, ``--lora-rank``, ``--lora-gpu-slots``) into ``pipe``'s transformer
    (before BCG or compile touch it), in the order of ``catalog``; ``None`` without any.
    :class:`~bcg_diffusion.toolkit.options.Failure` (exit code 2) naming the adapter that cannot be served: the
    server stops before it listens."""
    if not adapters.specs:
        return None
    try:
        bank = AdapterBank(pipe, adapters.specs, catalog, target_rank=adapters.rank, gpu_slots=adapters.gpu_slots)
        bank.load()
    except AdapterError as exc:
        raise Failure(2, f"{prog}: error: {exc}") from exc
    return bank
