#!/usr/bin/env python
"""The ``bcg-load`` command: the server's load test (docs/serving.md); the code is :mod:`bcg_diffusion.serving.load.command`."""

import sys

from bcg_diffusion.serving.load.command import main

if __name__ == "__main__":
    sys.exit(main())
