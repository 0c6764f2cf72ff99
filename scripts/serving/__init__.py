"""The reference image server (``scripts/serve.py``) and its load generator (``scripts/load.py``).

Modules, one job each:

- :mod:`serving.granularity`: the pixel multiple a request's size must respect, read from the pipeline.
- :mod:`serving.requests`: the request body (pydantic), its validation and the pipeline call it becomes.
- :mod:`serving.worker`: the one thread that runs pipeline work, and the job that generates images.
- :mod:`serving.warmup`: start-up warm-up (``bcg_diffusion.warmup`` where it exists, else 2-step calls).
- :mod:`serving.app`: the FastAPI application (routes, OpenAI-style errors, counters).
- :mod:`serving.listen`: running the app with uvicorn on a bound socket (``--port 0``).
- :mod:`serving.images`: PNG + base64 encoding and the hashes the load test compares.
- :mod:`serving.load_mix`, :mod:`serving.load_run`, :mod:`serving.load_report`, :mod:`serving.spawn`: the load test.

The FastAPI, uvicorn and httpx imports are the ``serve`` extra (``pip install -e ".[serve]"``).
"""
