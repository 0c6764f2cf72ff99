"""Capture and compile set-up costs: :mod:`.capture_profile` (where a capture's time goes, ``python
scripts/capture_profile.py``) and :mod:`.compile_cache_check` (compile + BCG set-up with a compile cache, ``python
scripts/compile_cache_check.py``)."""
