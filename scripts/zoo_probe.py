#!/usr/bin/env python
"""The probe of every diffusers transformer class on tiny configs (docs/accelerate.md); the code is :mod:`bcg_diffusion.benchmarks.zoo.zoo_probe`."""

import sys

from bcg_diffusion.benchmarks.zoo.zoo_probe import main

if __name__ == "__main__":
    sys.exit(main())
