"""Environments behind one seam: the interface, the registry and its entries.

``env.name`` selects an entry; ``build_env(cfg.env)`` gives the run's ``Environment``. A new
environment is one module with ``@register_env("name")``, imported here (docs/environment.md).
"""

from selective_rollout.envs import alfworld, tw_cooking
from selective_rollout.envs.base import (
    ENVS,
    Environment,
    EnvParams,
    EnvPool,
    Episode,
    EpisodeState,
    Observation,
    PromptText,
    env_class,
    register_env,
)

__all__ = [
    "ENVS",
    "EnvParams",
    "EnvPool",
    "Environment",
    "Episode",
    "EpisodeState",
    "Observation",
    "PromptText",
    "alfworld",
    "env_class",
    "register_env",
    "tw_cooking",
]
