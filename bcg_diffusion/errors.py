"""Errors of the diffusers integration."""


class AccelerationError(RuntimeError):
    """Acceleration cannot be applied as asked; the message says what to change."""


CONTEXT_PARALLEL_REFUSAL = (
    "{name} has diffusers parallelism enabled (enable_parallelism): BCG does not replay context- or "
    "tensor-parallel transformers yet (their split and gather hooks and the collectives in attention are not "
    "captured in lockstep across ranks; see docs/multi-gpu.md). Run it without accelerate_pipeline, or on one GPU "
    "without enable_parallelism."
)
