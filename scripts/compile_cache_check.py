#!/usr/bin/env python
"""regional compile + BCG set-up with a compile cache (docs/benchmarks.md); the code is :mod:`bcg_diffusion.benchmarks.profile.compile_cache_check`."""

import sys

from bcg_diffusion.benchmarks.profile.compile_cache_check import main

if __name__ == "__main__":
    sys.exit(main())
