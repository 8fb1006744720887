"""Group-relative advantage estimators: the final rewards of one group (the G rollouts of a task)
to one advantage per rollout, which the learner broadcasts over that rollout's policy tokens.

Each is a class listed in ``ADVANTAGES`` (``selective_rollout.learner.losses``) that ``trainer.advantage``
names; its fields are its parameters (flat ``trainer.*`` keys, like the losses'), so a new
estimator is one class plus one line there (or an entry point of a package of yours).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
from pydantic import Field

from selective_rollout.learner.losses.params import Entry
from selective_rollout.stats import grpo_advantages


class AdvantageEstimator(Entry, ABC):
    """Maps one group's rewards to its advantages; a group of one has no spread: all zeros."""

    @abstractmethod
    def __call__(self, rewards: np.ndarray) -> np.ndarray: ...


class GRPO(AdvantageEstimator):
    """``(r - mean) / (std + eps)`` with the sample (n-1) std, as torch.std and OpenRLHF use: the
    formula is ``stats.grpo_advantages``, which the offline gate evaluation shares."""

    advantage_eps: float = Field(1e-6, gt=0.0, description="grpo: added to the group's std before dividing")

    def __call__(self, rewards: np.ndarray) -> np.ndarray:
        return grpo_advantages(rewards, self.advantage_eps)


class DrGRPO(AdvantageEstimator):
    """``r - mean`` without the std, which up-weights easy/hard prompts in GRPO (Liu et al. 2025)."""

    def __call__(self, rewards: np.ndarray) -> np.ndarray:
        return rewards - rewards.mean()
