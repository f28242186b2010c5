"""One small registry, used for the prior kinds (:mod:`fvlib.priors`), the model families
(:mod:`fvlib.families`) and the theory strategies (:mod:`fvlib.theory.strategies`): a name to
an entry, in the order of registration, with errors that name the bad value and the names
registered. Adding a kind is one ``register_...`` line in the module of its concept.
"""

from __future__ import annotations

from typing import Generic, TypeVar

__all__ = ["Registry"]

Entry = TypeVar("Entry")


class Registry(Generic[Entry]):
    """Entries by name. ``what`` names an entry in messages (``"prior kind"``); ``field`` is
    the setting that names one (``"prior"``, as in ``TrainConfig.prior``)."""

    def __init__(self, what: str, field: str):
        self.what, self.field = what, field
        self._entries: dict[str, Entry] = {}

    def add(self, name: str, entry: Entry) -> Entry:
        """Register ``entry`` under ``name``; ``ValueError`` if ``name`` is taken or not a non-empty string."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.what}'s name must be a non-empty string, got {name!r}")
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> None:
        """Remove the entry ``name`` (``ValueError`` if it is not registered)."""
        self.get(name)
        del self._entries[name]

    def names(self) -> tuple[str, ...]:
        """The registered names, in the order they were registered."""
        return tuple(self._entries)

    def get(self, name: str) -> Entry:
        """The entry ``name``; ``ValueError`` naming ``name`` and the registered names."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise ValueError(f"{self.field} must be one of {self.names()}, got {name!r}") from None

    def entries(self) -> tuple[Entry, ...]:
        """The registered entries, in the order they were registered."""
        return tuple(self._entries.values())
