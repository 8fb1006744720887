"""The one way a pluggable entry (a gate, a rollout strategy, an environment) joins its registry.

Each kind keeps its own table (``GATES``, ``STRATEGIES``, ``ENVS``) and base ``Params`` model;
this module only checks and adds an entry, so every kind refuses a duplicate name or a ``Params``
of the wrong base in the same words, and a new kind needs no new decorator code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel

C = TypeVar("C", bound=type[Any])


def registrar(
    table: dict[str, Any],
    kind: str,
    params_base: type[BaseModel],
    check: Callable[[str, Any], None] | None = None,
) -> Callable[[str], Callable[[C], C]]:
    """A decorator factory ``register(name)`` adding a class to ``table`` under ``name`` (and
    setting its ``name``). ``check(name, cls)`` adds the kind's own refusals (raise TypeError)."""

    def register(name: str) -> Callable[[C], C]:
        def deco(cls: C) -> C:
            if name in table:
                raise ValueError(f"{kind} {name!r} is registered twice")
            if not issubclass(cls.Params, params_base):
                raise TypeError(f"{kind} {name!r}: Params must subclass {params_base.__name__}")
            if check is not None:
                check(name, cls)
            cls.name = name
            table[name] = cls
            return cls

        return deco

    return register
