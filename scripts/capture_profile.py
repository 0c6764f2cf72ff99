#!/usr/bin/env python
"""where a capture's time goes, and the first image (docs/benchmarks.md); the code is :mod:`bcg_diffusion.benchmarks.profile.capture_profile`."""

import sys

from bcg_diffusion.benchmarks.profile.capture_profile import main

if __name__ == "__main__":
    sys.exit(main())
