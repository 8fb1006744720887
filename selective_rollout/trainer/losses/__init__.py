"""The GRPO policy objective's components, one registry each.

- ``POLICY_LOSSES`` (``trainer.policy_loss``): per-token loss, e.g. PPO-clip with clip-higher;
- ``AGGREGATIONS`` (``trainer.loss_agg``): how per-token losses add up to the batch loss;
- ``KL_ESTIMATORS`` (``trainer.kl_estimator``): per-token KL to a reference policy;
- ``ADVANTAGES`` (``trainer.advantage``): a group's rewards to its rollouts' advantages.

A new component is one class with ``@REGISTRY.register("name")`` in a module imported here.
Its fields are its parameters and become flat ``trainer.*`` keys; ``parameters_model`` gathers
them for config validation. This package imports nothing from the rest of the project, so
config validation can read the registries without starting the learner's imports.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, create_model
from pydantic.fields import FieldInfo

from selective_rollout.trainer.losses.advantage import ADVANTAGES, AdvantageEstimator
from selective_rollout.trainer.losses.aggregation import (
    AGGREGATIONS,
    Aggregation,
    batch_denominator,
    token_weights,
)
from selective_rollout.trainer.losses.kl import KL_ESTIMATORS, KLEstimator, kl_estimate
from selective_rollout.trainer.losses.policy import POLICY_LOSSES, PolicyLoss, ppo_clip_loss
from selective_rollout.trainer.losses.registry import Registry

# by the trainer.* key that selects an entry of each
REGISTRIES: dict[str, Registry] = {
    "policy_loss": POLICY_LOSSES,
    "loss_agg": AGGREGATIONS,
    "kl_estimator": KL_ESTIMATORS,
    "advantage": ADVANTAGES,
}


def parameters() -> dict[str, FieldInfo]:
    """Every registered entry's parameters by name. Keys are flat, so two entries may share a
    name only with the same declaration (a subclass inheriting it, say)."""
    out: dict[str, FieldInfo] = {}
    owner: dict[str, str] = {}
    for registry in REGISTRIES.values():
        for name, cls in registry.entries.items():
            for key, field in cls.model_fields.items():
                if key in out and repr(out[key]) != repr(field):
                    raise ValueError(
                        f"parameter {key!r} is declared differently by {owner[key]} "
                        f"and {registry.kind} {name!r}"
                    )
                out[key], owner[key] = field, f"{registry.kind} {name!r}"
    return out


def parameters_model() -> type[BaseModel]:
    """A strict model of all registered parameters, with their defaults: validating the
    ``trainer.*`` keys the section does not declare with it refuses the unknown ones by name."""
    fields = {key: (field.annotation, field) for key, field in parameters().items()}
    return create_model(  # type: ignore[call-overload]
        "LossParameters",
        __config__=ConfigDict(extra="forbid"),
        __doc__="Parameters of the registered policy losses, aggregations, KL estimators and advantages.",
        **fields,
    )


__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "REGISTRIES",
    "AdvantageEstimator",
    "Aggregation",
    "KLEstimator",
    "PolicyLoss",
    "Registry",
    "batch_denominator",
    "kl_estimate",
    "parameters",
    "parameters_model",
    "ppo_clip_loss",
    "token_weights",
]
