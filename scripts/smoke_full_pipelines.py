#!/usr/bin/env python
"""The smoke test of every family's full pipeline (docs/pipelines.md); the code is :mod:`bcg_diffusion.checks.smoke_full_pipelines`."""

import sys

from bcg_diffusion.checks.smoke_full_pipelines import main

if __name__ == "__main__":
    sys.exit(main())
