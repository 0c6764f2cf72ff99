"""The HTTP application of ``bcg-serve``: the OpenAI images API around one :class:`~..state.ServerState`.

- :mod:`.app`: the FastAPI application assembled once (routes, OpenAI-style errors, the API key, trailing slashes).
- :mod:`.routes`: the routes, plain functions of the request (``POST /v1/images/generations``, ``GET /v1/models``,
  ``GET /health``, ``GET /stats``).
- :mod:`.listen`: uvicorn on a socket bound before the build (``--port 0``), the ``listening on URL`` line, the
  open-host warning, the HTTP parser's 400 in the OpenAI format.
- :mod:`.png`: images on the wire (PNG, base64) and the hashes the load tools compare.
"""
