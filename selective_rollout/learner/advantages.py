"""One advantage per experience, by the group-relative estimator ``trainer.advantage`` names.

The estimators are a registry of their own (``ADVANTAGES``); this module applies one
within each group of a batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from selective_rollout.learner.losses import ADVANTAGES
from selective_rollout.learner.losses.advantage import AdvantageEstimator
from selective_rollout.records import Experience


def compute_advantages(
    batch: Sequence[Experience], estimator: str | AdvantageEstimator = "grpo"
) -> list[float]:
    """One advantage per experience, normalised within its ``group_id``: ``estimator`` is a
    registered name (at its default parameters) or an estimator bound to the run's
    (``ADVANTAGES.build(cfg.advantage, cfg)``).

    Experiences of a group are the segments or trajectories the coordinator produced for one
    task; they need not be adjacent in ``batch``.
    """
    fn = ADVANTAGES.build(estimator) if isinstance(estimator, str) else estimator
    by_group: dict[str, list[int]] = {}
    for i, exp in enumerate(batch):
        by_group.setdefault(exp.group_id, []).append(i)
    out = [0.0] * len(batch)
    for idx in by_group.values():
        adv = fn(np.array([batch[i].reward for i in idx], dtype=np.float64))
        for i, a in zip(idx, adv, strict=True):
            out[i] = float(a)
    return out
