"""The model ids a server serves: its base model and its LoRA adapters, in one :class:`ModelCatalog` made from the
command line. The request planner resolves a request's ``model`` field against it, the routes list it
(``GET /v1/models``) and the adapter bank loads its adapters in its order."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import model_not_found

__all__ = ["ModelCatalog"]


@dataclass(frozen=True)
class ModelCatalog:
    """``base``: the base model's id (``--served-model-name``, else ``--model``); ``adapters``: the adapters' ids
    (``--lora NAME=PATH``), in the command line's order. ``ValueError`` for an adapter id given twice or equal to
    the base model's: requests could not tell them apart."""

    base: str
    adapters: tuple[str, ...] = ()

    def __post_init__(self):
        for name in self.adapters:
            if self.adapters.count(name) > 1:
                raise ValueError(f"--lora {name}: the name is given twice; each adapter needs a name of its own")
            if name == self.base:
                raise ValueError(f"--lora {name}: the name is the base model's ({self.base}); requests could not "
                                 "tell them apart: choose another name")

    def ids(self) -> list[str]:
        """Every id a request's ``model`` may name: the base model's first, then every adapter's."""
        return [self.base, *self.adapters]

    def resolve(self, name: str | None) -> str | None:
        """A request's ``model`` -> the adapter it selects, ``None`` for the base model (absent, or the base model's
        id); a 404 :class:`~.errors.RequestError` (code ``model_not_found``) for an id this server does not serve."""
        if name is None or name == self.base:
            return None
        if name in self.adapters:
            return name
        raise model_not_found(name, self.ids())
