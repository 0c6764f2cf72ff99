"""The base of a family's denoising loop split for the step scheduler: prepare, step, finish.

A family loop (:class:`FamilyLoop`, one subclass per pipeline family) does what the family's diffusers pipeline
does in its ``__call__``, in three parts the scheduler drives:

- **prepare** (:meth:`FamilyLoop.prepare`), once per request: its prompt encoded (with filler prompts up to
  ``encode_rows``), its latents drawn from its own generators (image ``i`` from ``seed + i``), and per image its
  own scheduler instance with its own timestep schedule. Nothing here depends on other requests. A negative prompt
  encoded before is reused (:mod:`.text_reuse`).
- **step** (:meth:`FamilyLoop.predict`, then :meth:`FamilyLoop.advance` per row), once per step of a running
  batch: one transformer call over every slot (each row with its own timestep, its conditioning and, where the
  family embeds it, its guidance), classifier-free guidance combined per row with the row's own scale as the
  pipeline combines it, then each row's own scheduler ``step`` on its row (multistep schedulers keep their history
  per image).
- **finish** (:meth:`FamilyLoop.decode`, :meth:`FamilyLoop.postprocess`), once per finished image: the VAE decode
  at ``decode_rows`` rows, the pipeline's postprocessing.

Every call of every model has a fixed shape and no kernel mixes rows, so a row's values depend on that row alone:
a request's images do not depend on what joined or left its batch (the reproducibility rule).

The loop works on its own pipeline (``bcg_diffusion.pipeline_for_thread``): the server's models, shared, with its own
tokenizers and scheduler. Its preparing thread encodes while the server's worker may run a whole pipeline call (a
size above ``--batch-work-limit``, the warm-up's checks) with the server's pipeline, and two threads on one fast
tokenizer can encode a prompt at the wrong length (docs/accelerate.md "Threads").
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch

import bcg_pipelines as pipelines
from bcg_diffusion import pipeline_for_thread

from .config import FILLER_PROMPT, FILLER_SEED, StepConfig, StepError, row_seeds
from .rows import Plan, Row, RunningBatch
from .step_clock import recorded_event
from .text_reuse import ReusedEncodings, text_encoders

__all__ = ["DevicePacer", "FamilyLoop", "call_defaults", "check_servable", "prime_step_index"]

#: Call keys every loop honours: the prompt, the step count, the output type; ``return_dict`` has no effect here.
COMMON_KEYS = frozenset({"prompt", "num_inference_steps", "output_type", "return_dict"})
OUTPUT_TYPES = ("pil", "np", "pt", "latent")


def call_defaults(pipe) -> dict[str, Any]:
    """The keyword arguments of the pipeline's own ``__call__`` with their defaults (``None`` where none)."""
    params = pipelines.call_parameters(pipe)
    return {name: (None if p.default is p.empty else p.default) for name, p in params.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name != "self"}


def _same(value: Any, default: Any) -> bool:
    try:
        return value is default or bool(value == default)
    except Exception:  # noqa: BLE001 - a tensor or array compares elementwise: not the default
        return False


def check_servable(pipe) -> None:
    """:class:`StepError` for a pipeline the step scheduler cannot split: model CPU offload (models move per call)
    or a step cache on the transformer (diffusers' cache hooks, cache-dit), which decides per call for every row at
    once, so a row would depend on its companions."""
    if getattr(pipe, "_all_hooks", None):
        raise StepError(f"{type(pipe).__name__} has model CPU offload enabled; step batching keeps the models on the "
                        "device: call pipe.remove_all_hooks() and pipe.to(device) first")
    transformer = getattr(pipe, "transformer", None)
    if getattr(transformer, "_is_cached", False):
        raise StepError("the transformer has a cache-dit step cache, which decides per call for all rows at once; "
                        "step batching needs rows that do not depend on each other: disable the cache")
    for module in transformer.modules() if transformer is not None else ():
        registry = module.__dict__.get("_diffusers_hook")
        for name, hook in getattr(registry, "hooks", {}).items():
            if type(hook).__module__.startswith("diffusers.hooks"):
                raise StepError(f"the transformer has diffusers' hook {name!r} ({type(hook).__name__}); step caches and "
                                "offloading decide per call for all rows at once: remove it for step batching")


