"""The public exceptions and warnings of the diffusers integration (all importable from
:mod:`bcg_diffusion`). The capture core's own (:class:`~bcg_diffusion.core.CudaRuntimeError`,
:class:`~bcg_diffusion.core.BreakOutputMismatchError`) live in :mod:`bcg_diffusion.core`."""


class AccelerationError(RuntimeError):
    """Acceleration cannot be applied as asked; the message says what to change."""


class UnknownTransformerError(TypeError):
    """The transformer class is not one the project knows and the generic path was not allowed."""


class BCGCaptureWarning(RuntimeWarning):
    """A capture failed; the warning names the module and the op, and what now runs eagerly."""


class RankAgreementError(AccelerationError):
    """The ranks of a distributed job could not agree; the message names the ranks involved."""


class RankDisagreementError(RankAgreementError):
    """Ranks gave different values for one round. Raised on every rank (each sees all values), so
    the ranks stay in step and may go on. ``values`` maps each rank to its value."""

    def __init__(self, message: str, name: str, round_index: int, values: dict[int, str]) -> None:
        super().__init__(message)
        self.name = name
        self.round_index = round_index
        self.values = values


class RankOutOfStepError(RankDisagreementError):
    """Ranks are at the same round index under different round names: they do not make the same
    sequence of agreement calls (a bug of the caller). ``values`` maps each rank to its round name."""


class RankAbortedError(RankAgreementError):
    """A rank called :meth:`RankAgreement.abort` (from an exception handler): it will not take part
    in later rounds. Names that rank, where it was and why."""

    def __init__(self, message: str, rank: int, where: str, reason: str) -> None:
        super().__init__(message)
        self.rank = rank
        self.where = where
        self.reason = reason


class RankTimeoutError(RankAgreementError):
    """Some ranks did not answer a round within the timeout. ``missing`` lists them."""

    def __init__(self, message: str, name: str, round_index: int, missing: list[int], timeout_s: float) -> None:
        super().__init__(message)
        self.name = name
        self.round_index = round_index
        self.missing = missing
        self.timeout_s = timeout_s
