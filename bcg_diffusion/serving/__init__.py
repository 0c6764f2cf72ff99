"""The ``bcg-serve`` command (an OpenAI images API server, ``python scripts/serve.py``) and the ``bcg-load``
command (its load test, ``python scripts/load.py``).

Modules, one job each:

- :mod:`.server`: the serve command: options, build, speed-ups, warm-up, listen; :mod:`.serve_defaults` the names and
  defaults its parser shows without heavy imports.
- :mod:`.granularity`: the pixel multiple a request's size must respect, read from the pipeline.
- :mod:`.requests`: the request body (pydantic), its validation and the pipeline call it becomes.
- :mod:`.worker`: the one thread that runs pipeline work, and the job that generates images.
- :mod:`.startup_warmup`: the warm-up before listening (``bcg_diffusion.warmup`` where it exists, else 2-step
  calls).
- :mod:`.adapters`: LoRA adapters chosen per request (one hot-swap slot, an LRU of adapters on the device);
  :mod:`.adapter_options` the ``--lora`` options and their start-up; :mod:`.lora_maker` the ``make_loras.py``
  command (random adapters for tests and load runs).
- :mod:`.app`: the FastAPI application (routes, OpenAI-style errors, counters).
- :mod:`.listen`: running the app with uvicorn on a bound socket (``--port 0``).
- :mod:`.png`: PNG + base64 encoding and the hashes the load test compares.
- :mod:`.load_test`: the load command; its parts :mod:`.load_mix` (the request mix), :mod:`.load_run`
  (sending it), :mod:`.load_report` (summaries, the cross-check) and :mod:`.spawn` (servers it starts).
- :mod:`.soak`: the server soak (``python -m bcg_diffusion.serving.soak``): thousands of requests of every kind,
  memory checkpoints, every answer checked; :mod:`.soak_report` its checks and reports.

The FastAPI, uvicorn and httpx imports are the ``serve`` extra (``pip install -e ".[serve]"``); the commands
say so when it is missing instead of failing on import.
"""
