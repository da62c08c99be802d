"""A tiny explicit registry: ``@MODELS.register("sasrec")`` and ``MODELS.get("sasrec")``.

No glob or auto-import: a backbone is registered by the import line in ``bftrec/models/__init__.py``.
An unknown name raises a one-line ``KeyError`` that lists the known names.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> object map with a helpful error for unknown names."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that files the decorated object under ``name``.

        Raises:
            ValueError: ``name`` is already registered.
        """
        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice; pick another name")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        """The object registered as ``name``.

        Raises:
            KeyError: an unknown name (one line listing the known names).
        """
        if name not in self._items:
            raise KeyError(
                f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self._items))}"
            )
        return self._items[name]

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
