#!/usr/bin/env python
"""cache-dit under BCG per image (docs/benchmarks.md "cache-dit"); the code is :mod:`bcg_diffusion.benchmarks.cache_dit.cache_dit_bench`."""

import sys

from bcg_diffusion.benchmarks.cache_dit.cache_dit_bench import main

if __name__ == "__main__":
    sys.exit(main())
