"""Environments behind one seam: the interface here, the entries in modules of their own.

``env.name`` selects an entry of ``ENVS``; ``cfg.env.build()`` gives the run's
``Environment``. A new environment is one module plus one line in ``selective_rollout/plugins.py``
(docs/environment.md). Importing this package imports no environment.
"""

from selective_rollout.envs.base import (
    ENVS,
    Environment,
    EnvParams,
    EnvPool,
    Episode,
    EpisodeState,
    Observation,
    PromptText,
)

# class decorator for an environment defined in code that runs anyway (a test, a notebook)
register_env = ENVS.register

__all__ = [
    "ENVS",
    "EnvParams",
    "EnvPool",
    "Environment",
    "Episode",
    "EpisodeState",
    "Observation",
    "PromptText",
    "register_env",
]
