"""Group-relative advantage estimators, one function each, behind a registry.

Every estimator maps the final rewards of one group (the G rollouts of a task) to one
advantage per rollout; the learner broadcasts it over that rollout's policy tokens. A new
estimator is one decorated function here plus its name in ``TrainerConfig.advantage``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from selective_rollout.records import Experience
from selective_rollout.stats import grpo_advantages

Estimator = Callable[[np.ndarray, float], np.ndarray]
ESTIMATORS: dict[str, Estimator] = {}


def register(name: str) -> Callable[[Estimator], Estimator]:
    def wrap(fn: Estimator) -> Estimator:
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is registered twice")
        ESTIMATORS[name] = fn
        return fn

    return wrap


@register("grpo")
def grpo(rewards: np.ndarray, eps: float) -> np.ndarray:
    """GRPO: ``(r - mean) / (std + eps)`` with the sample (n-1) std, as torch.std and OpenRLHF use.

    A group of one has no spread to learn from, so its advantage is 0 rather than NaN. The formula
    is ``stats.grpo_advantages`` (floor 1), which the offline gate evaluation shares.
    """
    return grpo_advantages(rewards, eps)


@register("drgrpo")
def drgrpo(rewards: np.ndarray, eps: float) -> np.ndarray:
    """Dr.GRPO: ``r - mean`` without the std, which up-weights easy/hard prompts in GRPO (Liu et al. 2025)."""
    del eps
    return rewards - rewards.mean()


def compute_advantages(batch: Sequence[Experience], estimator: str, eps: float = 1e-6) -> list[float]:
    """One advantage per experience, normalised within its ``group_id``.

    Experiences of a group are the segments or trajectories the coordinator produced for one
    task; they need not be adjacent in ``batch``.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; known: {sorted(ESTIMATORS)}")
    fn = ESTIMATORS[estimator]
    by_group: dict[str, list[int]] = {}
    for i, exp in enumerate(batch):
        by_group.setdefault(exp.group_id, []).append(i)
    out = [0.0] * len(batch)
    for idx in by_group.values():
        adv = fn(np.array([batch[i].reward for i in idx], dtype=np.float64), eps)
        for i, a in zip(idx, adv, strict=True):
            out[i] = float(a)
    return out
