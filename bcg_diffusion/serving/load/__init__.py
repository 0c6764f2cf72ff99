"""The load and benchmark tools of the server: they drive ``bcg-serve`` processes on 127.0.0.1 over HTTP.

- :mod:`.command`: the ``bcg-load`` command (``scripts/load.py``): one or two servers, a bounded load, the report.
- :mod:`.mix`: the request mix; :mod:`.run`: sending it (closed or open loop); :mod:`.report`: summaries, the
  cross-check of two servers, the printed table.
- :mod:`.spawn`: servers started for a run (``--spawn``), always stopped.
- :mod:`.soak`: the server soak (``python -m bcg_diffusion.serving.load.soak``): thousands of requests of every kind,
  memory checkpoints, every answer checked; :mod:`.soak_report` its checks and reports.
- :mod:`.fault_rules`: fault rules (``KIND:PROMPT``) installed through the server's fault seam
  (:mod:`bcg_diffusion.serving.faults`); :mod:`.fault_server`: ``bcg-serve`` started with them.
- :mod:`.batching_bench`: the request batching benchmark (issue 35); :mod:`.step_bench`: the step batching benchmark
  (issue 46), :mod:`.step_bench_report` its verdicts and Markdown report.
"""
