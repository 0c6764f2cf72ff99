#!/usr/bin/env python
"""The ``bcg-bench`` command: the per-step latency benchmark (docs/benchmarks.md); the code is :mod:`bcg_diffusion.benchmarks.step.bench_step`."""

import sys

from bcg_diffusion.benchmarks.step.bench_step import main

if __name__ == "__main__":
    sys.exit(main())
