"""Rollout strategies: which groups are started, stopped early, and kept for training.

They are selectable per run so that arms are compared inside one system on one task stream:
``none`` trains on every finished group; ``dapo`` drops zero-variance groups after running them
in full (DAPO dynamic sampling); ``preskip`` skips tasks whose recent groups were all
zero-variance (GRESO-style, with exploration); ``selective`` stops converged groups mid-trajectory
with the gate; ``selective+dapo`` does both.

A new strategy is one class and, if it has parameters, a ``Params`` model next to it, plus one line
in ``selective_rollout/plugins.py`` (or an entry point of the group "selective_rollout.strategies"
in a package of yours): the parameters become flat keys of the ``rollout`` section (name them after
the strategy, ``preskip_window``, since the section has keys of its own). This module imports
nothing heavy, so config validation reads a strategy's ``Params`` without importing the
coordinator.
"""

from __future__ import annotations

import random
from collections import defaultdict, deque
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from selective_rollout.registry import Registry

# every strategy by name (lines of selective_rollout.plugins, entry points of the group
# "selective_rollout.strategies", or a class named by its path)
STRATEGIES: Registry = Registry(
    "strategy",
    "selective_rollout.strategies",
    base=f"{__name__}:Strategy",
    params_base=f"{__name__}:StrategyParams",
    catalog="selective_rollout.plugins:STRATEGY_CATALOG",
)


class StrategyParams(BaseModel):
    """Base of a strategy's parameters (none by default)."""

    model_config = ConfigDict(extra="forbid")


class Strategy:
    """Answers three questions for the coordinator; the default is the ungated baseline.

    ``Params`` declares the strategy's parameters; ``seed`` seeds any randomness it has (the run's
    seed, so an arm is reproducible).
    """

    name: ClassVar[str] = "none"
    Params: ClassVar[type[StrategyParams]] = StrategyParams
    uses_gate: ClassVar[bool] = False
    filters_zero_variance: ClassVar[bool] = False

    def __init__(self, params: StrategyParams | None = None, seed: int = 0) -> None:
        self.params = params if params is not None else self.Params()
        self.seed = seed

    def admit(self, task_id: str) -> bool:
        """Start a group for this task now? (False = skip it before rollout.)"""
        return True

    def observe(self, task_id: str, zero_variance: bool | None) -> None:
        """Learn from a group's outcome (None when unknown, e.g. cut unaudited)."""

    def keep(self, zero_variance: bool) -> bool:
        """Keep a group that finished without a stop for training? (False: it is FILTERED.) Asked
        once per such group, by its lifecycle (``selective_rollout.lifecycle``); cut, audited and failed
        groups are not the strategy's to keep."""
        return not (self.filters_zero_variance and zero_variance)


class NoFilter(Strategy):
    """Train on every group that finishes: GRPO as usual."""


class DapoFilter(Strategy):
    """Roll everything out, then drop zero-variance groups; the coordinator over-samples."""

    filters_zero_variance = True


class Selective(Strategy):
    """Stop converged groups mid-trajectory (the gate); keep every group that finishes."""

    uses_gate = True


class SelectiveDapo(Strategy):
    """The gate, then DAPO's filter on what the gate let through."""

    uses_gate = True
    filters_zero_variance = True


class PreSkipParams(StrategyParams):
    preskip_window: int = Field(
        1, ge=1, description="skip a task whose last this many groups were all zero-variance"
    )
    preskip_explore: float = Field(
        0.1, ge=0.0, le=1.0, description="probability of running a task that would be skipped anyway"
    )


class PreSkip(Strategy):
    """Skip a task when its last ``preskip_window`` groups were all zero-variance, except with
    probability ``preskip_explore`` (GRESO-style pre-rollout skipping: cheap, blind to this rollout)."""

    Params = PreSkipParams
    params: PreSkipParams

    def __init__(self, params: PreSkipParams | None = None, seed: int = 0) -> None:
        super().__init__(params, seed)
        window = self.params.preskip_window
        self._rng = random.Random(self.seed)
        self._history: dict[str, deque[bool]] = defaultdict(lambda: deque(maxlen=window))

    def admit(self, task_id: str) -> bool:
        recent = self._history[task_id]
        if len(recent) < self.params.preskip_window or not all(recent):
            return True
        return self._rng.random() < self.params.preskip_explore

    def observe(self, task_id: str, zero_variance: bool | None) -> None:
        if zero_variance is not None:
            self._history[task_id].append(zero_variance)
