"""The error type that leaves this package for callers in other processes."""

from __future__ import annotations


class GameError(RuntimeError):
    """A game the engine cannot load, reset or step (a corrupt or hand-edited game file).

    It carries text only. The engine's own exceptions come from the PDDL parser and the
    planner, and unpickling some of them in another process imports a planner module that
    parses that process's command line and exits it; so an error leaves the engine as this.
    """
