"""The server's parts, each built once from the :class:`~..server_plan.ServerPlan` by one function, in the order
:func:`~..server_build.build_server` calls them; what a part makes is a value the next parts read.

- :mod:`.model`: the pipeline built (random weights of a family, or a checkpoint) and what the model says about its
  requests (:class:`~.model.BuiltModel`); the compile cache opened before anything compiles.
- :mod:`.speed`: the speed stack on it: quantization, streaming, the LoRA adapters, the attention backend, the step
  cache, compile, BCG (:class:`~.speed.SpedUp`).
- :mod:`.batching`: whether and how requests are batched, and the batcher (:class:`~.batching.Batching`).
- :mod:`.planner`: the request planner, its limits and defaults.
- :mod:`.warm`: the warm-up before listening, then the compile cache saved.
- :mod:`.report`: the lines that say what was built, and the server's description in ``/stats``.
"""
