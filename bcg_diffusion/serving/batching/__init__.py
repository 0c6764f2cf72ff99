"""Batching (``--max-batch ROWS``): requests that can share pipeline work run together without changing any image.

- :mod:`.request_batching`: request batching (``--batching request``): the batch key, the fixed padded shape
  (:class:`~.request_batching.BatchShapes`), the batcher thread that forms batches, its stats.
- :mod:`.step_batching`: step batching (``--batching step``): the step batcher on the server's worker thread, its
  warm-up.
- :mod:`.stepping`: the step scheduler (no HTTP): requests join and leave a running batch at every denoising step.
"""
