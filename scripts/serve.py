#!/usr/bin/env python
"""The ``bcg-serve`` command: the OpenAI images API server (docs/serving.md); the code is :mod:`bcg_diffusion.serving.serve_command`."""

import sys

from bcg_diffusion.serving.serve_command import main

if __name__ == "__main__":
    sys.exit(main())
