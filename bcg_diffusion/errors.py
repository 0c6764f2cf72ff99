"""Errors of the diffusers integration."""


class AccelerationError(RuntimeError):
    """Acceleration cannot be applied as asked; the message says what to change."""
