#!/usr/bin/env python
"""The new-shapes benchmark (docs/benchmarks.md); the code is :mod:`bcg_diffusion.benchmarks.shapes.bench_shapes`."""

import sys

from bcg_diffusion.benchmarks.shapes.bench_shapes import main

if __name__ == "__main__":
    sys.exit(main())
