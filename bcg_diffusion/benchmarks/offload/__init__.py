"""``bcg-bench-offload``: one transformer streamed under a device memory cap, against the same model resident and
against diffusers' group offloading with streams (docs/benchmarks.md "Weight streaming")."""
