#!/usr/bin/env python
"""The ``bcg-bench-offload`` command: weight streaming under a memory cap (docs/benchmarks.md); the code is :mod:`bcg_diffusion.benchmarks.offload.bench_offload`."""

import sys

from bcg_diffusion.benchmarks.offload.bench_offload import main

if __name__ == "__main__":
    sys.exit(main())
