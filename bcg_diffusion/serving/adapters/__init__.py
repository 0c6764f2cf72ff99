"""LoRA adapters chosen per request by its ``model`` field (``--lora NAME=PATH``).

- :mod:`.options`: ``--lora``, ``--lora-rank``, ``--lora-gpu-slots``, checked once with the command line into the
  adapters' plan.
- :mod:`.bank`: the adapters of one transformer, loaded at start-up from that plan: one hot-swap slot, an LRU of
  adapters on the device, ``/stats``.
- :mod:`.lora_maker`: the ``scripts/make_loras.py`` command (random adapters for tests and load runs).
"""
