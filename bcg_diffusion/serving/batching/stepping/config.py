"""The step scheduler's settings (:class:`StepConfig`), its errors and the constants of filler rows."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FILLER_PROMPT", "FILLER_SEED", "POLICIES", "SEED_MODULUS", "STEP_PIPELINES", "StepConfig", "StepError", "row_seeds"]

#: Which running batch takes the next step (:class:`StepConfig.policy`).
POLICIES = ("round_robin", "oldest_first")
#: The diffusers pipelines that have a family loop (``loops.LOOPS``; a test checks that both agree).
STEP_PIPELINES = ("PixArtSigmaPipeline", "SanaPipeline", "StableDiffusion3Pipeline", "FluxPipeline", "WanPipeline")
#: The prompt of the filler rows of a text-encoder call (``encode_rows`` > 1) and of the inert rows of free slots.
FILLER_PROMPT = ""
#: The seed of the inert rows' latents.
FILLER_SEED = 0
SEED_MODULUS = 2**64


class StepError(ValueError):
    """A request the step scheduler cannot run (the message says what to change), or a closed scheduler."""


def row_seeds(seed: int, n: int) -> list[int]:
    """The seeds of a request's ``n`` images: ``seed``, ``seed + 1``, ... modulo 2**64 (as request batching)."""
    return [(seed + i) % SEED_MODULUS for i in range(n)]


@dataclass(frozen=True)
class StepConfig:
    """How the step scheduler runs.

    - ``rows``: slots of every running batch. Every denoising step is one transformer call of ``rows`` rows (times
      the rows classifier-free guidance adds), whatever the batch holds: free slots carry inert filler rows.
    - ``encode_rows``: rows of every text-encoder call: a request's prompt (and negative prompt) encoded with
      ``encode_rows - 1`` filler prompts. ``decode_rows``: rows of every VAE decode call; the images of the requests
      that finish at the same step of one running batch share calls, the rest is filler. With both equal to
      ``rows`` a request alone gives the stock pipeline's image for ``rows`` prompts bitwise (the same shapes
      everywhere); 1 (the default) costs one row of text encoding and decoding per image, and still keeps every
      image independent of its companions (each call has a fixed shape).
    - ``policy``: which running batch takes the next step when several sizes (or adapters) have work:
      ``round_robin`` (each in turn, one step each) or ``oldest_first`` (the batch holding the oldest request,
      waiting or running).
    - ``host_threads``: each request prepared (encoded, its latents drawn, its schedulers set) on a preparing thread
      as soon as it is submitted, and finished (decoded, postprocessed, answered) on a finishing thread, so the thread
      that runs the step boundaries never waits for them and the device always has the next step queued
      (:mod:`.host_work`; the same kernels on the same inputs, ordered by device events: the images are bitwise
      the same). ``False``: both run
      inline on that thread, when the request joins and when its last step is done (every event at a known
      boundary: what the tests of the order of events use).
    - ``switch_interval_s``: with ``host_threads``, the interpreter's thread switch interval while the threads exist
      (``sys.setswitchinterval``, process-wide; put back when the scheduler closes, unless changed meanwhile). The
      boundaries' thread releases the interpreter lock at every graph replay and device wait; a busy worker keeps it
      until the interval ends, so this bounds how long the next step's launches wait after each (Python's default is
      5 ms). ``None``: left as it is.
    - ``host_stream_priority``: with ``host_threads`` on CUDA, the priority of the preparing and finishing threads'
      streams (lower runs first; the steps run on the pipeline thread's stream, priority 0 by default). ``-1``: a
      request's text encoding and its decode run between the kernels of the steps queued meanwhile instead of
      behind them, so it joins and is answered sooner (a closed-loop client sends its next request sooner); the GPU
      work is the same. ``0``: no preference. The images are bitwise the same either way (a priority changes when a
      kernel runs, not what it computes).
    - ``reused_encodings``: under classifier-free guidance, how many negative prompts' encodings a loop keeps and
      reuses (the same negative prompt, the same settings, the same text-encoder weights: :mod:`.text_reuse`), so a
      request whose negative prompt was seen before encodes its prompt only. Bitwise the same images (the same text
      always gives the same encoder call); ``0``: every request encodes its negative prompt.
    """

    rows: int = 8
    encode_rows: int = 1
    decode_rows: int = 1
    policy: str = "round_robin"
    host_threads: bool = True
    switch_interval_s: float | None = 0.001
    host_stream_priority: int = -1
    reused_encodings: int = 8

    def __post_init__(self):
        if self.switch_interval_s is not None and not 0 < self.switch_interval_s <= 1:
            raise ValueError(f"switch_interval_s must be in (0, 1] seconds or None (got {self.switch_interval_s})")
        if self.reused_encodings < 0:
            raise ValueError(f"reused_encodings must be >= 0 (got {self.reused_encodings})")
        if min(self.rows, self.encode_rows, self.decode_rows) < 1:
            raise ValueError(f"rows, encode_rows and decode_rows must be >= 1 (got {self})")
        if self.policy not in POLICIES:
            raise ValueError(f"policy {self.policy!r} is not one of {', '.join(POLICIES)}")
