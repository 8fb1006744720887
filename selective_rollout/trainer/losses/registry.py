"""A registry of one kind of loss component (policy loss, aggregation, KL estimator).

An entry is a small pydantic model class whose fields are the parameters it owns, with their
defaults, constraints and descriptions: config validation and the configuration reference read
them off the class, and an instance is the entry bound to its values. Entries register
themselves with ``@REGISTRY.register("name")``, so a new one is one new class, not a branch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from pydantic import BaseModel, ConfigDict


class Entry(BaseModel):
    """Base of every registered component: its fields are its parameters, fixed once bound."""

    model_config = ConfigDict(extra="forbid", frozen=True)


E = TypeVar("E", bound=Entry)


class Registry(Generic[E]):
    """Entries of one kind by name; ``kind`` words the errors ("unknown KL estimator 'k2'")."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.entries: dict[str, type[E]] = {}

    def register(self, name: str) -> Callable[[type[E]], type[E]]:
        """Class decorator adding the entry under ``name``; a name is registered once."""

        def wrap(cls: type[E]) -> type[E]:
            if name in self.entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self.entries[name] = cls
            return cls

        return wrap

    def get(self, name: str) -> type[E]:
        """The entry class under ``name``, or a ``ValueError`` naming the known ones."""
        try:
            return self.entries[name]
        except KeyError:
            known = ", ".join(sorted(self.entries))
            raise ValueError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def build(self, name: str, source: object) -> E:
        """Entry ``name`` bound to its parameters, each read by name off ``source`` (the trainer config)."""
        cls = self.get(name)
        return cls.model_validate({key: getattr(source, key) for key in cls.model_fields})
