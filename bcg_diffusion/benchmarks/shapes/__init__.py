"""What each new shape costs, per mode (``python scripts/bench_shapes.py``): :mod:`.bench_shapes` the command,
:mod:`.scenario` the scenario it runs (serving several resolutions in turn)."""
