#!/usr/bin/env python
"""Random LoRA adapters for serving tests and load runs (docs/serving.md "Adapters (LoRA)"); the code is
:mod:`bcg_diffusion.serving.adapters.lora_maker`."""

import sys

from bcg_diffusion.serving.adapters.lora_maker import main

if __name__ == "__main__":
    sys.exit(main())
