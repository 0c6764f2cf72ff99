"""The zoo of diffusers transformer classes: :mod:`.zoo_probe` (every class on tiny configs, eager against
accelerated, ``python scripts/zoo_probe.py``) and :mod:`.zoo_bench` (per-call benchmark of the full-size cases,
``python scripts/zoo_bench.py``); and the zoo of diffusers pipeline classes: :mod:`.pipeline_probe` (every pipeline
class that runs a transformer, accelerated against an eager twin, ``python scripts/pipeline_zoo_probe.py``; its
parts :mod:`.pipeline_calls` and :mod:`.pipeline_report`)."""
