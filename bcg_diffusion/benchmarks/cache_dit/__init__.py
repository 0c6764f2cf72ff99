"""cache-dit under BCG, per image (``python scripts/bench_cache_dit.py``): :mod:`.cache_dit_bench`."""
