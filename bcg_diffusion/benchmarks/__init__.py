"""The benchmarks and measurement commands, and their parts, one job each.

Commands (each also ``python scripts/<name>.py``):

- :mod:`.bench_step`: the per-step latency benchmark (the ``bcg-bench`` command).
- :mod:`.bench_shapes`: what each new shape costs, per mode.
- :mod:`.zoo_bench`: per-call benchmark of the full-size zoo cases; :mod:`.zoo_probe`: every diffusers
  transformer class on tiny configs, eager against accelerated.
- :mod:`.capture_profile`: where a capture's time goes; :mod:`.compile_cache_check`: compile + BCG set-up with
  a compile cache; :mod:`.smoke_full_pipelines`: every family's full pipeline built and run.

Parts of the per-step benchmark:

- :mod:`.cases`: what to measure (case syntax, matrices, shards).
- :mod:`.modes`: how a transformer call is run in each mode (a registry: add a mode there).
- :mod:`.measure`: one case's step inputs, set-up and interleaved timing of its modes.
- :mod:`.rows`: the registry of whole-pipeline rows; the rows themselves: :mod:`.first_image`
  (time to the first image), :mod:`.e2e_row` (eager vs BCG end to end), :mod:`.cache_row`
  (step caches), on :mod:`.row_base` (what a row is) and :mod:`.seeded_images` (seeded ``pipe(...)`` calls).
- :mod:`.parallel`: context-parallel cases (launch check, ranks, the slowest rank).
- :mod:`.processes`, :mod:`.across`: ``--processes K`` and its medians, spreads and verdicts.
- :mod:`.compile_cache_dirs`: the compile-cache folders of a process and of each first-image mode.
- :mod:`.timing`, :mod:`.probe`: clocks, summaries, the kernel profile; timing a pipeline's
  transformer calls.
- :mod:`.trees`: small helpers over nested tensors.
- :mod:`.report`, :mod:`.chart`, :mod:`.merge`: result files, the chart, merging files.
- :mod:`.shapes`: the new-shapes scenario of :mod:`.bench_shapes`.
"""
