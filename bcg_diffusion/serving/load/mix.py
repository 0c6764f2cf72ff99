"""The request mix of a load run: which bodies are sent, in which order, decided by a seed alone."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_PROMPTS", "DEFAULT_SIZES", "MixSpec", "build_mix", "identity"]

DEFAULT_PROMPTS = (
    "a red fox resting in a snowy birch forest at golden hour",
    "a lighthouse on a rocky coast during a storm, dramatic clouds",
    "a bowl of ramen on a wooden table, steam rising, studio light",
    "an astronaut riding a horse across a desert at dawn",
    "a watercolor painting of a quiet harbor town in spring",
    "a close-up portrait of an old fisherman, weathered skin, soft light",
)
#: The default mix, about 512 x 512 pixels each: warm the first three (the server's --warmup), not the last.
DEFAULT_SIZES = ("512x512", "448x576", "576x448", "384x640")


@dataclass(frozen=True)
class MixSpec:
    """What a load run asks for. Each request draws a size, a prompt and a seed (``0 .. seeds - 1``) with
    ``random.Random(mix_seed)``, so the same spec gives the same bodies in the same order, and few
    seeds make equal requests recur (their images must be bitwise equal). ``steps``, ``guidance`` and
    ``negative_prompt`` of ``None`` are left to the server's defaults. ``models`` (ids the server lists in
    ``/v1/models``: the base model, adapters) are drawn per request as its ``model`` field, after its other draws;
    empty: no ``model`` field (the base model), and the same mix as before models existed."""

    sizes: tuple[str, ...] = DEFAULT_SIZES
    prompts: tuple[str, ...] = DEFAULT_PROMPTS
    seeds: int = 4
    n: int = 1
    steps: int | None = None
    guidance: float | None = None
    negative_prompt: str | None = None
    mix_seed: int = 0
    models: tuple[str, ...] = ()

    def __post_init__(self):
        if not self.sizes or not self.prompts:
            raise ValueError("a request mix needs at least one size and one prompt")
        if self.seeds < 1 or self.n < 1:
            raise ValueError(f"seeds and n must be >= 1 (got seeds={self.seeds}, n={self.n})")


def build_mix(spec: MixSpec, count: int) -> list[dict[str, Any]]:
    """``count`` request bodies for ``POST /v1/images/generations``."""
    rng = random.Random(spec.mix_seed)
    bodies = []
    for _ in range(count):
        body: dict[str, Any] = {"prompt": rng.choice(spec.prompts), "size": rng.choice(spec.sizes),
                                "seed": rng.randrange(spec.seeds), "n": spec.n, "response_format": "b64_json"}
        if spec.steps is not None:
            body["num_inference_steps"] = spec.steps
        if spec.guidance is not None:
            body["guidance_scale"] = spec.guidance
        if spec.negative_prompt is not None:
            body["negative_prompt"] = spec.negative_prompt
        if spec.models:
            body["model"] = rng.choice(spec.models)
        bodies.append(body)
    return bodies


def identity(body: dict[str, Any]) -> str:
    """What makes two requests equal: the whole body, keys sorted."""
    return json.dumps(body, sort_keys=True)
