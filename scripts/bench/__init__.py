"""The parts of ``scripts/bench_step.py``, one job each.

- :mod:`bench.cases`: what to measure (case syntax, matrices, shards).
- :mod:`bench.modes`: how a transformer call is run in each mode (a registry: add a mode there).
- :mod:`bench.measure`: one case's step inputs, set-up and interleaved timing of its modes.
- :mod:`bench.rows`: whole-pipeline rows of a case, such as end to end (a registry: add a row there).
- :mod:`bench.timing`: clocks, summaries, the kernel profile.
- :mod:`bench.trees`: small helpers over nested tensors.
- :mod:`bench.report`, :mod:`bench.chart`, :mod:`bench.merge`: result files, the chart, merging files.
"""
