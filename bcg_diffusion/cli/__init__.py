"""The ``bcg-generate`` command (``python scripts/generate.py``), one job per module, each importing only the
ones listed after it and the kit (:mod:`bcg_diffusion.toolkit`):

- :mod:`.generate`: where the command starts: ``main`` parses the arguments before torch is imported, then
  hands over to :mod:`.run`.
- :mod:`.run`: the run: build the pipeline, prepare it, run it, write and summarise the output.
- :mod:`.report`: the summary it prints (sizes, per-step times, BCG statistics, the comparison).
- :mod:`.plan`: the arguments checked into a :class:`~.plan.Plan` before any work.
- :mod:`.args`: the parser, importing nothing heavy.

Nothing here is imported by ``import bcg_diffusion``, and no other command imports it.
"""
