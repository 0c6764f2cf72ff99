"""Correctness checks of the library against eager twins (tools, not part of the library).

- :mod:`.planting`: plants work a graph cannot hold or must not bake in at seeded sites of the zoo's
  models and checks each planted model against an eager twin with the same plant
  (``python -m bcg_diffusion.checks.planting --seed S --plants N --out DIR``).
- :mod:`.capture_failures`: a capture made to fail N times in a row in one process while other keys replay,
  every output checked against an eager twin (``python -m bcg_diffusion.checks.capture_failures``).
- :mod:`.compile_order`: whether torch.compile's first compile in an eager call or inside BCG's first accelerated
  call changes the bits (each order in a child process, every output against every other).
- :mod:`.shared_transformer`: one accelerated transformer shared by two pipelines in two threads, under CPU and GPU
  contention, every result against eager with the runner events around a difference;
  :mod:`.shared_transformer_controls`: its conditions one at a time, against the process's first eager call.
- :mod:`.smoke_full_pipelines`: every family's FULL pipeline (random weights) built and run on a GPU
  (``python scripts/smoke_full_pipelines.py``).
"""