def prime_step_index(scheduler, timesteps: torch.Tensor) -> None:
    """Find the scheduler's step index now, with the timestep its first ``step`` gets and the scheduler's own lookup
    (diffusers' ``_init_step_index``, which reads the device with ``.item()``): while the request is prepared rather
    than inside a step boundary. The same index as the first step would find; nothing for a scheduler without it."""
    init = getattr(scheduler, "_init_step_index", None)
    if init is not None and getattr(scheduler, "step_index", 0) is None and len(timesteps):
        init(timesteps[0])


class DevicePacer:
    """Keeps the host at most ``ahead`` steps ahead of the device: :meth:`queued` after each step records an event
    on the device's stream (``make_event``; CUDA events on a CUDA device, nothing elsewhere, where every call is
    synchronous) and waits for the one recorded ``ahead`` steps before."""

    def __init__(self, device: torch.device, ahead: int = 1, make_event: Callable[[], Any] | None = None):
        if make_event is None and device.type == "cuda":
            make_event = lambda: recorded_event(device)  # noqa: E731
        self.ahead, self._make = ahead, make_event
        self._queued: list = []

    def queued(self) -> None:
        if self._make is None:
            return
        self._queued.append(self._make())
        while len(self._queued) > self.ahead:
            self._queued.pop(0).synchronize()


