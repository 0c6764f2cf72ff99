"""Boxing of tuple results so that copy-back can write every element in place."""

from __future__ import annotations

from typing import Any


class _BCGBoxedTupleOutput:
    """A tuple turned into an object with one attribute per element (``item_0``, ``item_1``, ...).

    The copy-back of an eager break writes each attribute in place, so the tensors that the next
    segment was captured against stay the same objects. :meth:`astuple` unboxes.
    """

    __slots__ = ("_items", "_tuple_type")

    def __init__(self, items: tuple) -> None:
        if not isinstance(items, tuple):
            raise TypeError(f"_BCGBoxedTupleOutput boxes tuples, got {type(items).__name__}")
        self._items = list(items)
        self._tuple_type = type(items)

    def __len__(self) -> int:
        return len(self._items)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("item_"):
            try:
                return self._items[int(name[5:])]
            except (ValueError, IndexError):
                pass
        raise AttributeError(name)

    def items(self) -> list:
        """The boxed elements, in order (the list itself: copy-back writes through it)."""
        return self._items

    def astuple(self) -> tuple:
        """The elements as a tuple of the original tuple type (namedtuples stay namedtuples)."""
        if self._tuple_type is tuple:
            return tuple(self._items)
        try:
            return self._tuple_type(*self._items)
        except TypeError:
            return self._tuple_type(self._items)

    def __repr__(self) -> str:
        return f"_BCGBoxedTupleOutput({len(self._items)} items)"


def box_tuple(value: Any) -> Any:
    """Box ``value`` if it is a tuple; return anything else unchanged."""
    return _BCGBoxedTupleOutput(value) if isinstance(value, tuple) else value


def unbox_tuple(value: Any) -> Any:
    """Inverse of :func:`box_tuple`."""
    return value.astuple() if isinstance(value, _BCGBoxedTupleOutput) else value
