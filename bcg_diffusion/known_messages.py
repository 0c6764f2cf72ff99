"""Library messages that tell a user of this project nothing they can act on, dropped where they are logged.

Importing diffusers imports transformers' image processors and, where torchao is installed (the ``test`` and
``quant`` extras), torchao; each prints warnings on every run that read as failures. :func:`quiet_known_messages`
puts one filter on each emitting logger that drops exactly the messages of :data:`KNOWN_MESSAGES`, under their
condition; every other message of those loggers still shows, and nothing else is touched (no handler, level or
``warnings`` filter changes). ``import bcg_diffusion`` calls it, so it is in place before diffusers is imported
through the library or the commands; ``bcg_pipelines`` imports nothing of ``bcg_diffusion``, so a script that uses it
alone imports ``bcg_diffusion`` first (docs/pipelines.md). It imports nothing itself.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Callable

__all__ = ["KNOWN_MESSAGES", "KnownMessage", "quiet_known_messages"]


def _torch_without_cuda() -> bool:
    """The CPU build of torch is loaded (``torch.version.cuda`` is ``None``)."""
    torch = sys.modules.get("torch")
    return torch is not None and getattr(torch.version, "cuda", "") is None


def _logged_from_torchao() -> bool:
    """The message is being logged from code of the torchao package (somewhere up the call stack)."""
    frame = sys._getframe(1)
    while frame is not None:
        if "/torchao/" in frame.f_code.co_filename.replace("\\", "/"):
            return True
        frame = frame.f_back
    return False


@dataclass(frozen=True)
class KnownMessage:
    """A message ``logger`` logs: dropped when its text contains every one of ``needles`` and ``condition()``
    holds (``None``: always). ``why`` says why it is harmless here."""

    logger: str
    needles: tuple[str, ...]
    why: str
    condition: Callable[[], bool] | None = None

    def matches(self, message: str) -> bool:
        return all(n in message for n in self.needles) and (self.condition is None or self.condition())


#: The known-harmless messages, by the logger that logs them.
KNOWN_MESSAGES: tuple[KnownMessage, ...] = (
    KnownMessage(
        "transformers.utils.import_utils", ("requires torchvision (not installed); falling back to",),
        "diffusers' pipelines import transformers' image processors (for IP-adapter images, which nothing here "
        "uses); without torchvision they fall back to their PIL versions"),
    KnownMessage(
        "torchao", ("Failed to load ", "/torchao/_C"),
        "with the CPU build of torch, torchao's compiled CUDA kernels (MX float8, CUTLASS SM90a) cannot load: they "
        "link libc10_cuda.so, which that build does not ship; nothing on a CPU could run them",
        _torch_without_cuda),
    KnownMessage(
        "torch.utils._pytree", ("is an Enum subclass and is now natively supported by torch.compile",),
        "torchao registers its Enum types with torch's pytree at import, which torch >= 2.13 calls deprecated "
        "(a note to torchao's authors)", _logged_from_torchao),
    KnownMessage(
        "torchao.kernel.intmm", ("Detected no triton",),
        "with the CPU build of torch there is no Triton, and torchao's Triton int8 matmul kernels serve only CUDA "
        "devices; nothing on a CPU could run them", _torch_without_cuda),
    KnownMessage(
        "diffusers.quantizers.torchao.torchao_quantizer", ("Unable to import `torchao` Tensor objects",),
        "diffusers' torchao quantizer misses tensor classes that torchao 0.18 moved; they matter only to loading "
        "checkpoints saved quantized by torchao (--quant quantizes after the build)"),
)


class _DropKnown(logging.Filter):
    def __init__(self, known: list[KnownMessage]):
        super().__init__()
        self.known = known

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(k.matches(message) for k in self.known)


def quiet_known_messages() -> None:
    """Put the filter of :data:`KNOWN_MESSAGES` on each of their loggers; calling it again adds nothing."""
    by_logger: dict[str, list[KnownMessage]] = {}
    for known in KNOWN_MESSAGES:
        by_logger.setdefault(known.logger, []).append(known)
    for name, known in by_logger.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropKnown) for f in logger.filters):
            logger.addFilter(_DropKnown(known))
