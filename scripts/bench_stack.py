#!/usr/bin/env python
"""The speed stack, layer by layer, per image (docs/benchmarks.md "The speed stack"); the code is
:mod:`bcg_diffusion.benchmarks.stack.stack_bench`."""

import sys

from bcg_diffusion.benchmarks.stack.stack_bench import main

if __name__ == "__main__":
    sys.exit(main())
