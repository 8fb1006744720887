"""The GRPO policy objective's components, one registry each (``selective_rollout.plugins``):

- ``POLICY_LOSSES`` (``trainer.policy_loss``): per-token loss, e.g. PPO-clip with clip-higher;
- ``AGGREGATIONS`` (``trainer.loss_agg``): how per-token losses add up to the batch loss;
- ``KL_ESTIMATORS`` (``trainer.kl_estimator``): per-token KL to a reference policy;
- ``ADVANTAGES`` (``trainer.advantage``): a group's rewards to its rollouts' advantages.

A new component is one class (a frozen pydantic model whose fields are its parameters, flat
``trainer.*`` keys) plus one line in ``selective_rollout.plugins``. The re-exports load on first
use (PEP 562), so reading a component's parameters (``losses/params.py``) imports no torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "ADVANTAGES": "selective_rollout.plugins",
    "AGGREGATIONS": "selective_rollout.plugins",
    "KL_ESTIMATORS": "selective_rollout.plugins",
    "POLICY_LOSSES": "selective_rollout.plugins",
    "AdvantageEstimator": "selective_rollout.learner.losses.advantage",
    "Aggregation": "selective_rollout.learner.losses.aggregation",
    "batch_denominator": "selective_rollout.learner.losses.aggregation",
    "token_weights": "selective_rollout.learner.losses.aggregation",
    "KLEstimator": "selective_rollout.learner.losses.kl",
    "kl_estimate": "selective_rollout.learner.losses.kl",
    "PolicyLoss": "selective_rollout.learner.losses.policy",
    "ppo_clip_loss": "selective_rollout.learner.losses.policy",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
