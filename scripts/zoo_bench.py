#!/usr/bin/env python
"""The per-call benchmark of the full-size zoo cases (docs/benchmarks.md); the code is :mod:`bcg_diffusion.benchmarks.zoo.zoo_bench`."""

import sys

from bcg_diffusion.benchmarks.zoo.zoo_bench import main

if __name__ == "__main__":
    sys.exit(main())
