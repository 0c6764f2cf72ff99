"""The ``bcg-generate`` command (``python scripts/generate.py``) and what every command shares.

Modules, one job each:

- :mod:`.generate_args`: its command line: ``main`` (where ``bcg-generate`` starts: it parses before torch is
  imported), the parser, and the arguments checked into a :class:`Plan` before any work.
- :mod:`.generate`: the run: build the pipeline, prepare it, run it, write and summarise the output.
- :mod:`.generate_report`: the summary it prints (sizes, per-step times, BCG statistics, the comparison).
- :mod:`.options`: the model options every command takes (``--model``, ``--size``, ``--device``, ...),
  :class:`~.options.Failure` and the filters of known-harmless library messages; :mod:`.choices`: the option
  choices, importing nothing heavy.
- :mod:`.speedups`: regional ``torch.compile``, the attention backend and diffusers context parallelism.
- :mod:`.cache_option`, :mod:`.quant_option`: the ``--cache SPEC`` and ``--quant NAME`` options.
- :mod:`.timed_run`: one timed ``pipe(...)`` call (per-step times, the size the transformer ran).
- :mod:`.media`: writing images and videos.

Nothing here is imported by ``import bcg_diffusion``; the tools use the library through its public names
only (``bcg_diffusion.__all__``, ``bcg_diffusion.core.__all__``), which ``tests/tools/test_layers.py`` checks.
"""
