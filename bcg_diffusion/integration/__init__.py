"""The diffusers integration: how a transformer's calls are keyed, captured and replayed.

Built on :mod:`bcg_diffusion.core`; the public API (:mod:`bcg_diffusion.accelerate`) builds on it.
Nothing here imports the API modules above it (only the leaf definitions ``config``, ``errors``
and ``families``). See docs/capture-core.md for the map of modules.
"""
