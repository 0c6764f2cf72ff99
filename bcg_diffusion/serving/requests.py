"""The body of ``POST /v1/images/generations``, its validation, and the pipeline call it becomes.

Everything here runs before any pipeline work: a request that fails a check raises
:class:`RequestError` (a 4xx in the OpenAI error format) and never reaches the worker. The body is
checked as bytes (size), as JSON (syntax, nesting depth, text that is not valid Unicode), as fields
(types, unknown names) and as values (limits); what passes is a :class:`GenerationJob`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

import bcg_pipelines as pipelines
from bcg_pipelines.calls import BATCH_KWARGS

from bcg_diffusion.toolkit.sizes import Size

from .catalog import ModelCatalog
from .errors import RequestError, body_too_large

__all__ = [
    "MAX_BODY_BYTES",
    "QUALITIES",
    "STYLES",
    "GenerationJob",
    "ImageRequest",
    "RequestLimits",
    "RequestPlanner",
    "parse_size",
]

SEED_LIMIT = 2**64  # torch.Generator.manual_seed takes 0 <= seed < 2**64
SUPPORTED_RESPONSE_FORMAT = "b64_json"
SUPPORTED_OUTPUT_FORMAT = "png"
#: The OpenAI client's ``quality`` and ``style``: accepted and validated, with no effect on the image (the
#: steps and guidance are ``num_inference_steps`` and ``guidance_scale``).
QUALITIES = ("auto", "standard", "hd", "low", "medium", "high")
STYLES = ("vivid", "natural")
#: Largest request body in bytes (a 413 above): two texts of 4,000 characters, each escaped as \uXXXX, fit 20x.
MAX_BODY_BYTES = 1 << 20
#: Deepest JSON nesting a body may have (the fields are scalars: 1 is the object itself).
MAX_JSON_DEPTH = 16
#: Most digits of an integer in a body (``seed`` takes 20 at most: 2**64 - 1); a longer one is refused unread.
MAX_INTEGER_DIGITS = 40
#: Longest ``model`` and ``user`` (texts that are accepted and ignored).
MAX_NAME_CHARS = 256
#: ``lora_scale`` lies in -MAX_LORA_SCALE .. MAX_LORA_SCALE (it multiplies the adapter's alpha / rank).
MAX_LORA_SCALE = 16.0


class ImageRequest(BaseModel):
    """The JSON body: the OpenAI images API fields plus the diffusion fields.

    Types are strict (``"2"`` is not an integer, ``true`` is not a number) and unknown fields are refused,
    so a misspelt ``num_inference_step`` fails instead of being ignored. ``model`` selects what serves the
    request (absent or the base model's id: the base model; another id the server lists in ``/v1/models``: that
    adapter; any other id: a 404), ``user`` is accepted and ignored (clients send it), ``quality`` and ``style``
    (the OpenAI client's) are checked against their OpenAI values and ignored; ``null`` means the default for
    every optional field (``"size": null`` is ``"auto"``), as the OpenAI API reads it.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: str
    n: int | None = None
    size: str | None = None
    response_format: str | None = None
    output_format: str | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    seed: int | None = None
    negative_prompt: str | None = None
    quality: str | None = None
    style: str | None = None
    model: str | None = None
    user: str | None = None
    lora_scale: float | None = None


@dataclass(frozen=True)
class RequestLimits:
    """What a request may ask for (server options; the granularity comes from the pipeline).

    ``granularity``: height and width must be positive multiples of it; ``max_pixels``: height x width
    at most; ``max_steps``: ``num_inference_steps`` in 1 .. max_steps; ``max_n``: images per request in
    1 .. max_n (1 where the pipeline has no images-per-prompt argument); ``max_prompt_chars``: the length of
    ``prompt`` and of ``negative_prompt``; ``max_body_bytes``: the request body (a 413 above); ``max_side``: the
    largest height or width the model runs at (``None``: unbounded) and ``side_reason`` why (the model's position
    table, or the commands' rule); ``min_steps``: the fewest steps its scheduler takes and ``min_steps_reason`` why
    (:mod:`bcg_diffusion.toolkit.model_limits`).
    """

    granularity: int
    max_pixels: int
    max_steps: int
    max_n: int
    max_prompt_chars: int = 4000
    max_body_bytes: int = MAX_BODY_BYTES
    max_side: int | None = None
    side_reason: str = ""
    min_steps: int = 1
    min_steps_reason: str | None = None


@dataclass(frozen=True)
class GenerationJob:
    """One validated request: what it asked for and the ``pipe(...)`` keyword arguments (no generator).

    ``adapter`` is the adapter (LoRA) id the request's ``model`` field selected, ``None`` for the base model;
    ``adapter_scale`` its scale (``None``: the adapter's default). Both are part of the batch key
    (:func:`.batching.batch_key`): requests for different adapters or scales never share a pipeline call. The
    code that serves adapters applies them around the call; the planner only resolves the id.
    """

    prompt: str
    size: Size
    n: int
    steps: int
    seed: int
    guidance: float | None
    negative_prompt: str | None
    call: dict[str, Any] = field(compare=False)
    adapter: str | None = None
    adapter_scale: float | None = None


def parse_size(text: str, *, param: str = "size") -> Size:
    """``"WxH"`` (width first, as in the OpenAI API) -> :class:`~bcg_diffusion.toolkit.sizes.Size`;
    :class:`RequestError` otherwise. Strict (:meth:`~bcg_diffusion.toolkit.sizes.Size.parse`): a lowercase ``x``, no
    spaces, no sign, no leading zeros (``"256X256"``, ``" 256x256"`` and ``"0256x0256"`` are refused, as a size
    written another way is probably not what was meant)."""
    try:
        return Size.parse(text, param)
    except ValueError as exc:
        raise RequestError(str(exc), param=param) from None


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


class _HugeInteger:
    """A JSON integer of more than :data:`MAX_INTEGER_DIGITS` digits, kept unread (Python refuses to read one of
    more than 4,300 digits, with advice about ``sys.set_int_max_str_digits`` that no API client can act on);
    :func:`_check_json` refuses it, naming its field."""

    def __init__(self, text: str):
        self.digits = len(text.lstrip("-"))


def _parse_int(text: str) -> int | _HugeInteger:
    return _HugeInteger(text) if len(text) > MAX_INTEGER_DIGITS else int(text)


def _check_json(value: Any) -> None:
    """:class:`RequestError` for a decoded JSON value nested deeper than :data:`MAX_JSON_DEPTH`, holding an integer
    of more than :data:`MAX_INTEGER_DIGITS` digits (:class:`_HugeInteger`), or holding a
    text (a key or a string) that is not valid Unicode: a lone UTF-16 surrogate such as ``"\\ud800"``, which
    JSON allows and UTF-8 cannot encode (the tokenizers would fail on it). Iterative: no recursion limit."""
    stack: list[tuple[Any, int, tuple]] = [(value, 1, ())]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, _HugeInteger):
            where = f"{path[0]}" + "".join(f"[{p!r}]" for p in path[1:]) if path else "the body"
            raise RequestError(f"{where} is a whole number of {item.digits} digits, far out of range (seed, the "
                               "largest, is at most 2**64 - 1)", param=str(path[0]) if path else None)
        texts = [item] if isinstance(item, str) else list(item) if isinstance(item, dict) else []
        for text in texts:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                where = f"{path[0]}" + "".join(f"[{p!r}]" for p in path[1:]) if path else "the body"
                what = f"a field name in {where}" if isinstance(item, dict) else where
                raise RequestError(f"{what} holds a lone UTF-16 surrogate ({text[exc.start]!r} at character "
                                   f"{exc.start}), which is not a character; send valid Unicode text",
                                   param=str(path[0]) if path else None) from None
        if not isinstance(item, (dict, list)):
            continue
        if depth > MAX_JSON_DEPTH:
            raise RequestError(f"the request body is JSON nested more than {MAX_JSON_DEPTH} levels deep; the fields of "
                               "a request are plain values")
        children = item.items() if isinstance(item, dict) else enumerate(item)
        stack.extend((child, depth + 1, (*path, key)) for key, child in children)


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object; :class:`RequestError` (400) for an empty body, bad JSON, JSON nested
    deeper than :data:`MAX_JSON_DEPTH`, text that is not valid Unicode, or a non-object."""
    if not raw.strip():
        raise RequestError('the request body is empty; send a JSON object such as {"prompt": "a fox"}')
    try:
        body = json.loads(raw, parse_constant=_reject_constant, parse_int=_parse_int)
    except RecursionError:
        raise RequestError(f"the request body is JSON nested too deeply; the fields of a request are plain values "
                           f"(at most {MAX_JSON_DEPTH} levels are read)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON ({exc}); send a JSON object such as "
                           '{"prompt": "a fox"}') from None
    _check_json(body)
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, not a JSON {type(body).__name__}")
    return body


def _validation_message(exc: ValidationError) -> tuple[str, str | None]:
    """One sentence per pydantic error, and the first field named."""
    accepted = ", ".join(ImageRequest.model_fields)
    parts, first = [], None
    for error in exc.errors():
        name = ".".join(str(p) for p in error["loc"]) or "body"
        first = first or name
        if error["type"] == "missing":
            parts.append(f"'{name}' is required")
        elif error["type"] == "extra_forbidden":
            parts.append(f"unknown field '{name}' (accepted fields: {accepted})")
        else:
            shown = repr(error.get("input"))
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            parts.append(f"'{name}': {error['msg'].lower()} (got {shown})")
    return "; ".join(parts), first


@dataclass
class RequestPlanner:
    """Turns request bodies into :class:`GenerationJob` for one pipeline, checking every limit first.

    ``spec`` is the pipeline's family (``None`` for a checkpoint of no known family) and ``model_size`` its preset,
    ``--size`` tiny or full (the family defaults come from it); ``default_size`` is the image size of a request
    without one. ``resolution_binning=False`` passes ``use_resolution_binning=False`` wherever the pipeline takes it.
    The pipeline itself is only read (its call signature), never called.

    ``catalog`` holds the served model ids: a request's ``model`` field is resolved against it (the base model, an
    adapter, or a 404).
    """

    pipe: Any
    spec: Any
    model_size: str
    limits: RequestLimits
    catalog: ModelCatalog
    default_size: Size
    default_steps: int
    resolution_binning: bool = True

    def __post_init__(self):
        params = pipelines.call_parameters(self.pipe)
        self.takes_batch = any(k in params for k in BATCH_KWARGS)
        self.takes_binning = "use_resolution_binning" in params

    @property
    def model_name(self) -> str:
        """The model in messages: its family, else its pipeline class (a checkpoint of no known family)."""
        return self.spec.name if self.spec is not None else type(self.pipe).__name__

    # -- body -> job ---------------------------------------------------------------------------------
    def parse(self, raw: bytes) -> GenerationJob:
        """Validate a raw request body; :class:`RequestError` (400, or 413 for a body above the limit) for
        anything wrong."""
        if len(raw) > self.limits.max_body_bytes:
            raise body_too_large(self.limits.max_body_bytes)
        body = parse_body(raw)
        try:
            request = ImageRequest.model_validate(body)
        except ValidationError as exc:
            message, param = _validation_message(exc)
            raise RequestError(message, param=param) from None
        return self.job(request)

    def job(self, r: ImageRequest) -> GenerationJob:
        """Check a typed request against the limits and build its pipeline call."""
        self._check_texts(r)
        n, max_n = 1 if r.n is None else r.n, self.max_n
        if not 1 <= n <= max_n:
            why = "" if self.takes_batch else f" ({type(self.pipe).__name__} makes one image per call)"
            raise RequestError(f"n={n} is out of range: 1 .. {max_n}{why}", param="n")
        size = self._size(r.size)
        steps = self._steps(r.num_inference_steps)
        seed = 0 if r.seed is None else r.seed
        if not 0 <= seed < SEED_LIMIT:
            raise RequestError(f"seed={seed} is out of range: 0 .. 2**64 - 1", param="seed")
        if r.guidance_scale is not None and not 0.0 <= r.guidance_scale <= 1e4:
            raise RequestError(f"guidance_scale={r.guidance_scale} is out of range: 0 .. 10000",
                               param="guidance_scale")
        call = self._call(r, size, steps, n)
        adapter = self.catalog.resolve(r.model)
        return GenerationJob(r.prompt, size, n, steps, seed, r.guidance_scale, r.negative_prompt, call,
                             adapter=adapter, adapter_scale=self._adapter_scale(adapter, r.lora_scale))

    def _check_texts(self, r: ImageRequest) -> None:
        """The text fields: prompt not empty, lengths, the OpenAI values of quality, style and the formats."""
        lim = self.limits
        if not r.prompt.strip():
            raise RequestError("prompt must not be empty", param="prompt")
        for name in ("prompt", "negative_prompt"):
            text = getattr(r, name)
            if text is not None and len(text) > lim.max_prompt_chars:
                raise RequestError(f"{name} has {len(text)} characters; at most {lim.max_prompt_chars}", param=name)
        for name in ("model", "user"):
            text = getattr(r, name)
            if text is not None and len(text) > MAX_NAME_CHARS:
                raise RequestError(f"{name} has {len(text)} characters; at most {MAX_NAME_CHARS}", param=name)
        if r.quality not in (None, *QUALITIES):
            raise RequestError(f"quality {r.quality!r} is not one of {', '.join(map(repr, QUALITIES))} (accepted and "
                               "ignored: num_inference_steps sets the work per image)", param="quality")
        if r.style not in (None, *STYLES):
            raise RequestError(f"style {r.style!r} is not one of {', '.join(map(repr, STYLES))} (accepted and "
                               "ignored)", param="style")
        if r.response_format not in (None, SUPPORTED_RESPONSE_FORMAT):
            hint = (" (this server returns images inline and hosts no files)" if r.response_format == "url" else "")
            raise RequestError(f"response_format {r.response_format!r} is not supported{hint}; use "
                               f"'{SUPPORTED_RESPONSE_FORMAT}'", param="response_format")
        if r.output_format not in (None, SUPPORTED_OUTPUT_FORMAT):
            raise RequestError(f"output_format {r.output_format!r} is not supported; this server returns PNG "
                               f"('{SUPPORTED_OUTPUT_FORMAT}')", param="output_format")

    def _steps(self, asked: int | None) -> int:
        """A request's ``num_inference_steps`` (the default where absent), within the limits and what the model's
        scheduler takes."""
        lim = self.limits
        steps = asked if asked is not None else self.default_steps
        if not 1 <= steps <= lim.max_steps:
            raise RequestError(f"num_inference_steps={steps} is out of range: 1 .. {lim.max_steps}",
                               param="num_inference_steps")
        if steps < lim.min_steps:
            raise RequestError(f"num_inference_steps={steps}: this model's scheduler {lim.min_steps_reason}; give "
                               f"{lim.min_steps} or more", param="num_inference_steps")
        return steps

    def _adapter_scale(self, adapter: str | None, scale: float | None) -> float | None:
        """The scale of a request's adapter: ``lora_scale``, 1.0 without one; ``None`` for the base model (where a
        ``lora_scale`` is a 400: it would have no effect)."""
        if adapter is None:
            if scale is not None:
                served = ", ".join(map(repr, self.catalog.adapters)) or "none on this server"
                raise RequestError(f"lora_scale applies to an adapter, and this request gets the base model; give model "
                                   f"as an adapter's id (GET /v1/models; adapters: {served}) or leave lora_scale out",
                                   param="lora_scale")
            return None
        if scale is None:
            return 1.0
        if not -MAX_LORA_SCALE <= scale <= MAX_LORA_SCALE:
            raise RequestError(f"lora_scale={scale} is out of range: -{MAX_LORA_SCALE:g} .. {MAX_LORA_SCALE:g}",
                               param="lora_scale")
        return float(scale)

    def _size(self, text: str | None) -> Size:
        """A request's ``size`` (``WxH``, ``auto`` or none: the default), checked against the limits."""
        lim = self.limits
        if text is None or text == "auto":
            return self.default_size
        size = parse_size(text)
        g = lim.granularity
        if size.width < g or size.height < g or size.width % g or size.height % g:
            raise RequestError(f"size {text!r}: width and height must be positive multiples of {g} "
                               f"(the model's VAE scale factor x patch size), e.g. '{self.default_size}'", param="size")
        if lim.max_side is not None and max(size.width, size.height) > lim.max_side:
            square = min(lim.max_side, math.isqrt(lim.max_pixels))
            square -= square % g
            raise RequestError(f"size {text!r}: {self.model_name} runs at most {lim.max_side} px per side "
                               f"({lim.side_reason}); the largest square size is '{square}x{square}'", param="size")
        if size.pixels > lim.max_pixels:
            raise RequestError(f"size {text!r} has {size.pixels} pixels; this server allows at most "
                               f"{lim.max_pixels} (--max-pixels)", param="size")
        return size

    def _call(self, r: ImageRequest, size: Size, steps: int, n: int) -> dict[str, Any]:
        try:
            call = pipelines.plan_call(self.spec, self.model_size, prompt=r.prompt, height=size.height,
                                       width=size.width, steps=steps, guidance=r.guidance_scale,
                                       negative_prompt=r.negative_prompt)
            call, dropped = pipelines.fit_call(self.pipe, call, batch=n, exact_shape=not self.resolution_binning)
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        guidance_kwarg = self.spec.guidance_kwarg if self.spec is not None else "guidance_scale"
        asked = {("negative_prompt", "negative_prompt"): r.negative_prompt is not None,
                 (guidance_kwarg, "guidance_scale"): r.guidance_scale is not None}
        for (key, param), given in asked.items():
            if given and key in dropped:
                raise RequestError(f"{type(self.pipe).__name__} takes no {key!r}; leave {param} out", param=param)
        ignored = pipelines.ignored_call_fields(self.pipe, call)
        for (key, param), given in asked.items():
            why = ignored.get(key) if given else None
            if why is None:
                continue
            todo = f"leave {param} out"
            if why.setting == guidance_kwarg and why.above is not None and param != "guidance_scale":
                todo = f"give guidance_scale above {why.above:g}, or {todo}"
            raise RequestError(f"{param} has no effect on this model: {why.reason}; {todo}", param=param)
        return call

    # -- start-up ------------------------------------------------------------------------------------
    @property
    def max_n(self) -> int:
        """The most images one request may ask for (``--max-n``; 1 where the pipeline makes one image per call)."""
        return self.limits.max_n if self.takes_batch else 1

    def default_job(self, size: Size, prompt: str = "warm-up", model: str | None = None, n: int = 1) -> GenerationJob:
        """The job of a request that gives only ``prompt`` and ``size`` (and ``model``: an adapter's id; ``n``: its
        images); the warm-up runs such jobs."""
        return self.job(ImageRequest(prompt=prompt, size=str(size), model=model, n=n))
