"""The parts of ``scripts/bench_step.py``, one job each.

- :mod:`bench.cases`: what to measure (case syntax, matrices, shards).
- :mod:`bench.modes`: how a transformer call is run in each mode (a registry: add a mode there).
- :mod:`bench.measure`: one case's step inputs, set-up and interleaved timing of its modes.
- :mod:`bench.rows`: the registry of whole-pipeline rows; the rows themselves: :mod:`bench.first_image`
  (time to the first image), :mod:`bench.e2e_row` (eager vs BCG end to end), :mod:`bench.cache_row`
  (step caches), on :mod:`bench.row_base` (what a row is).
- :mod:`bench.parallel`: context-parallel cases (launch check, ranks, the slowest rank).
- :mod:`bench.processes`, :mod:`bench.across`: ``--processes K`` and its medians, spreads and verdicts.
- :mod:`bench.compile_cache`: the compile-cache folders of a process and of each first-image mode.
- :mod:`bench.timing`, :mod:`bench.probe`: clocks, summaries, the kernel profile; timing a pipeline's
  transformer calls.
- :mod:`bench.trees`: small helpers over nested tensors.
- :mod:`bench.report`, :mod:`bench.chart`, :mod:`bench.merge`: result files, the chart, merging files.
- :mod:`bench.shapes`: the new-shapes scenario of ``scripts/bench_shapes.py``.
"""
