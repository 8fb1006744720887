"""Rollout strategies: which groups are started, stopped early, and kept for training.

They are selectable per run so that arms are compared inside one system on one task stream
(DESIGN.md 1, issue 5): ``none`` trains on every finished group; ``dapo`` drops zero-variance
groups after running them in full (DAPO dynamic sampling); ``preskip`` skips tasks whose recent
groups were all zero-variance (GRESO-style, with exploration); ``selective`` stops converged groups
mid-trajectory with the gate; ``selective+dapo`` does both. A new strategy is one class with
``@register_strategy``.
"""

from __future__ import annotations

import random
from collections import defaultdict, deque
from collections.abc import Callable
from typing import ClassVar


class Strategy:
    """Answers three questions for the coordinator; the default is the ungated baseline."""

    name: ClassVar[str] = "none"
    uses_gate: ClassVar[bool] = False
    filters_zero_variance: ClassVar[bool] = False

    def admit(self, task_id: str) -> bool:
        """Start a group for this task now? (False = skip it before rollout.)"""
        return True

    def observe(self, task_id: str, zero_variance: bool | None) -> None:
        """Learn from a group's outcome (None when unknown, e.g. cut unaudited)."""

    def keep(self, zero_variance: bool) -> bool:
        """Keep a fully rolled-out group for training?"""
        return not (self.filters_zero_variance and zero_variance)


STRATEGIES: dict[str, Callable[..., Strategy]] = {}


def register_strategy(cls: type[Strategy]) -> type[Strategy]:
    STRATEGIES[cls.name] = cls
    return cls


@register_strategy
class NoFilter(Strategy):
    name = "none"


@register_strategy
class DapoFilter(Strategy):
    """Roll everything out, then drop zero-variance groups; the coordinator over-samples."""

    name = "dapo"
    filters_zero_variance = True


@register_strategy
class Selective(Strategy):
    """Stop converged groups mid-trajectory (the gate); keep every group that finishes."""

    name = "selective"
    uses_gate = True


@register_strategy
class SelectiveDapo(Strategy):
    """The gate, then DAPO's filter on what the gate let through."""

    name = "selective+dapo"
    uses_gate = True
    filters_zero_variance = True


@register_strategy
class PreSkip(Strategy):
    """Skip a task when its last ``window`` groups were all zero-variance, except with
    probability ``explore`` (GRESO-style pre-rollout skipping: cheap, blind to this rollout)."""

    name = "preskip"

    def __init__(self, window: int = 1, explore: float = 0.1, seed: int = 0) -> None:
        if window < 1:
            raise ValueError(f"preskip window must be >= 1, got {window}")
        if not 0.0 <= explore <= 1.0:
            raise ValueError(f"preskip explore must be in [0, 1], got {explore}")
        self.window, self.explore = window, explore
        self._rng = random.Random(seed)
        self._history: dict[str, deque[bool]] = defaultdict(lambda: deque(maxlen=window))

    def admit(self, task_id: str) -> bool:
        recent = self._history[task_id]
        if len(recent) < self.window or not all(recent):
            return True
        return self._rng.random() < self.explore

    def observe(self, task_id: str, zero_variance: bool | None) -> None:
        if zero_variance is not None:
            self._history[task_id].append(zero_variance)


def build_strategy(name: str, **params: object) -> Strategy:
    try:
        factory = STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; registered: {', '.join(sorted(STRATEGIES))}") from None
    return factory(**params) if name == "preskip" else factory()
