"""The ``bcg-serve`` command (an OpenAI images API server, ``python scripts/serve.py``) and the ``bcg-load``
command (its load test, ``python scripts/load.py``).

A request's way: body -> :class:`~.requests.GenerationJob` (:mod:`.requests`) -> :meth:`.state.ServerState.submit`
-> a :class:`~.calls.Batch` (alone, or formed by :mod:`.batching`) -> its :class:`~.calls.PipelineCall` ->
:class:`~.runner.CallRunner` on the worker thread (:mod:`.worker`). The warm-up takes the same way.

Modules, one job each:

- :mod:`.serve_command`: the command's entry (one process, or ``--replicas``); :mod:`.command_line` its options;
  :mod:`.serve_defaults` the names and defaults its parser shows without heavy imports; :mod:`.server` the
  one-process start; :mod:`.server_plan` the command line read once into a plan (:mod:`.model_checks`: what the
  model's family cannot do); :mod:`.server_build` the server assembled once from the plan, part after part
  (:mod:`.assembly`).
- :mod:`.catalog`: the served model ids (base model and adapters).
- :mod:`.requests`: the request body (pydantic), its validation and the job it becomes; :mod:`.errors` the errors a
  request gets; :mod:`.granularity` the pixel multiple a size must respect.
- :mod:`.calls`: a job's way to the pipeline as values (batch, pipeline call, result); :mod:`.runner` runs the calls;
  :mod:`.worker` is the one thread they run on; :mod:`.state` the running server.
- :mod:`.startup_warmup`: what the warm-up before listening warms, and its calls (run by :mod:`.assembly.warm`).
- :mod:`.faults`: the seam through which tests inject faults into pipeline calls.

Subpackages, one job each: :mod:`.assembly` (the server's parts, built once from the plan: model, speed stack,
batching, planner, warm-up, report), :mod:`.http` (the application, its routes, listening), :mod:`.batching` (request
and step batching), :mod:`.adapters` (LoRA adapters), :mod:`.replicas` (Ray Serve replicas), :mod:`.load` (the load
test, the soak, the benchmarks, fault rules).

The FastAPI, uvicorn and httpx imports are the ``serve`` extra (``pip install -e ".[serve]"``); the commands
say so when it is missing instead of failing on import.
"""
