"""One module per model family; each defines ``SPEC``, a :class:`pipelines.registry.FamilySpec`."""
