"""The GRPO policy objective's components, one registry each, declared here:

- ``POLICY_LOSSES`` (``trainer.policy_loss``): per-token loss, e.g. PPO-clip with clip-higher;
- ``AGGREGATIONS`` (``trainer.loss_agg``): how per-token losses add up to the batch loss;
- ``KL_ESTIMATORS`` (``trainer.kl_estimator``): per-token KL to a reference policy;
- ``ADVANTAGES`` (``trainer.advantage``): a group's rewards to its rollouts' advantages.

A new component is one class (a frozen pydantic model whose fields are its parameters, flat
``trainer.*`` keys) plus one line in ``selective_rollout/plugins.py`` (or an entry point of the
registry's group). The registries name everything by string and the component re-exports load on
first use (PEP 562), so reading a component's parameters (``losses/params.py``) imports no torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from selective_rollout.registry import Registry


def _loss_registry(kind: str, group: str, base: str, catalog: str) -> Registry:
    """A registry of one loss component: each entry is its own params model (its fields are its
    parameters), so it is built with ``model_validate``."""
    return Registry(
        kind,
        f"selective_rollout.{group}",
        base=f"{__name__}.{base}",
        params_attr=None,
        catalog=f"selective_rollout.plugins:{catalog}",
    )


ADVANTAGES = _loss_registry(
    "advantage estimator", "advantages", "advantage:AdvantageEstimator", "ADVANTAGE_CATALOG"
)
POLICY_LOSSES = _loss_registry("policy loss", "policy_losses", "policy:PolicyLoss", "POLICY_LOSS_CATALOG")
AGGREGATIONS = _loss_registry(
    "loss aggregation", "loss_aggregations", "aggregation:Aggregation", "AGGREGATION_CATALOG"
)
KL_ESTIMATORS = _loss_registry("KL estimator", "kl_estimators", "kl:KLEstimator", "KL_ESTIMATOR_CATALOG")

# the trainer.* key that selects an entry of each registry
LOSS_REGISTRIES: dict[str, Registry] = {
    "policy_loss": POLICY_LOSSES,
    "loss_agg": AGGREGATIONS,
    "kl_estimator": KL_ESTIMATORS,
    "advantage": ADVANTAGES,
}

_EXPORTS = {
    "AdvantageEstimator": "selective_rollout.learner.losses.advantage",
    "Aggregation": "selective_rollout.learner.losses.aggregation",
    "batch_denominator": "selective_rollout.learner.losses.aggregation",
    "token_weights": "selective_rollout.learner.losses.aggregation",
    "KLEstimator": "selective_rollout.learner.losses.kl",
    "kl_estimate": "selective_rollout.learner.losses.kl",
    "PolicyLoss": "selective_rollout.learner.losses.policy",
    "ppo_clip_loss": "selective_rollout.learner.losses.policy",
}

__all__ = sorted(
    [*_EXPORTS, "ADVANTAGES", "AGGREGATIONS", "KL_ESTIMATORS", "LOSS_REGISTRIES", "POLICY_LOSSES"]
)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
