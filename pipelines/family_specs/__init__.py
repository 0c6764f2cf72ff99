"""One module per model family; each defines ``SPEC``, a :class:`bcg_pipelines.registry.FamilySpec`."""
