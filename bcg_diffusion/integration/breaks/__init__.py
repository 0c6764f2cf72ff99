"""The kinds of eager break, one module each, each with its install function and a removable handle.

What runs eagerly between (or around) the segments of a transformer's graphs:

- :mod:`.attention`: the attention kernels (diffusers' ``dispatch_attention_fn``, torch's
  ``scaled_dot_product_attention``), process-wide and shared;
- :mod:`.eager_functions`: functions of the transformer's own module that its family names;
- :mod:`.eager_modules`: submodules and methods, named in ``BCGConfig.eager_modules`` or narrowed to
  after a failed capture (:mod:`.narrowing` chooses them);
- :mod:`.hooked_modules`: modules with hooks (step caches): their hooks run on every call, their body replays;
- :mod:`.units`: module mode's unit calls, for the duration of one transformer call;
- :mod:`.cp_gather`: diffusers' context-parallel output gather.

Every patch is one :func:`~bcg_diffusion.core.handles.patch_attribute` (shared ones through
:mod:`.shared`), undone exactly by its handle.
"""
