#!/usr/bin/env python
"""The probe of every diffusers pipeline class that runs a transformer (docs/pipelines.md); the code is
:mod:`bcg_diffusion.benchmarks.zoo.pipeline_probe`."""

import sys

from bcg_diffusion.benchmarks.zoo.pipeline_probe import main

if __name__ == "__main__":
    sys.exit(main())
