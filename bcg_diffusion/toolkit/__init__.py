"""The kit every command stands on (``bcg-generate``, ``bcg-serve``, the benchmarks, the checks): what they share,
one job per module, importing no command.

- :mod:`.choices`: option choices and limits, importing nothing heavy (the parsers read them before torch).
- :mod:`.options`: the model options (``--model``, ``--size``, ``--device``, ...), their checks and :class:`~.options.Failure`.
- :mod:`.sizes`: ``WxH`` sizes read once into :class:`~.sizes.Size`, and the largest side a family runs at.
- :mod:`.speedups`: regional ``torch.compile``, the attention backend and diffusers context parallelism.
- :mod:`.cache_spec`: a ``--cache`` value read once into a :class:`~.cache_spec.CacheSpec`;
  :mod:`.cache_recipes`: the registry of step-cache recipes; :mod:`.cache_option`: a cache on a built pipeline.
- :mod:`.quant_option`: ``--quant NAME`` (torchao).
- :mod:`.stack_options`: the speed stack on the command line (``--quant``, ``--cache``, ``--compile``,
  ``--compile-cache``, ``--attention-backend``), one parser for ``bcg-generate`` and ``bcg-serve``, read into a
  :class:`~.stack_options.StackOptions`; :mod:`.stack`: that stack applied to a built pipeline, layer by layer.
- :mod:`.timed_run`: one timed ``pipe(...)`` call (per-step times, the size the transformer ran).
- :mod:`.media`: writing images and videos; :mod:`.files`: checking that a file or folder can be written, writing a
  file whole or not at all.
- :mod:`.numbers`: ``finite_float`` (the type of every float option) and whole numbers.
- :mod:`.name_lists`: ``name_list``, the type of every comma-separated name option (``--families``,
  ``--scenarios``).
- :mod:`.model_limits`: the largest side and the fewest steps a model takes, read from its configs.
- :mod:`.failed_calls`: a failed call's error handed on without its traceback (whose frames hold the call's tensors).
- :mod:`.listening`: what the library says while a case runs (runner events, warnings, problems), for the
  zoo probe and the planting harness.
- :mod:`.provenance`: the commit a result was made at (``BENCH_GIT_COMMIT`` where set, else git's), for the
  benchmarks' and the checks' reports.

The kit uses the library through its public names only, and no command's modules
(``tests/tools/test_layers.py`` checks both).
"""
