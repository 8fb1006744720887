"""The error type that leaves this package for callers in other processes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class GameError(RuntimeError):
    """A game the engine cannot load, reset or step (a corrupt or hand-edited game file).

    It carries text only. The engine's own exceptions come from the PDDL parser and the
    planner, and unpickling some of them in another process imports a planner module that
    parses that process's command line and exits it; so an error leaves the engine as this.
    """


@contextmanager
def as_game_error(what: str) -> Iterator[None]:
    """Turn whatever a text engine raises while it does ``what`` into a ``GameError``."""
    try:
        yield
    except GameError:
        raise
    except Exception as exc:  # the engines raise parser, planner and KeyError types alike
        raise GameError(f"the engine failed to {what}: {type(exc).__name__}: {exc}") from None
