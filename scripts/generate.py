#!/usr/bin/env python
"""The ``bcg-generate`` command: generate an image or a video (docs/generate.md); the code is :mod:`bcg_diffusion.cli`."""

import sys

from bcg_diffusion.cli.generate import main

if __name__ == "__main__":
    sys.exit(main())
