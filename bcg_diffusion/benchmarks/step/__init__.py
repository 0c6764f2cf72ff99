"""The per-step latency benchmark (``bcg-bench``, ``python scripts/bench_step.py``) and its parts.

- :mod:`.bench_step`: the command.
- :mod:`.cases`: what to measure (case syntax, matrices, shards).
- :mod:`.modes`: how a transformer call is run in each mode (a registry: add a mode there).
- :mod:`.measure`: one case's step inputs, set-up and interleaved timing of its modes.
- :mod:`.rows`: the registry of whole-pipeline rows; the rows: :mod:`.first_image`, :mod:`.e2e_row`,
  :mod:`.cache_row`, on :mod:`.row_base` and :mod:`.seeded_images`.
- :mod:`.parallel`: context-parallel cases (launch check, ranks, the slowest rank).
- :mod:`.processes`, :mod:`.across`: ``--processes K`` and its medians, spreads and verdicts.
- :mod:`.report`, :mod:`.chart`, :mod:`.merge`: result files, the chart, merging files.
"""
