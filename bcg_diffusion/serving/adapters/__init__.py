"""LoRA adapters chosen per request by its ``model`` field (``--lora NAME=PATH``).

- :mod:`.bank`: the adapters of one transformer: one hot-swap slot, an LRU of adapters on the device, ``/stats``.
- :mod:`.options`: ``--lora``, ``--lora-rank``, ``--lora-gpu-slots`` (checked once with the command line) and the
  adapters loaded at start-up.
- :mod:`.lora_maker`: the ``scripts/make_loras.py`` command (random adapters for tests and load runs).
"""