class FamilyLoop:
    """One family's denoising loop in prepare / step / finish parts (see the module's docstring).

    Subclasses name their diffusers pipeline classes (``pipeline_names``), the call keys they honour besides
    :data:`COMMON_KEYS` (``honoured``; any other key must keep the pipeline's default), and implement
    :meth:`resolve`, :meth:`key`, :meth:`encode` (and :attr:`uncond_args`), :meth:`initial_latents`,
    :meth:`schedule`, :meth:`predict`, :meth:`decode` and :meth:`postprocess`.
    """

    pipeline_names: tuple[str, ...] = ()
    honoured: frozenset[str] = frozenset()
    #: The keyword that sets images per prompt.
    count_key = "num_images_per_prompt"
    #: What a negative prompt's encoding reads besides the text encoders (:meth:`uncond_key`).
    uncond_args: tuple[str, ...] = ("negative_prompt", "max_sequence_length")

    def __init__(self, pipe, config: StepConfig):
        check_servable(pipe)
        self.pipe, self.config = pipeline_for_thread(pipe), config
        self.defaults = call_defaults(pipe)
        self.device = pipe._execution_device
        self.generator_device = "cuda" if self.device.type == "cuda" else "cpu"
        self.pacer = DevicePacer(self.device)
        #: Every row's scheduler is a copy of this one, made once from the pipeline's scheduler's config.
        self.scheduler_template = type(pipe.scheduler).from_config(pipe.scheduler.config)
        #: Negative prompts' encodings, reused (:mod:`.text_reuse`; ``StepConfig.reused_encodings`` of them).
        self.unconds = ReusedEncodings(lambda: text_encoders(self.pipe), config.reused_encodings)

    # -- per request ------------------------------------------------------------------------------------------
    def plan(self, call: dict[str, Any]) -> Plan:
        """``call`` (the stock pipeline's keyword arguments, no generator) checked and resolved; :class:`StepError`
        for what this loop does not do."""
        args = self.settings(call)
        self.resolve(args)
        return Plan(self.key(args), args[self.count_key], args)

    def settings(self, call: dict[str, Any]) -> dict[str, Any]:
        """The pipeline's defaults with ``call`` put in, after checking every key."""
        name = type(self.pipe).__name__
        for key, value in call.items():
            if key not in self.defaults:
                raise StepError(f"{name} takes no {key!r}")
            if key not in COMMON_KEYS | self.honoured | {self.count_key} and not _same(value, self.defaults[key]):
                raise StepError(f"step batching does not support {key!r} for {name}: leave it out (or run this "
                                "request without step batching)")
        args = {**self.defaults, **call}
        if not isinstance(args["prompt"], str):
            raise StepError("step batching takes one prompt (a string) per request; n images come from "
                            f"{self.count_key}")
        if args[self.count_key] is None or not 1 <= args[self.count_key] <= self.config.rows:
            raise StepError(f"{self.count_key}={args[self.count_key]} does not fit a running batch of "
                            f"{self.config.rows} rows")
        if args["output_type"] not in OUTPUT_TYPES:
            raise StepError(f"output_type {args['output_type']!r} is not one of {', '.join(OUTPUT_TYPES)}")
        return args

    @torch.no_grad()
    def prepare(self, plan: Plan, seed: int) -> list[Row]:
        """The rows of a request: its prompt encoded, its latents drawn, a scheduler per image."""
        generators = [torch.Generator(self.generator_device).manual_seed(s) for s in row_seeds(seed, plan.n)]
        cond, uncond = self.encoded(plan.args)
        latents = self.initial_latents(plan.args, generators, cond)
        return [self._row(plan.args, cond, uncond, latents[i:i + 1], generators[i]) for i in range(plan.n)]

    @torch.no_grad()
    def filler(self, plan: Plan) -> Row:
        """The inert row of ``plan``'s key: the filler prompt, latents of :data:`FILLER_SEED`, never stepped (it
        keeps its first timestep)."""
        args = {**plan.args, "prompt": FILLER_PROMPT, "negative_prompt": FILLER_PROMPT}
        cond, uncond = self.encoded(args)
        latents = self.initial_latents(args, [torch.Generator(self.generator_device).manual_seed(FILLER_SEED)], cond)
        row = self._row(args, cond, uncond, latents, None)
        return Row(row.cond, row.uncond, row.latents, guidance=row.guidance, fixed_t=row.timesteps[0])

    def encoded(self, args: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
        """:meth:`encode`, with the unconditional half reused where the same negative prompt was encoded before
        under the same settings and text-encoder weights (:mod:`.text_reuse`): then only the prompt is encoded."""
        if not args["cfg"]:
            return self.encode(args)
        key, reused = self.unconds.lookup(self.uncond_key(args))
        if reused is not None:
            return self.encode(args, with_uncond=False)[0], reused
        cond, uncond = self.encode(args)
        self.unconds.store(key, uncond)
        return cond, uncond

    def uncond_key(self, args: dict[str, Any]) -> tuple:
        """What the unconditional encoding of ``args`` depends on besides the text encoders' weights: the values of
        :attr:`uncond_args`."""
        return tuple(args[name] for name in self.uncond_args)

    def _row(self, args, cond, uncond, latents, generator) -> Row:
        scheduler = copy.deepcopy(self.scheduler_template)
        timesteps = self.schedule(scheduler, args, latents)
        prime_step_index(scheduler, timesteps)
        return Row(cond, uncond, latents, scheduler, timesteps, guidance=self.guidance(args), generator=generator,
                   step_kwargs=self.step_kwargs(scheduler, generator, args))

    def encode_texts(self, text: str | None) -> list[str]:
        """``text`` and the filler prompts of one text-encoder call (``encode_rows`` rows); no text (a negative
        prompt left out) is the empty prompt, as the pipelines read it."""
        return ["" if text is None else text] + [FILLER_PROMPT] * (self.config.encode_rows - 1)

    @staticmethod
    def first(tensor: torch.Tensor | None) -> torch.Tensor | None:
        """Row 0 of an encoder output (the request's), as a tensor of its own."""
        return None if tensor is None else tensor[:1].clone()

    def guidance(self, args: dict[str, Any]) -> float:
        """The scale that combines this row's two predictions (1.0 where the family has no second one)."""
        return float(args.get("guidance_scale") or 1.0)

    def step_kwargs(self, scheduler, generator, args: dict[str, Any]) -> dict[str, Any]:
        """Extra keyword arguments of the scheduler's ``step`` (the pipeline's own, per row)."""
        return {}

    # -- per step ---------------------------------------------------------------------------------------------
    @staticmethod
    def batch_latents(rows: list[Row]) -> torch.Tensor:
        return torch.cat([r.latents for r in rows])

    @staticmethod
    def batch_timesteps(rows: list[Row]) -> torch.Tensor:
        """One timestep per row (the pipelines broadcast one value to every row instead)."""
        return torch.stack([r.t for r in rows])

    @staticmethod
    def joined(rows: list[Row], part: str, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """The ``part`` (``cond`` or ``uncond``) tensors of every row, concatenated along the batch."""
        return {name: torch.cat([getattr(r, part)[name] for r in rows]) for name in names}

    @classmethod
    def text_inputs(cls, rows: list[Row], names: tuple[str, ...], cfg: bool) -> dict[str, torch.Tensor]:
        """The rows' text tensors ``names`` for one transformer call: the conditional rows, or with ``cfg`` the
        unconditional rows followed by the conditional ones (the pipelines' ``torch.cat([uncond, cond])``)."""
        cond = cls.joined(rows, "cond", names)
        if not cfg:
            return cond
        uncond = cls.joined(rows, "uncond", names)
        return {name: torch.cat([uncond[name], cond[name]]) for name in names}

    @staticmethod
    def guided(batch: RunningBatch, uncond: torch.Tensor, cond: torch.Tensor,
               after: Callable[[torch.Tensor], torch.Tensor] | None = None) -> list[torch.Tensor | None]:
        """Per occupied slot ``u + g * (c - u)`` with the row's own scale, as the pipelines write it."""
        preds: list[torch.Tensor | None] = [None] * len(batch.slots)
        for i in batch.active():
            u, c = uncond[i:i + 1], cond[i:i + 1]
            pred = u + batch.slots[i].guidance * (c - u)
            preds[i] = pred if after is None else after(pred)
        return preds

    @staticmethod
    def unguided(batch: RunningBatch, out: torch.Tensor,
                 after: Callable[[torch.Tensor], torch.Tensor] | None = None) -> list[torch.Tensor | None]:
        preds: list[torch.Tensor | None] = [None] * len(batch.slots)
        for i in batch.active():
            preds[i] = out[i:i + 1] if after is None else after(out[i:i + 1])
        return preds

    @torch.no_grad()
    def advance(self, row: Row, pred: torch.Tensor) -> None:
        """The row's own scheduler step on its own latents."""
        row.latents = row.scheduler.step(pred, row.t, row.latents, **row.step_kwargs, return_dict=False)[0]
        row.index += 1

    def end_step(self) -> None:
        """What the pipeline does at the end of a call (its hooks reset; under BCG the weights and the model's
        structure are re-read before the next call, so an adapter switched between two steps is seen). On CUDA,
        wait until the previous step is done on the device: the host runs at most one step ahead, so the device
        always has the next step queued, and a request that arrives joins within two steps."""
        self.pipe.maybe_free_model_hooks()
        self.pacer.queued()

    # -- finish -----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def decoded(self, plan: Plan, latents: torch.Tensor) -> torch.Tensor:
        """Finished rows of ``plan``'s key (at most ``decode_rows``) decoded in one call of ``decode_rows`` rows
        (zero latents fill the rest); the decoded rows of ``latents``."""
        real = latents.shape[0]
        if real < self.config.decode_rows:
            latents = torch.cat([latents, latents.new_zeros((self.config.decode_rows - real, *latents.shape[1:]))])
        return self.decode(plan.args, latents)[:real]

    @torch.no_grad()
    def images(self, plan: Plan, decoded: torch.Tensor) -> list[Any]:
        """A request's images from its decoded rows (its latents for ``output_type="latent"``), one entry per row."""
        if plan.args["output_type"] == "latent":
            return list(decoded.split(1))
        return self.postprocess(plan.args, decoded)

    # -- the family's parts -----------------------------------------------------------------------------------
    def resolve(self, args: dict[str, Any]) -> None:
        raise NotImplementedError

    def key(self, args: dict[str, Any]) -> tuple:
        raise NotImplementedError

    def encode(self, args: dict[str, Any], with_uncond: bool = True
               ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
        """The prompt's encoding and, under classifier-free guidance (``args["cfg"]``) unless ``with_uncond`` is
        false, the negative prompt's (else ``None``); the prompt's encoding does not depend on ``with_uncond``."""
        raise NotImplementedError

    def initial_latents(self, args: dict[str, Any], generators: list, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def schedule(self, scheduler, args: dict[str, Any], latents: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def predict(self, batch: RunningBatch) -> list[torch.Tensor | None]:
        raise NotImplementedError

    def decode(self, args: dict[str, Any], latents: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def postprocess(self, args: dict[str, Any], decoded: torch.Tensor) -> list[Any]:
        images = self.pipe.image_processor.postprocess(decoded, output_type=args["output_type"])
        return list(images)
