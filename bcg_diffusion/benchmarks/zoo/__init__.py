"""The zoo of diffusers transformer classes: :mod:`.zoo_probe` (every class on tiny configs, eager against
accelerated, ``python scripts/zoo_probe.py``) and :mod:`.zoo_bench` (per-call benchmark of the full-size cases,
``python scripts/zoo_bench.py``)."""
