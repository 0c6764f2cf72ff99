"""``bcg-serve --replicas N``: the single server's application as replicas on Ray Serve (the ``ray`` extra).

- :mod:`.options`: the replica options (``--replicas``, autoscaling, GPUs per replica), no Ray.
- :mod:`.state`: a replica's options checked and its server built by the single server's start-up, no Ray.
- :mod:`.ray_app`: the deployment (one replica: one pipeline) and ``build_app`` for ``serve run`` configs.
- :mod:`.ray_run`: ``--replicas``: a local Ray instance, Ray's proxy on ``--host``, the stop.

Only :mod:`.ray_app` and :mod:`.ray_run` import Ray.
"""
