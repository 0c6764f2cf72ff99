"""The benchmarks and measurement commands, one sub-package per job, on a few shared parts.

Commands (each also ``python scripts/<name>.py``):

- :mod:`.step`: the per-step latency benchmark (:mod:`.step.bench_step`, the ``bcg-bench`` command) and its
  parts: cases, the registry of modes, measuring, the whole-pipeline rows, reports, ``--processes``.
- :mod:`.shapes`: what each new shape costs, per mode (:mod:`.shapes.bench_shapes`, on :mod:`.shapes.scenario`).
- :mod:`.zoo`: per-call benchmark of the full-size zoo cases (:mod:`.zoo.zoo_bench`), every diffusers
  transformer class on tiny configs, eager against accelerated (:mod:`.zoo.zoo_probe`), and every diffusers pipeline
  class that runs a transformer, accelerated against an eager twin (:mod:`.zoo.pipeline_probe`).
- :mod:`.cache_dit`: cache-dit under BCG, per image.
- :mod:`.stack`: the speed stack, layer by layer, per image (eager, graphs, + compile, + float8, + step cache).
- :mod:`.profile`: where a capture's time goes (:mod:`.profile.capture_profile`) and compile + BCG set-up with a
  compile cache (:mod:`.profile.compile_cache_check`).

Shared by them (no sub-package imports another's modules):

- :mod:`.timing`, :mod:`.probe`: clocks, summaries, the kernel profile; timing a pipeline's transformer calls.
- :mod:`.trees`: small helpers over nested tensors.
- :mod:`.compile_cache_dirs`: the compile-cache folders of a process and of each first-image mode.
- :mod:`.environment`: the environment of a run and a fresh result path.

What the commands share with ``bcg-generate`` and ``bcg-serve`` is the kit, :mod:`bcg_diffusion.toolkit`.
"""
